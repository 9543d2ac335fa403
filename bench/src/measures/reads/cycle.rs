//! Measure 9's caching-cycle row: `kubectl get <8 kinds> -o json` of one account, through
//! the proxy beside straight to the API server and beside nginx's cache of the proxy's
//! responses ([`Floor`], the cheapest server of the same bytes), with the API server's CPU
//! seconds and the LISTs it received.

use std::{
    collections::BTreeMap,
    path::{Path, PathBuf},
};

use anyhow::Result;
use serde_json::json;

use super::{
    CACHE_HEADER, CycleSide, KINDS, LoadWindow, Setting, Target, World, caching_cycle,
    cycle_headers, header_text,
};
use crate::{
    env::{Env, HubProc},
    measures::proxy::{Side, pair},
    report::{Percentiles, Row, secs},
};

/// The cheapest server of the proxy's bytes: Debian's nginx in front of the hub with
/// `proxy_cache`, so that after one cycle through it every later cycle is answered from
/// nginx's own cache, the same responses (continue tokens included) as the hub gave.
pub(super) struct Floor {
    nginx: scale_agent_e2e::nginx::Nginx,
    target: Target,
    /// Its log of cache statuses, one line per request.
    log: PathBuf,
    version: String,
}

impl Floor {
    pub(super) async fn start(env: &Env, hub: &HubProc, proxy_kubeconfig: &Path) -> Result<Self> {
        let dir = env.dir.join("floor-nginx");
        let port = crate::procs::free_port()?;
        let listen: std::net::SocketAddr = format!("127.0.0.1:{port}").parse()?;
        let log = dir.join("cache-status.log");
        let d = dir.display();
        // One cache entry per request line and the headers that change the answer; the
        // hub's own caching headers are ignored: the floor keeps everything for the run.
        let server = format!(
            "proxy_cache_path {d}/cache levels=1:2 keys_zone=floor:16m max_size=4g inactive=2h use_temp_path=off;\n\
             server {{\n\
             \x20   listen {listen} ssl http2;\n\
             \x20   ssl_certificate {cert};\n\
             \x20   ssl_certificate_key {key};\n\
             \x20   access_log {log} floor;\n\
             \x20   location / {{\n\
             \x20       proxy_pass https://{hub};\n\
             \x20       proxy_http_version 1.1;\n\
             \x20       proxy_cache floor;\n\
             \x20       proxy_cache_key \"$request_uri|$http_accept|$http_accept_encoding\";\n\
             \x20       proxy_cache_valid 200 404 2h;\n\
             \x20       proxy_ignore_headers Cache-Control Expires Set-Cookie Vary X-Accel-Expires;\n\
             \x20       proxy_buffer_size 64k;\n\
             \x20       proxy_buffers 64 64k;\n\
             \x20   }}\n\
             }}\n",
            cert = env.pki.hub_cert.display(),
            key = env.pki.hub_key.display(),
            log = log.display(),
            hub = hub.http_addr,
        );
        let nginx = scale_agent_e2e::nginx::Nginx::start(
            &dir,
            &server,
            "log_format floor '$upstream_cache_status $request_uri';",
            listen,
        )
        .await?;
        let text = std::fs::read_to_string(proxy_kubeconfig)?;
        let hub_url = format!("https://{}", hub.http_addr);
        anyhow::ensure!(
            text.contains(&hub_url),
            "the proxy's kubeconfig does not name {hub_url}"
        );
        let kubeconfig = env.dir.join("reads-floor.kubeconfig");
        std::fs::write(
            &kubeconfig,
            text.replace(&hub_url, &format!("https://{listen}")),
        )?;
        let target = Target::new(env, kubeconfig, "kubectl-home-reads-floor").await?;
        let version = std::process::Command::new(scale_agent_e2e::nginx::binary()?)
            .arg("-v")
            .output()
            .map(|o| {
                String::from_utf8_lossy(&o.stderr)
                    .trim()
                    .replace("nginx version: ", "")
            })
            .unwrap_or_default();
        Ok(Floor {
            nginx,
            target,
            log,
            version,
        })
    }

    fn log_len(&self) -> usize {
        std::fs::read_to_string(&self.log)
            .map(|t| t.lines().count())
            .unwrap_or(0)
    }

    /// nginx's cache status of each request logged after the first `skip` lines, counted.
    fn statuses_since(&self, skip: usize) -> BTreeMap<String, usize> {
        let mut counts = BTreeMap::new();
        let text = std::fs::read_to_string(&self.log).unwrap_or_default();
        for line in text.lines().skip(skip) {
            let status = line.split_whitespace().next().unwrap_or("-");
            *counts.entry(status.to_string()).or_default() += 1;
        }
        counts
    }
}

impl Drop for Floor {
    fn drop(&mut self) {
        self.nginx.stop();
    }
}

#[allow(clippy::too_many_arguments)]
pub(super) async fn cycle_row(
    w: &World<'_>,
    proxy: &Target,
    direct: &Target,
    floor: &Floor,
    ns: &str,
    objects: usize,
    setting: Setting,
    rows: &mut Vec<Row>,
) -> Result<String> {
    // One cycle each first: kubectl's discovery cache fills, as in Clouddriver's pod (and
    // the floor's nginx stores every response the proxy gave).
    for target in [proxy, direct, &floor.target] {
        caching_cycle(&target.kubectl, &target.kubeconfig, ns, objects).await?;
    }
    let floor_log_start = floor.log_len();
    let repeats = w.o.reads_cycle_repeats.max(1);
    let (mut p, mut d, mut f) = (
        CycleSide::default(),
        CycleSide::default(),
        CycleSide::default(),
    );
    for i in 0..repeats {
        // The floor goes between the two sides, alternating with them.
        let mut order: Vec<Option<Side>> = pair(i).into_iter().map(Some).collect();
        order.insert(1, None);
        for side_of in order {
            let (target, side) = match side_of {
                Some(Side::Proxy) => (proxy, &mut p),
                Some(Side::Direct) => (direct, &mut d),
                None => (&floor.target, &mut f),
            };
            let window = LoadWindow::start(w.env, w.apiserver, w.hub.pid()).await?;
            let cpu_before = crate::procs::ended_children_cpu();
            side.secs
                .push(caching_cycle(&target.kubectl, &target.kubeconfig, ns, objects).await?);
            side.kubectl_cpu
                .push(crate::procs::ended_children_cpu() - cpu_before);
            let load = window.finish(w.env).await?;
            side.load.apiserver_cpu += load.apiserver_cpu / repeats as f64;
            side.load.hub_cpu += load.hub_cpu / repeats as f64;
            side.load.lists += load.lists / repeats as f64;
        }
    }
    let floor_statuses = floor.statuses_since(floor_log_start);
    let headers = cycle_headers(&proxy.client, ns).await?;
    let (ps, ds) = (Percentiles::of(&p.secs).p50, Percentiles::of(&d.secs).p50);
    let fs = Percentiles::of(&f.secs).p50;
    let cpu = |side: &CycleSide| Percentiles::of(&side.kubectl_cpu).p50;
    rows.push(Row {
        id: format!("reads-cycle{}", setting.id_suffix()),
        measure: 9,
        title: format!(
            "Clouddriver caching cycle of one account, {objects} objects over {} kinds (`kubectl get <kinds> -o json`) through the proxy, {}",
            KINDS.len(),
            setting.title()
        ),
        system: format!("{} per cycle; API server {:.2} CPU s, {:.0} LISTs", secs(ps), p.load.apiserver_cpu, p.load.lists),
        baseline_name: "the same kubectl command straight to the API server".into(),
        baseline: format!("{} per cycle; API server {:.2} CPU s, {:.0} LISTs", secs(ds), d.load.apiserver_cpu, d.load.lists),
        note: format!(
            "median of {repeats} cycles per side, alternating, after one warm-up each (kubectl {}, its own warm HOME per side; kubectl pages by 500); API server CPU from /proc/<pid>/stat and LISTs from its apiserver_request_total{{verb=\"LIST\"}}, per cycle (any LIST during the window counts, the agent's included); hub CPU {:.2} s per cycle through the proxy; direct ÷ proxy = {:.2}×; {CACHE_HEADER} on the same LISTs made once more through the proxy with kube's client: {}",
            scale_agent_e2e::KUBERNETES_VERSION,
            p.load.hub_cpu,
            ds / ps.max(1e-9),
            header_text(&headers)
        ),
        values: json!({ "objects": objects, "kinds": KINDS.len(), "repeats": repeats,
            "proxy_seconds": p.secs, "direct_seconds": d.secs,
            "proxy_apiserver_cpu_seconds": p.load.apiserver_cpu, "direct_apiserver_cpu_seconds": d.load.apiserver_cpu,
            "proxy_apiserver_lists": p.load.lists, "direct_apiserver_lists": d.load.lists,
            "proxy_hub_cpu_seconds": p.load.hub_cpu, "cache_header": headers,
            "proxy_kubectl_cpu_seconds": p.kubectl_cpu, "direct_kubectl_cpu_seconds": d.kubectl_cpu }),
    });
    rows.push(Row {
        id: format!("reads-cycle-floor{}", setting.id_suffix()),
        measure: 9,
        title: format!(
            "The same caching cycle ({objects} objects) answered by the cheapest server of the proxy's bytes (the floor), {}: direct / proxy's cache / floor",
            setting.title()
        ),
        system: format!(
            "proxy's cache {}, kubectl {:.2} CPU s",
            secs(ps),
            cpu(&p)
        ),
        baseline_name: "nginx replaying the proxy's responses from its own cache (the floor); and directly".into(),
        baseline: format!(
            "floor {}, kubectl {:.2} CPU s; direct {}, kubectl {:.2} CPU s",
            secs(fs),
            cpu(&f),
            secs(ds),
            cpu(&d)
        ),
        note: format!(
            "the floor is Debian's nginx {} (TLS with the hub's certificate, HTTP/2, on loopback) in front of the hub with proxy_cache: the warm-up cycle stored every response the proxy gave (the same bytes, continue tokens included), the timed cycles are answered from nginx's cache (its cache status per request in the timed cycles: {}); medians of {repeats} cycles per side, alternating with the other two; kubectl CPU is its user + system time (getrusage of the ended child, /proc/self/stat cutime + cstime); the proxy adds {} above the floor, the floor is {:.2}× faster than direct",
            floor.version,
            header_text(&floor_statuses),
            secs((ps - fs).max(0.0)),
            ds / fs.max(1e-9)
        ),
        values: json!({ "objects": objects, "repeats": repeats,
            "floor_seconds": f.secs, "proxy_seconds": p.secs, "direct_seconds": d.secs,
            "floor_kubectl_cpu_seconds": f.kubectl_cpu, "proxy_kubectl_cpu_seconds": p.kubectl_cpu,
            "direct_kubectl_cpu_seconds": d.kubectl_cpu, "floor_cache_status": floor_statuses }),
    });
    Ok(format!(
        "A caching cycle of {objects} objects {} takes {} through the proxy against {} directly ({:.0} against {:.0} LISTs reaching the API server).",
        setting.title(),
        secs(ps),
        secs(ds),
        p.load.lists,
        d.load.lists
    ))
}
