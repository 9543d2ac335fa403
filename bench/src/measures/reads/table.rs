//! Measure 9's Table row: what a person types most, `kubectl get` (a Table, printed by the
//! hub from its cache since issue 30), of the paged LIST's 10,000 ConfigMaps, through the
//! proxy beside straight to the API server, with the LISTs the API server received.
//!
//! One namespace, not `kubectl get pods -A` as the issue words it: measure 9's account
//! serves two namespaces (`namespaces:`), and such an account's requests across all
//! namespaces are refused by design; its 10,000 objects of one kind are these ConfigMaps.

use std::{collections::BTreeMap, time::Instant};

use anyhow::{Context as _, Result, bail};
use http_body_util::BodyExt as _;
use kube::{Client, api::ListParams, client::Body};
use serde_json::{Value, json};

use super::{
    CACHE_HEADER, CycleSide, KUBECTL_TIMEOUT, LoadWindow, PAGE, Side, Target, World, cache_header,
    header_text, pair,
};
use crate::report::{Percentiles, Row, secs};

/// What kubectl sends for a Table.
const TABLE_ACCEPT: &str = "application/json;as=Table;v=v1;g=meta.k8s.io,application/json;as=Table;v=v1beta1;g=meta.k8s.io,application/json";

/// The Table LISTs kubectl makes (pages of [`PAGE`]), with kube's client, untimed: which path
/// answered them, by [`CACHE_HEADER`] value; fails unless they hold `objects` rows.
async fn table_headers(
    client: &Client,
    collection: &str,
    objects: usize,
) -> Result<BTreeMap<String, usize>> {
    let mut headers = BTreeMap::new();
    let mut rows = 0;
    let mut params = ListParams::default().limit(PAGE);
    loop {
        let mut request = kube::core::Request::new(collection).list(&params)?;
        request.headers_mut().insert(
            http::header::ACCEPT,
            http::HeaderValue::from_static(TABLE_ACCEPT),
        );
        let response = client.send(request.map(Body::from)).await?;
        let status = response.status();
        *headers.entry(cache_header(&response)).or_default() += 1;
        let body = response.into_body().collect().await?.to_bytes();
        if !status.is_success() {
            bail!(
                "Table LIST {collection}: HTTP {status}: {}",
                String::from_utf8_lossy(&body)
            );
        }
        let table: Value = serde_json::from_slice(&body)
            .with_context(|| format!("a page of the Table of {collection}"))?;
        if table["kind"] != "Table" {
            bail!("LIST {collection} as a Table answered a {}", table["kind"]);
        }
        rows += table["rows"].as_array().map_or(0, Vec::len);
        match table["metadata"]["continue"]
            .as_str()
            .filter(|t| !t.is_empty())
        {
            Some(token) => params = params.continue_token(token),
            None => break,
        }
    }
    if rows != objects {
        bail!("the Table of {collection} has {rows} rows, not {objects}");
    }
    Ok(headers)
}

/// `kubectl get configmaps -n <ns>` (kubectl asks for a Table, in pages of 500); fails
/// unless it printed `objects` rows. Returns its seconds.
async fn printed(target: &Target, ns: &str, objects: usize) -> Result<f64> {
    let args: Vec<String> = vec![
        "get".into(),
        "configmaps".into(),
        format!("--namespace={ns}"),
    ];
    let started = Instant::now();
    let outcome = target
        .kubectl
        .run(&target.kubeconfig, &args, None, KUBECTL_TIMEOUT)
        .await?;
    let elapsed = started.elapsed().as_secs_f64();
    if !outcome.success() {
        bail!(
            "kubectl get configmaps ({}) failed ({:?}): {}",
            target.kubeconfig.display(),
            outcome.code,
            outcome.messages()
        );
    }
    // A header line, then one row per ConfigMap.
    let rows = outcome.stdout.lines().count().saturating_sub(1);
    if rows != objects || !outcome.stdout.starts_with("NAME") {
        bail!(
            "kubectl get configmaps through {} printed {rows} rows, not the {objects} of namespace {ns}",
            target.kubeconfig.display()
        );
    }
    Ok(elapsed)
}

pub(super) async fn table_row(
    w: &World<'_>,
    proxy: &Target,
    direct: &Target,
    ns: &str,
    objects: usize,
    rows: &mut Vec<Row>,
) -> Result<()> {
    for target in [proxy, direct] {
        printed(target, ns, objects).await?;
    }
    let repeats = w.o.reads_list_repeats.max(1);
    let (mut p, mut d) = (CycleSide::default(), CycleSide::default());
    for i in 0..repeats {
        for order in pair(i) {
            let (target, side) = if order == Side::Proxy {
                (proxy, &mut p)
            } else {
                (direct, &mut d)
            };
            let window = LoadWindow::start(w.env, w.apiserver, w.hub.pid()).await?;
            side.secs.push(printed(target, ns, objects).await?);
            let load = window.finish(w.env).await?;
            side.load.apiserver_cpu += load.apiserver_cpu / repeats as f64;
            side.load.hub_cpu += load.hub_cpu / repeats as f64;
            side.load.lists += load.lists / repeats as f64;
        }
    }
    let collection = format!("/api/v1/namespaces/{ns}/configmaps");
    let headers = table_headers(&proxy.client, &collection, objects).await?;
    let direct_headers = table_headers(&direct.client, &collection, objects).await?;
    let (ps, ds) = (Percentiles::of(&p.secs).p50, Percentiles::of(&d.secs).p50);
    rows.push(Row {
        id: "reads-table".into(),
        measure: 9,
        title: format!(
            "`kubectl get configmaps` (a Table, kubectl's pages of 500) of {objects} ConfigMaps through the proxy"
        ),
        system: format!(
            "{}; API server {:.2} CPU s, {:.0} LISTs",
            secs(ps),
            p.load.apiserver_cpu,
            p.load.lists
        ),
        baseline_name: "the same command straight to the API server".into(),
        baseline: format!(
            "{}; API server {:.2} CPU s, {:.0} LISTs",
            secs(ds),
            d.load.apiserver_cpu,
            d.load.lists
        ),
        note: format!(
            "median of {repeats} per side, alternating, after one untimed each; one kubectl process per run, every ConfigMap printed once; hub CPU {:.2} s per run through the proxy; {CACHE_HEADER} of the same Table pages made again with kube's client, untimed, through the proxy: {}; directly: {}",
            p.load.hub_cpu,
            header_text(&headers),
            header_text(&direct_headers)
        ),
        values: json!({ "objects": objects, "repeats": repeats,
            "proxy_seconds": p.secs, "direct_seconds": d.secs,
            "proxy_apiserver_cpu_seconds": p.load.apiserver_cpu, "direct_apiserver_cpu_seconds": d.load.apiserver_cpu,
            "proxy_apiserver_lists": p.load.lists, "direct_apiserver_lists": d.load.lists,
            "proxy_hub_cpu_seconds": p.load.hub_cpu, "cache_header": headers }),
    });
    Ok(())
}
