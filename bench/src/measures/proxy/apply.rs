//! Measure 8's apply row: `kubectl apply` of a Deployment through the proxy beside straight
//! to the API server.

use std::time::{Duration, Instant};

use anyhow::{Result, bail};
use scale_agent_e2e::kubectl::Kubectl;
use serde_json::json;

use super::{Side, Sides, pair, signed_ms};
use crate::{
    Options,
    env::Env,
    report::{Percentiles, Row},
};

/// How long one kubectl apply may take before the run fails.
const KUBECTL_TIMEOUT: Duration = Duration::from_secs(120);

/// A Deployment whose image changes with `i`, so each apply is a real patch.
fn deployment(ns: &str, name: &str, i: usize) -> String {
    json!({
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": { "name": name, "namespace": ns, "labels": { "app": name } },
        "spec": {
            "replicas": 1,
            "selector": { "matchLabels": { "app": name } },
            "template": {
                "metadata": { "labels": { "app": name } },
                "spec": { "containers": [{
                    "name": "web",
                    "image": format!("registry.example/bench/web:1.0.{i}"),
                    "ports": [{ "containerPort": 8080 }],
                }] },
            },
        },
    })
    .to_string()
}

pub(super) async fn apply(
    env: &Env,
    sides: &Sides,
    o: &Options,
    ns: &str,
    rows: &mut Vec<Row>,
) -> Result<()> {
    let binary = env.control_plane.binaries().kubectl();
    let kubectl = |side: Side| {
        let home = match side {
            Side::Proxy => "kubectl-home-proxy",
            Side::Direct => "kubectl-home-direct",
        };
        Kubectl::new(binary.clone(), env.dir.join(home))
    };
    let (proxy_kubectl, direct_kubectl) = (kubectl(Side::Proxy), kubectl(Side::Direct));
    let args: Vec<String> = ["apply", "-f", "-"].map(String::from).to_vec();
    let run = |side: Side, i: usize| {
        let kubectl = match side {
            Side::Proxy => &proxy_kubectl,
            Side::Direct => &direct_kubectl,
        };
        let name = match side {
            Side::Proxy => "web-proxy",
            Side::Direct => "web-direct",
        };
        let manifest = deployment(ns, name, i);
        let args = &args;
        async move {
            let started = Instant::now();
            let outcome = kubectl
                .run(
                    sides.kubeconfig(side),
                    args,
                    Some(manifest.as_str()),
                    KUBECTL_TIMEOUT,
                )
                .await?;
            let elapsed = started.elapsed().as_secs_f64() * 1000.0;
            if !outcome.success() {
                bail!(
                    "kubectl apply ({side:?}) failed ({:?}): {}",
                    outcome.code,
                    outcome.messages()
                );
            }
            anyhow::Ok(elapsed)
        }
    };
    // Two applies each first: the first creates the Deployment, and both fill the home's
    // discovery and OpenAPI caches, as in Clouddriver's long-lived pod.
    for i in 0..2 {
        for side in pair(i) {
            run(side, i).await?;
        }
    }
    let n = o.proxy_applies.max(1);
    let (mut proxy_ms, mut direct_ms) = (Vec::new(), Vec::new());
    for i in 0..n {
        for side in pair(i) {
            let elapsed = run(side, i + 2).await?;
            match side {
                Side::Proxy => proxy_ms.push(elapsed),
                Side::Direct => direct_ms.push(elapsed),
            }
        }
    }
    let (proxy_p, direct_p) = (Percentiles::of(&proxy_ms), Percentiles::of(&direct_ms));
    rows.push(Row {
        id: "proxy-apply".into(),
        measure: 8,
        title: format!("`kubectl apply -f -` of a Deployment (new image each time) through the proxy, {n} applies"),
        system: proxy_p.display_ms(),
        baseline_name: "the same `kubectl apply` straight to the API server".into(),
        baseline: direct_p.display_ms(),
        note: format!(
            "one kubectl {} process per apply, manifest on stdin (Clouddriver's way), each side with its own warm HOME (discovery and OpenAPI caches; 2 warm-up applies); includes kubectl's start; difference at p50 {}",
            scale_agent_e2e::KUBERNETES_VERSION,
            signed_ms(proxy_p.p50 - direct_p.p50)
        ),
        values: json!({ "applies": n, "proxy_ms": proxy_p, "direct_ms": direct_p }),
    });
    Ok(())
}
