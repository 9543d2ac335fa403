//! Enrolled agents and agents with hub tokens stream, and their accounts stay bound.

use super::*;

/// `scale-agent-hub agent-token create` against the hub's admin API (the real command, as an
/// admin runs it); returns the token it printed.
fn create_agent_token(hub: &Hub, args: &[&str]) -> anyhow::Result<String> {
    let output = std::process::Command::new(HUB)
        .args(["agent-token", "create"])
        .args(args)
        .arg(format!("--hub-url=http://{}", hub.http))
        .arg(format!("--data-dir={}", hub.data_dir.display()))
        .output()?;
    anyhow::ensure!(
        output.status.success(),
        "agent-token create failed: {}",
        String::from_utf8_lossy(&output.stderr)
    );
    Ok(String::from_utf8(output.stdout)?.trim().to_string())
}

/// Item 3 and 6 of the security issue with real processes: an agent enrols with a one-time
/// token, streams with the certificate the hub issued, renews it over its stream and comes
/// back with it after a restart (the token is gone by then); an agent with a bearer token
/// streams; and that second identity may not join the first one's account, even as a
/// standby of the same cluster.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn enrolled_and_token_agents_stream_and_accounts_stay_bound() -> anyhow::Result<()> {
    let (control_plane, admin, ns) = cluster("enrol").await?;
    let dir = TempDir::new("enrol")?;
    let pki = Pki::new(dir.path(), "enrol")?;
    // 30 s certificates: the agent renews after about 20 s.
    let hub =
        Hub::start_trusting_only_itself(dir.path(), &pki, &["--agent-cert-lifetime=30s"]).await?;
    let kubeconfig = agent_identity(
        control_plane,
        &admin,
        &ns,
        Scope::Namespace,
        &["configmaps"],
        dir.path(),
    )
    .await?;
    create_configmap(&admin, &ns, "seen", json!({ "v": "1" })).await?;
    let account = unique("enrol");
    let accounts = json!([fixtures::account(
        &account,
        &kubeconfig,
        &ns,
        &["configmaps"]
    )]);

    let token_file = dir.path().join("enrolment-token");
    std::fs::write(
        &token_file,
        create_agent_token(
            &hub,
            &[
                "--identity=enrolled-agent",
                "--accounts=enrol-*",
                "--ttl=10m",
                "--once",
            ],
        )?,
    )?;
    let cert_dir = dir.path().join("enrolled");
    let client = ClientCert {
        cert: cert_dir.join("tls.crt"),
        key: cert_dir.join("tls.key"),
    };
    let config = dir.path().join("enrolled.yaml");
    std::fs::write(
        &config,
        serde_json::to_string(&json!({
            "clouddriver": {
                "grpc": hub.grpc.to_string(),
                "keepAliveHeartbeatSeconds": 1,
                "backoff": { "baseDelay": "200ms", "maxDelay": "1s" },
                "auth": { "enrolmentTokenFile": token_file.display().to_string() },
            },
            "kubernetes": { "accounts": accounts },
        }))?,
    )?;
    let tls = AgentTls {
        ca_file: pki.ca_file.clone(),
        client: Some(client.clone()),
    };
    let mut enrolled = Agent::start(dir.path(), &config, "enrolled-0", &tls).await?;
    eventually("the enrolled agent streaming", || async {
        Ok(hub
            .account(&account)
            .await?
            .is_some_and(|a| a["streaming"]["identity"] == "enrolled-agent"))
    })
    .await?;
    eventually("the account's ConfigMap in the hub", || async {
        Ok(hub
            .object(&account, "configmaps", &ns, "seen")
            .await?
            .is_some())
    })
    .await?;
    let first_cert = std::fs::read(&client.cert)?;
    let used_token = std::fs::read_to_string(&token_file)?;
    use std::os::unix::fs::PermissionsExt as _;
    assert_eq!(
        std::fs::metadata(&client.key)?.permissions().mode() & 0o777,
        0o600
    );

    // The token worked once; the agent renews over its stream and keeps the new certificate.
    std::fs::remove_file(&token_file)?;
    eventually("the certificate renewed over the stream", || async {
        Ok(std::fs::read(&client.cert)? != first_cert)
    })
    .await?;
    // Restarted, it connects with the renewed certificate: there is no token to enrol with.
    enrolled.stop();
    enrolled.start_again().await?;
    eventually("the restarted agent streaming again", || async {
        Ok(enrolled.ready().await?
            && hub
                .account(&account)
                .await?
                .is_some_and(|a| a["streaming"]["identity"] == "enrolled-agent"))
    })
    .await?;

    // A bearer-token agent of another identity on the same cluster: it streams its own
    // account, but the first one's is refused, as STANDBY too.
    let bearer_file = dir.path().join("bearer-token");
    std::fs::write(
        &bearer_file,
        create_agent_token(
            &hub,
            &["--identity=token-agent", "--accounts=*", "--ttl=10m"],
        )?,
    )?;
    let own = unique("token");
    let config = dir.path().join("token.yaml");
    std::fs::write(
        &config,
        serde_json::to_string(&json!({
            "clouddriver": {
                "grpc": hub.grpc.to_string(),
                "keepAliveHeartbeatSeconds": 1,
                "backoff": { "baseDelay": "200ms", "maxDelay": "1s" },
                "auth": { "tokenFile": bearer_file.display().to_string() },
            },
            "kubernetes": { "accounts": [
                fixtures::account(&account, &kubeconfig, &ns, &["configmaps"]),
                fixtures::account(&own, &kubeconfig, &ns, &["configmaps"]),
            ] },
        }))?,
    )?;
    let token_tls = AgentTls {
        ca_file: pki.ca_file.clone(),
        client: None,
    };
    let token_agent = Agent::start(dir.path(), &config, "token-0", &token_tls).await?;
    eventually("the token agent streaming its own account", || async {
        Ok(hub
            .account(&own)
            .await?
            .is_some_and(|a| a["streaming"]["identity"] == "token-agent"))
    })
    .await?;
    eventually("the bound account refused to the token agent", || async {
        Ok(token_agent
            .metric(
                "scale_agent_agent_account_rejected",
                &[("account", &account)],
            )
            .await?
            == 1.0)
    })
    .await?;
    let held = hub.account(&account).await?.unwrap_or_default();
    assert_eq!(held["streaming"]["identity"], "enrolled-agent", "{held}");
    assert!(
        held["standbys"].as_array().is_none_or(Vec::is_empty),
        "{held}"
    );
    let log = hub.log();
    assert!(
        log.lines().any(|l| l.contains("account rejected")
            && l.contains(&account)
            && l.contains("scale-agent-hub account rebind")),
        "the hub says why and what to do:\n{log}"
    );

    // An agent given the used token: refused, and its log says why and what to set.
    let reused_file = dir.path().join("reused-token");
    std::fs::write(&reused_file, &used_token)?;
    let config = dir.path().join("reused.yaml");
    std::fs::write(
        &config,
        serde_json::to_string(&json!({
            "clouddriver": {
                "grpc": hub.grpc.to_string(),
                "keepAliveHeartbeatSeconds": 1,
                "backoff": { "baseDelay": "200ms", "maxDelay": "1s" },
                "auth": { "enrolmentTokenFile": reused_file.display().to_string() },
            },
            "kubernetes": { "accounts": [] },
        }))?,
    )?;
    let reused_dir = dir.path().join("reused");
    let reused_tls = AgentTls {
        ca_file: pki.ca_file.clone(),
        client: Some(ClientCert {
            cert: reused_dir.join("tls.crt"),
            key: reused_dir.join("tls.key"),
        }),
    };
    let reused = Agent::start(dir.path(), &config, "reused-0", &reused_tls).await?;
    let reused_log = reused
        .process
        .as_ref()
        .map(|p| p.log().to_path_buf())
        .ok_or_else(|| anyhow::anyhow!("the agent is not running"))?;
    eventually("the refused enrolment in the agent's log", || async {
        let text = std::fs::read_to_string(&reused_log)?;
        Ok(text.contains("the hub refused the enrolment")
            && text.contains("already used")
            && text.contains(&format!(
                "Put a new one-time token (`scale-agent-hub agent-token create --once`) into {}",
                reused_file.display()
            )))
    })
    .await?;
    assert!(!reused_dir.join("tls.crt").exists());
    assert_eq!(reused.view().await?["hubConnected"], false);

    // A client that does not speak TLS: the hub logs the failed handshake with the peer.
    {
        use tokio::io::AsyncWriteExt as _;
        let mut tcp = tokio::net::TcpStream::connect(hub.grpc).await?;
        tcp.write_all(b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n").await?;
        let peer = tcp.local_addr()?.to_string();
        eventually("the failed handshake in the hub's log", || async {
            Ok(hub
                .log()
                .lines()
                .any(|l| l.contains("gRPC TLS handshake failed") && l.contains(&peer)))
        })
        .await?;
    }
    Ok(())
}
