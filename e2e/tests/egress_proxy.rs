//! Agents behind an egress proxy (issue 15, item 3): a real agent process with
//! `HTTPS_PROXY` pointing at a real forward proxy on loopback (Debian's tinyproxy, unpacked
//! by `make tinyproxy`) reaches the hub (gRPC tunnelled with HTTP CONNECT) and its account's
//! API server through it, and streams, to a plaintext hub and to a hub serving mutual TLS
//! (TLS end to end inside the tunnel). The proxy's own log proves which connections went
//! through it; `NO_PROXY`, `clouddriver.noProxy` and `kubernetes.noProxy` bypass it for what
//! they name.

use std::{
    path::{Path, PathBuf},
    time::Duration,
};

use k8s_openapi::api::core::v1::ConfigMap;
use kube::{Api, api::PostParams};
use scale_agent_e2e::{
    ControlPlane,
    fixtures::{self, Scope},
    local_agent::free_port,
    pki::CertificateAuthority,
    process::{self, ManagedProcess},
    tinyproxy::Tinyproxy,
};
use serde_json::json;

const AGENT: &str = env!("CARGO_BIN_EXE_e2e-agent");
/// Generous: two cores shared by many tests.
const WAIT: Duration = Duration::from_secs(90);

/// Every variable that names a proxy, so the machine's own settings stay out of the test.
const PROXY_VARIABLES: &[&str] = &[
    "HTTPS_PROXY",
    "https_proxy",
    "HTTP_PROXY",
    "http_proxy",
    "ALL_PROXY",
    "all_proxy",
    "NO_PROXY",
    "no_proxy",
];

/// Starts an agent process on `config` with exactly the proxy variables of `env`.
fn start_agent(
    dir: &Path,
    name: &str,
    config: &Path,
    env: &[(&str, &str)],
) -> anyhow::Result<ManagedProcess> {
    let admin_port = free_port()?;
    let mut command = std::process::Command::new(AGENT);
    command
        .arg(format!("--config={}", config.display()))
        .arg(format!("--replica={name}-0"))
        .arg(format!("--admin-addr=127.0.0.1:{admin_port}"))
        .env("RUST_LOG", "info,scale_agent=debug");
    for variable in PROXY_VARIABLES {
        command.env_remove(variable);
    }
    for (variable, value) in env {
        command.env(variable, value);
    }
    Ok(ManagedProcess::spawn_command(
        "e2e-agent",
        command,
        dir.join(format!("agent-{name}.log")),
    )?)
}

/// Writes an agent config for the plaintext hub at `hub` with one account, `extra` merged
/// into its `clouddriver` and `kubernetes` sections (`insecure: false` and a `tls` block
/// there make it a TLS hub).
fn write_config(
    dir: &Path,
    name: &str,
    hub: std::net::SocketAddr,
    account: serde_json::Value,
    clouddriver_extra: serde_json::Value,
    kubernetes_extra: serde_json::Value,
) -> anyhow::Result<PathBuf> {
    let mut clouddriver = json!({
        "grpc": hub.to_string(),
        "insecure": true,
        "backoff": { "baseDelay": "200ms", "maxDelay": "2s" },
    });
    let mut kubernetes = json!({ "accounts": [account] });
    for (target, extra) in [
        (&mut clouddriver, clouddriver_extra),
        (&mut kubernetes, kubernetes_extra),
    ] {
        if let (Some(target), Some(extra)) = (target.as_object_mut(), extra.as_object()) {
            target.extend(extra.clone());
        }
    }
    let path = dir.join(format!("{name}.yaml"));
    std::fs::write(
        &path,
        serde_json::to_string_pretty(&json!({
            "clouddriver": clouddriver,
            "kubernetes": kubernetes,
        }))?,
    )?;
    Ok(path)
}

/// Waits until the hub lists the ConfigMap `object` of `account`: the agent reached the hub
/// and listed the API server.
async fn wait_streamed(
    hub: std::net::SocketAddr,
    account: &str,
    object: &str,
    agent: &mut ManagedProcess,
) -> anyhow::Result<()> {
    let path = format!("/api/v1/accounts/{account}/objects?kind=configmaps");
    let deadline = tokio::time::Instant::now() + WAIT;
    loop {
        agent.ensure_running()?;
        let listed = fixtures::hub_call("GET", hub, &path).send().await?.body;
        if listed.contains(&format!("\"{object}\"")) {
            return Ok(());
        }
        anyhow::ensure!(
            tokio::time::Instant::now() < deadline,
            "account {account} never streamed {object}: {listed}; agent log:\n{}",
            process::tail(agent.log(), 30)
        );
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
}

/// A namespace `prefix-…` with a ServiceAccount that may read its ConfigMaps (its kubeconfig
/// in the returned directory) and a ConfigMap `marker` to wait for: (namespace, directory,
/// kubeconfig).
async fn namespace_with_marker(
    control_plane: &ControlPlane,
    prefix: &str,
    marker: &str,
) -> anyhow::Result<(String, PathBuf, PathBuf)> {
    let admin = control_plane.client().await?;
    let ns = control_plane.namespace(&admin, prefix).await?;
    let dir = fixtures::temp_dir(&format!("{prefix}-proxy"))?;
    let kubeconfig = fixtures::service_account_identity(
        control_plane,
        &admin,
        &ns,
        "agent",
        Scope::Namespace,
        fixtures::read_rules(&["configmaps"]),
        dir.join("kubeconfig"),
    )
    .await?;
    Api::<ConfigMap>::namespaced(admin, &ns)
        .create(
            &PostParams::default(),
            &serde_json::from_value(json!({ "metadata": { "name": marker } }))?,
        )
        .await?;
    Ok((ns, dir, kubeconfig))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hub_and_api_server_connections_go_through_https_proxy_unless_excluded()
-> anyhow::Result<()> {
    let control_plane = ControlPlane::shared()?;
    let marker = "through-the-proxy";
    let (ns, dir, kubeconfig) = namespace_with_marker(control_plane, "egress", marker).await?;
    let api_server: http::Uri = control_plane.server().parse()?;
    let api_target = format!(
        "{}:{}",
        api_server.host().unwrap_or_default(),
        api_server.port_u16().unwrap_or(443)
    );
    let hub = fixtures::start_plaintext_hub(&dir).await?;
    let hub_target = hub.grpc_addr.to_string();
    let mut proxy = Tinyproxy::start(&dir.join("tinyproxy")).await?;
    let proxy_url = proxy.url();
    let account = |name: &str| fixtures::account(name, &kubeconfig, &ns, &["configmaps"]);
    let counts = |proxy: &Tinyproxy| {
        (
            proxy.connects_to(&hub_target),
            proxy.connects_to(&api_target),
        )
    };

    // (name, proxy variables, clouddriver keys, kubernetes keys, whether the hub and the
    // API server are reached through the proxy).
    let no_proxy = "localhost,127.0.0.1";
    let scenarios = [
        // HTTPS_PROXY: both connections are tunnelled through the proxy.
        ("proxied", vec![], json!({}), json!({}), (true, true)),
        // NO_PROXY naming the loopback address: neither goes through it.
        (
            "no-proxy",
            vec![("NO_PROXY", no_proxy)],
            json!({}),
            json!({}),
            (false, false),
        ),
        // Armory's clouddriver.noProxy: the hub directly, the API server through it.
        (
            "hub-direct",
            vec![],
            json!({ "noProxy": true }),
            json!({}),
            (false, true),
        ),
        // Armory's kubernetes.noProxy: the API server directly, the hub through it.
        (
            "api-direct",
            vec![],
            json!({}),
            json!({ "noProxy": true }),
            (true, false),
        ),
    ];
    for (scenario, extra_env, clouddriver, kubernetes, (via_hub, via_api)) in scenarios {
        let before = counts(&proxy);
        let name = format!("{scenario}-{ns}");
        let config = write_config(
            &dir,
            scenario,
            hub.grpc_addr,
            account(&name),
            clouddriver,
            kubernetes,
        )?;
        let mut env = vec![("HTTPS_PROXY", proxy_url.as_str())];
        env.extend(extra_env);
        let mut agent = start_agent(&dir, scenario, &config, &env)?;
        wait_streamed(hub.http_addr, &name, marker, &mut agent).await?;
        let after = counts(&proxy);
        assert_eq!(
            (after.0 > before.0, after.1 > before.1),
            (via_hub, via_api),
            "{scenario}: CONNECT to the hub ({hub_target}) {} -> {}, to the API server \
             ({api_target}) {} -> {}; expected through the proxy: hub {via_hub}, API server \
             {via_api}; its log:\n{}",
            before.0,
            after.0,
            before.1,
            after.1,
            proxy.log()
        );
        agent.stop(Duration::from_secs(20));
    }

    proxy.stop();
    hub.shutdown().await?;
    process::remove_at_exit(dir);
    Ok(())
}

/// The hub serves mutual TLS (client certificates required, signed by a CA it trusts): the
/// agent's TLS runs inside the proxy's CONNECT tunnel, end to end, and the account streams.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mutual_tls_hub_is_reached_through_https_proxy() -> anyhow::Result<()> {
    let control_plane = ControlPlane::shared()?;
    let marker = "through-the-tunnel";
    let (ns, dir, kubeconfig) = namespace_with_marker(control_plane, "egress-tls", marker).await?;

    let ca = CertificateAuthority::new("egress-agents-ca")?;
    let serving = ca.serving("scale-agent-hub", &[])?;
    let client = ca.client("agent-egress", &[])?;
    let (ca_file, cert_file, key_file) = (
        dir.join("ca.pem"),
        dir.join("agent.pem"),
        dir.join("agent-key.pem"),
    );
    std::fs::write(&ca_file, &ca.cert_pem)?;
    std::fs::write(&cert_file, &client.cert_pem)?;
    std::fs::write(&key_file, &client.key_pem)?;
    let mut hub_config = fixtures::test_hub_config(&dir)?;
    hub_config.agents.security =
        scale_agent_hub::GrpcSecurity::MutualTls(scale_agent_hub::TlsMaterial {
            cert_pem: serving.cert_pem.into_bytes(),
            key_pem: serving.key_pem.into_bytes(),
            client_ca_pem: Some(ca.cert_pem.clone().into_bytes()),
        });
    let hub = scale_agent_hub::start(hub_config).await?;
    let hub_target = hub.grpc_addr.to_string();
    let mut proxy = Tinyproxy::start(&dir.join("tinyproxy")).await?;
    let proxy_url = proxy.url();

    let name = format!("tls-{ns}");
    let config = write_config(
        &dir,
        "tls",
        hub.grpc_addr,
        fixtures::account(&name, &kubeconfig, &ns, &["configmaps"]),
        json!({
            "insecure": false,
            "tls": {
                "serverName": "localhost",
                "cacertFile": ca_file.display().to_string(),
                "clientCertFile": cert_file.display().to_string(),
                "clientKeyFile": key_file.display().to_string(),
            },
        }),
        // The API server directly: this case is about the hub's connection.
        json!({ "noProxy": true }),
    )?;
    let mut agent = start_agent(&dir, "tls", &config, &[("HTTPS_PROXY", proxy_url.as_str())])?;
    wait_streamed(hub.http_addr, &name, marker, &mut agent).await?;
    assert!(
        proxy.connects_to(&hub_target) > 0,
        "the agent streamed without a CONNECT to the hub ({hub_target}) through the proxy; \
         its log:\n{}",
        proxy.log()
    );
    // The hub saw the agent's client certificate, not the proxy: TLS ran end to end.
    let accounts = fixtures::hub_call("GET", hub.http_addr, "/api/v1/accounts")
        .send()
        .await?
        .body;
    assert!(
        accounts.contains("agent-egress"),
        "the hub does not name the agent's certificate identity: {accounts}"
    );

    agent.stop(Duration::from_secs(20));
    proxy.stop();
    hub.shutdown().await?;
    process::remove_at_exit(dir);
    Ok(())
}
