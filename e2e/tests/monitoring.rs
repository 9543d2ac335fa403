//! The monitoring that ships in the chart (alerts in `files/alerts.yaml`, the Grafana
//! dashboard in `files/dashboard.json`) uses only metrics the components export: the
//! operator (its binary, on the test control plane), the hub and an agent connected to it
//! run for real, are given work (a ScaleAgent to reconcile, an account to stream, an operation
//! and a proxied request through the hub), and their `/metrics` are scraped; every
//! `scale_agent_*` name in an alert or panel expression must be a family (or a sample of one)
//! that a component serves. A labelled family has no series until its first event, so the
//! few that count rare events (a rejected account, a 410 Gone, a failed reconcile) may be
//! missing from the scrape; those must then be registered in the component's metrics.rs,
//! and the test names them.

use std::{
    collections::BTreeSet,
    net::{SocketAddr, TcpListener},
    path::Path,
    process::Command,
    time::{Duration, Instant},
};

use scale_agent_e2e::{
    ControlPlane, crds,
    fixtures::{
        self, hub_call, start_agent_replica, start_plaintext_hub, write_plaintext_agent_config,
    },
    http::Call,
    process::ManagedProcess,
};
use serde_json::{Value, json};

fn chart_file(name: &str) -> anyhow::Result<String> {
    let path = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../manifests/helm/scale-agent/files")
        .join(name);
    Ok(std::fs::read_to_string(path)?)
}

/// The `scale_agent_*` names in a PromQL expression.
fn metric_names(expr: &str, into: &mut BTreeSet<String>) {
    let mut rest = expr;
    while let Some(start) = rest.find("scale_agent_") {
        let tail = &rest[start..];
        let end = tail
            .find(|c: char| !(c.is_ascii_alphanumeric() || c == '_' || c == ':'))
            .unwrap_or(tail.len());
        into.insert(tail[..end].to_string());
        rest = &tail[end..];
    }
}

/// Every expression of the alerts and of the dashboard's panels.
fn expressions() -> anyhow::Result<Vec<String>> {
    let alerts: Value = serde_saphyr::from_str(&chart_file("alerts.yaml")?)?;
    let dashboard: Value = serde_json::from_str(&chart_file("dashboard.json")?)?;
    let mut exprs = Vec::new();
    for group in alerts["groups"].as_array().into_iter().flatten() {
        for rule in group["rules"].as_array().into_iter().flatten() {
            exprs.extend(rule["expr"].as_str().map(str::to_string));
        }
    }
    for panel in dashboard["panels"].as_array().into_iter().flatten() {
        for target in panel["targets"].as_array().into_iter().flatten() {
            exprs.extend(target["expr"].as_str().map(str::to_string));
        }
    }
    Ok(exprs)
}

/// The names a scrape offers to PromQL: sample names, and the names of each `# TYPE` family
/// with the suffixes its type gets (a family with no labelled series yet still counts).
fn exported_names(scrape: &str, into: &mut BTreeSet<String>) {
    for line in scrape.lines() {
        if let Some(declaration) = line.strip_prefix("# TYPE ") {
            let mut parts = declaration.split_whitespace();
            let (Some(family), Some(kind)) = (parts.next(), parts.next()) else {
                continue;
            };
            let suffixes: &[&str] = match kind {
                "counter" => &["_total"],
                "histogram" => &["_bucket", "_sum", "_count"],
                "info" => &["_info"],
                _ => &[""],
            };
            for suffix in suffixes {
                into.insert(format!("{family}{suffix}"));
            }
        } else if !line.starts_with('#') {
            let end = line.find(['{', ' ']).unwrap_or(line.len());
            into.insert(line[..end].to_string());
        }
    }
}

/// A sample name's family: without the suffix its type adds.
fn family_of(name: &str) -> &str {
    ["_total", "_bucket", "_sum", "_count", "_info"]
        .iter()
        .find_map(|suffix| name.strip_suffix(suffix))
        .unwrap_or(name)
}

/// The full names of the families the components register, read from their metrics.rs: the
/// hub's and operator's under their registry prefix, the agent's written out.
fn registered_families() -> anyhow::Result<BTreeSet<String>> {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    let mut families = BTreeSet::new();
    for (file, prefix) in [
        ("hub/src/metrics.rs", "scale_agent_hub_"),
        ("operator/src/metrics.rs", "scale_agent_operator_"),
        ("agent/src/metrics.rs", ""),
    ] {
        let source = std::fs::read_to_string(root.join(file))?;
        // `register(` then the name on the same or the next line.
        for chunk in source.split("register(").skip(1) {
            if let Some(name) = chunk.split('"').nth(1) {
                families.insert(format!("{prefix}{name}"));
            }
        }
    }
    Ok(families)
}

fn free_addr() -> anyhow::Result<SocketAddr> {
    Ok(TcpListener::bind("127.0.0.1:0")?.local_addr()?)
}

/// GETs `url` until it answers 200, for up to a minute.
async fn scrape(call: impl Fn() -> Call, what: &str) -> anyhow::Result<String> {
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        match call().send().await {
            Ok(response) if response.status == 200 => return Ok(response.body),
            other => anyhow::ensure!(
                Instant::now() < deadline,
                "{what} /metrics did not answer 200: {other:?}"
            ),
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

#[tokio::test]
async fn every_metric_the_alerts_and_dashboard_use_is_exported() -> anyhow::Result<()> {
    let control_plane = ControlPlane::shared()?;
    let client = control_plane.client().await?;
    crds::install(&client, &crds::read_crds(&crds::manifests_dir())?).await?;
    let namespace = control_plane.namespace(&client, "monitoring").await?;
    let dir = fixtures::temp_dir("monitoring")?;

    let operator_addr = free_addr()?;
    let mut command = Command::new(env!("CARGO_BIN_EXE_e2e-operator"));
    command
        .arg(format!("--metrics-address={operator_addr}"))
        .arg(format!("--watch-namespaces={namespace}"))
        // So that it signs the certificate of the ScaleAgent "signed" below.
        .arg("--allow-operator-signed-certificates")
        .env("KUBECONFIG", control_plane.kubeconfig_path());
    let mut operator =
        ManagedProcess::spawn_command("operator", command, dir.join("operator.log"))?;

    // Work for each: a ScaleAgent (its reconcile fails on the missing issuer Secret, which
    // is counted too), an account streamed, an operation and a proxied request.
    let scale_agents: kube::Api<scale_agent_crds::ScaleAgent> =
        kube::Api::namespaced(client.clone(), &namespace);
    let scale_agent = serde_json::from_value(json!({
        "apiVersion": "scaleagent.dev/v1alpha1",
        "kind": "ScaleAgent",
        "metadata": { "name": "watched" },
        "spec": {
            "hub": { "address": "hub.example.com:9091" },
            "clientCertificate": { "issuerSecretRef": { "name": "missing-ca" } },
        },
    }))?;
    scale_agents
        .create(&kube::api::PostParams::default(), &scale_agent)
        .await?;
    // And one whose certificate the operator signs: its expiry is exported.
    let issuer = scale_agent_e2e::pki::CertificateAuthority::new("monitoring-agents")?;
    let secrets: kube::Api<k8s_openapi::api::core::v1::Secret> =
        kube::Api::namespaced(client.clone(), &namespace);
    secrets
        .create(
            &kube::api::PostParams::default(),
            &serde_json::from_value(json!({
                "apiVersion": "v1", "kind": "Secret",
                "metadata": { "name": "agent-ca" },
                "stringData": { "tls.crt": issuer.cert_pem, "tls.key": issuer.key_pem },
            }))?,
        )
        .await?;
    let signed = serde_json::from_value(json!({
        "apiVersion": "scaleagent.dev/v1alpha1",
        "kind": "ScaleAgent",
        "metadata": { "name": "signed" },
        "spec": {
            "hub": { "address": "hub.example.com:9091" },
            "clientCertificate": { "issuerSecretRef": { "name": "agent-ca" }, "lifetime": "720h" },
        },
    }))?;
    scale_agents
        .create(&kube::api::PostParams::default(), &signed)
        .await?;
    let hub = start_plaintext_hub(&dir).await?;
    let agent_config = dir.join("agent.yaml");
    let account = fixtures::account(
        "monitored",
        control_plane.kubeconfig_path(),
        &namespace,
        &["ConfigMap"],
    );
    write_plaintext_agent_config(&agent_config, hub.grpc_addr, json!([account]), 5)?;
    let agent = start_agent_replica(&agent_config, "monitoring").await?;
    let operation = json!({
        "type": "apply",
        "manifest": {
            "apiVersion": "v1", "kind": "ConfigMap",
            "metadata": { "name": "from-hub", "namespace": namespace },
            "data": { "a": "1" },
        },
        "fieldManager": "spinnaker",
    });
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let mut call = hub_call(
            "POST",
            hub.http_addr,
            "/api/v1/accounts/monitored/operations",
        )
        .header("content-type", "application/json");
        call.body = Some(operation.to_string().into_bytes());
        let response = call.send().await?;
        if response.status == 200 {
            break;
        }
        anyhow::ensure!(
            Instant::now() < deadline,
            "the operation never succeeded: {} {}",
            response.status,
            response.body
        );
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    // Without the account's token the proxy refuses; counted all the same.
    let _ = hub_call("GET", hub.http_addr, "/clusters/monitored/api")
        .send()
        .await?;

    let mut exported = BTreeSet::new();
    // The signed ScaleAgent's certificate times, once its reconcile has issued it.
    let expiry_series = format!(
        "scale_agent_operator_certificate_expiry_timestamp_seconds{{namespace=\"{namespace}\",scaleagent=\"signed\"}} "
    );
    let renewal_series = format!(
        "scale_agent_operator_certificate_renewal_timestamp_seconds{{namespace=\"{namespace}\",scaleagent=\"signed\"}} "
    );
    let deadline = Instant::now() + Duration::from_secs(90);
    let operator_scrape = loop {
        let scraped = scrape(
            || Call::new("GET", format!("http://{operator_addr}/metrics")),
            "the operator",
        )
        .await;
        operator.ensure_running()?;
        let scraped = scraped?;
        if scraped.contains(&expiry_series) {
            break scraped;
        }
        anyhow::ensure!(
            Instant::now() < deadline,
            "no {expiry_series:?} in the operator's /metrics after 90 s:\n{scraped}"
        );
        tokio::time::sleep(Duration::from_millis(500)).await;
    };
    let sample = |series: &str| -> anyhow::Result<i64> {
        let line = operator_scrape
            .lines()
            .find_map(|line| line.strip_prefix(series))
            .ok_or_else(|| anyhow::anyhow!("no {series:?} in the scrape"))?;
        Ok(line.trim().parse()?)
    };
    let now = k8s_openapi::jiff::Timestamp::now().as_second();
    let (expiry, renewal) = (sample(&expiry_series)?, sample(&renewal_series)?);
    let lifetime = 720 * 3600;
    // Issued at most a few minutes ago for 720h; renewed with a third of that left.
    assert!(
        (now + lifetime - 600..=now + lifetime).contains(&expiry),
        "expiry {expiry}, now {now}"
    );
    assert_eq!(expiry - renewal, lifetime / 3, "renewal {renewal}");
    exported_names(&operator_scrape, &mut exported);
    let hub_scrape = scrape(|| hub_call("GET", hub.http_addr, "/metrics"), "the hub").await?;
    exported_names(&hub_scrape, &mut exported);
    let agent_addr = agent.admin_addr();
    let agent_scrape = scrape(
        || Call::new("GET", format!("http://{agent_addr}/metrics")),
        "the agent",
    )
    .await?;
    exported_names(&agent_scrape, &mut exported);
    for component in ["operator", "agent", "hub"] {
        assert!(
            exported.contains(&format!("scale_agent_{component}_build_info")),
            "no build info from the {component}"
        );
    }

    let mut used = BTreeSet::new();
    for expr in expressions()? {
        metric_names(&expr, &mut used);
    }
    assert!(used.len() >= 10, "the monitoring assets use only {used:?}");
    let registered = registered_families()?;
    let not_scraped: Vec<&String> = used.difference(&exported).collect();
    let missing: Vec<&&String> = not_scraped
        .iter()
        .filter(|name| !registered.contains(family_of(name)))
        .collect();
    assert!(
        missing.is_empty(),
        "the alerts or the dashboard use metrics no component exports: {missing:?}; exported: {exported:?}"
    );
    eprintln!("registered but not seen in a scrape (no event yet): {not_scraped:?}");

    operator.stop(Duration::from_secs(10));
    Ok(())
}

#[test]
fn a_metric_no_component_exports_is_caught() {
    let mut exported = BTreeSet::new();
    exported_names(
        "# TYPE scale_agent_hub_relists counter\nscale_agent_hub_relists_total 3\n\
         # TYPE scale_agent_hub_build info\nscale_agent_hub_build_info{version=\"0.1.0\"} 1\n",
        &mut exported,
    );
    let mut used = BTreeSet::new();
    metric_names(
        "rate(scale_agent_hub_relists_total[5m]) + scale_agent_hub_build_info + scale_agent_hub_relist_total",
        &mut used,
    );
    let missing: Vec<&String> = used.difference(&exported).collect();
    assert_eq!(missing, ["scale_agent_hub_relist_total"]);
}
