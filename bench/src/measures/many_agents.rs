//! Measure 7: many simulated agents on one hub beside the same hub with one agent.

use std::{
    net::SocketAddr,
    sync::{
        Arc,
        atomic::{AtomicU64, Ordering},
    },
    time::{Duration, Instant},
};

use anyhow::Result;
use rand::Rng as _;
use serde_json::{Value, json};

use super::{LONG, footprint::idle};
use crate::{
    Options,
    env::Env,
    fake::FakeAgent,
    report::{Row, bytes, mib, secs},
};

pub async fn many_agents(env: &Env, o: &Options, rows: &mut Vec<Row>) -> Result<()> {
    let mut figures = Vec::new();
    for n in [1, o.agents.max(1)] {
        let hub = env.hub(&format!("many-{n}-hub")).await?;
        tokio::time::sleep(Duration::from_millis(500)).await;
        let before = hub.stats()?;
        let certs: Vec<_> = (0..n)
            .map(|i| env.pki.ca.client(&format!("bench-sim-{n}-{i}"), &[]))
            .collect::<Result<_, _>>()?;
        let ca = Arc::new(env.pki.ca.cert_pem.clone());
        let agent_objects = o.agent_objects;
        let retries = Arc::new(AtomicU64::new(0));
        let started = Instant::now();
        let tasks: Vec<_> = certs
            .into_iter()
            .enumerate()
            .map(|(i, cert)| {
                let (addr, ca, retries) = (hub.grpc_addr, ca.clone(), retries.clone());
                tokio::spawn(async move {
                    let mut fake = connect_with_retry(
                        addr,
                        &ca,
                        &cert.cert_pem,
                        &cert.key_pem,
                        &retries,
                        CONNECT_ATTEMPTS,
                    )
                    .await?;
                    let account = format!("sim-{n}-{i}");
                    fake.register(&account, &format!("https://sim-{i}.bench:443"))
                        .await?;
                    fake.snapshot(&account, agent_objects, 1).await?;
                    fake.synced(LONG).await?;
                    anyhow::Ok(fake)
                })
            })
            .collect();
        let mut agents = Vec::new();
        for t in tasks {
            agents.push(t.await??);
        }
        let secs = started.elapsed().as_secs_f64();
        let registered = hub.stats()?;
        let connected = hub.agents_connected().await?;
        let window = Duration::from_secs(o.idle_seconds.max(1));
        let (rss, idle_cpu) = idle(hub.pid(), window).await?;
        figures.push(json!({
            "agents": n, "connected": connected, "seconds": secs,
            "hub_rss_before_kib": before.rss_kib, "hub_rss_kib": rss,
            "hub_cpu_secs_to_register": registered.cpu_secs - before.cpu_secs, "hub_idle_cpu_share": idle_cpu,
            "connect_retries": retries.load(Ordering::Relaxed),
        }));
        drop(agents);
        drop(hub);
    }
    let idle_window = Duration::from_secs(o.idle_seconds.max(1));
    let text = |f: &Value| {
        format!(
            "{} connected in {} ({} connects retried); hub RSS {} (from {}), CPU {:.2} s to register, {} idle",
            f["connected"],
            secs(f["seconds"].as_f64().unwrap_or(0.0)),
            f["connect_retries"].as_u64().unwrap_or(0),
            mib(f["hub_rss_kib"].as_u64().unwrap_or(0)),
            mib(f["hub_rss_before_kib"].as_u64().unwrap_or(0)),
            f["hub_cpu_secs_to_register"].as_f64().unwrap_or(0.0),
            match f["hub_idle_cpu_share"].as_f64().unwrap_or(0.0) {
                0.0 => format!("CPU < {:.2} %", 1.0 / idle_window.as_secs_f64().max(0.01)),
                share => format!("CPU {:.2} %", share * 100.0),
            },
        )
    };
    let per_agent = match (figures.first(), figures.last()) {
        (Some(one), Some(many)) if o.agents > 1 => {
            let d = many["hub_rss_kib"].as_f64().unwrap_or(0.0)
                - one["hub_rss_kib"].as_f64().unwrap_or(0.0);
            d * 1024.0 / (o.agents - 1) as f64
        }
        _ => 0.0,
    };
    rows.push(Row {
        id: "many-agents".into(),
        measure: 7,
        title: format!(
            "{} simulated agents (mTLS, one account and {} objects each) on one hub",
            o.agents, o.agent_objects
        ),
        system: text(figures.last().unwrap_or(&Value::Null)),
        baseline_name: "the same hub with 1 agent".into(),
        baseline: text(figures.first().unwrap_or(&Value::Null)),
        note: format!(
            "all connect at once (a refused or reset connect is retried after a jittered backoff, counted); about {} of hub RSS per extra agent; the fake agents' TLS runs in the bench process on the same cores",
            bytes(per_agent)
        ),
        values: json!({ "runs": figures, "hub_bytes_per_extra_agent": per_agent }),
    });
    Ok(())
}

/// Connects attempted at most per agent, including the first.
const CONNECT_ATTEMPTS: u32 = 8;
/// The first backoff; it doubles at each retry (jittered, so that thousands of agents
/// refused together do not come back together).
const FIRST_BACKOFF: Duration = Duration::from_millis(100);
const MAX_BACKOFF: Duration = Duration::from_secs(5);

/// [`FakeAgent::connect`], retried with backoff when the connection is refused or reset (all
/// agents connect at once, as a fleet does after a hub restart: the listen backlog
/// overflows, a real agent retries too), `attempts` times at most. Any other error ends the
/// run. Each retry is counted in `retries`.
async fn connect_with_retry(
    addr: SocketAddr,
    ca: &str,
    cert_pem: &str,
    key_pem: &str,
    retries: &AtomicU64,
    attempts: u32,
) -> Result<FakeAgent> {
    let mut backoff = FIRST_BACKOFF;
    let mut attempt = 1;
    loop {
        match FakeAgent::connect(addr, ca, cert_pem, key_pem, "sim-0").await {
            Ok(fake) => return Ok(fake),
            Err(e) if attempt < attempts && is_refused_or_reset(&e) => {
                retries.fetch_add(1, Ordering::Relaxed);
                let jitter = rand::rng().random_range(0..=backoff.as_millis() as u64);
                tokio::time::sleep(backoff / 2 + Duration::from_millis(jitter / 2)).await;
                backoff = (backoff * 2).min(MAX_BACKOFF);
                attempt += 1;
            }
            Err(e) => return Err(e),
        }
    }
}

/// Whether a connect failed because the hub refused or reset the connection (or ended the
/// stream before answering): an I/O error of those kinds anywhere in the chain, or the
/// `Unavailable` status tonic gives a stream reset before its response.
fn is_refused_or_reset(e: &anyhow::Error) -> bool {
    use std::io::ErrorKind;
    e.chain().any(|cause| {
        if let Some(io) = cause.downcast_ref::<std::io::Error>() {
            return matches!(
                io.kind(),
                ErrorKind::ConnectionRefused
                    | ErrorKind::ConnectionReset
                    | ErrorKind::ConnectionAborted
                    | ErrorKind::BrokenPipe
                    | ErrorKind::UnexpectedEof
            );
        }
        if let Some(status) = cause.downcast_ref::<tonic::Status>() {
            return status.code() == tonic::Code::Unavailable;
        }
        let text = cause.to_string().to_ascii_lowercase();
        ["connection refused", "connection reset", "broken pipe"]
            .iter()
            .any(|t| text.contains(t))
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn refused_and_reset_connects_are_retried_others_are_not() {
        let io = |kind| anyhow::Error::new(std::io::Error::new(kind, "x"));
        assert!(is_refused_or_reset(&io(
            std::io::ErrorKind::ConnectionRefused
        )));
        assert!(is_refused_or_reset(
            &io(std::io::ErrorKind::ConnectionReset).context("connecting")
        ));
        assert!(is_refused_or_reset(&anyhow::Error::new(
            tonic::Status::unavailable("stream reset")
        )));
        assert!(!is_refused_or_reset(&io(
            std::io::ErrorKind::PermissionDenied
        )));
        assert!(!is_refused_or_reset(&anyhow::Error::new(
            tonic::Status::permission_denied("unknown client certificate")
        )));
        assert!(!is_refused_or_reset(&anyhow::anyhow!(
            "expected Welcome, got None"
        )));
    }

    /// A hub that is not listening refuses: the connect is retried, counted, then reported.
    #[tokio::test]
    async fn a_refused_connect_is_retried_then_reported() {
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap();
        let ca = scale_agent_e2e::pki::CertificateAuthority::new("bench-retry-ca").unwrap();
        let cert = ca.client("bench-retry", &[]).unwrap();
        let retries = AtomicU64::new(0);
        let err = connect_with_retry(
            port,
            &ca.cert_pem,
            &cert.cert_pem,
            &cert.key_pem,
            &retries,
            3,
        )
        .await
        .err()
        .expect("nothing listens");
        assert!(is_refused_or_reset(&err), "{err:#}");
        assert_eq!(retries.load(Ordering::Relaxed), 2);
    }
}
