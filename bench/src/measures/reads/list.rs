//! Measure 9's paged-LIST row: many ConfigMaps in `limit=500` pages with kube's client,
//! through the proxy beside straight to the API server.

use std::{collections::BTreeMap, time::Instant};

use anyhow::{Result, bail};
use serde_json::json;

use super::{
    CACHE_HEADER, CycleSide, LoadWindow, PAGE, Target, World, header_text, merge, paged_list,
};
use crate::{
    measures::proxy::{Side, pair},
    report::{Percentiles, Row, secs},
};

pub(super) async fn list_row(
    w: &World<'_>,
    proxy: &Target,
    direct: &Target,
    ns: &str,
    objects: usize,
    rows: &mut Vec<Row>,
) -> Result<()> {
    let collection = format!("/api/v1/namespaces/{ns}/configmaps");
    for target in [proxy, direct] {
        paged_list(&target.client, &collection).await?;
    }
    let repeats = w.o.reads_list_repeats.max(1);
    let (mut p, mut d) = (CycleSide::default(), CycleSide::default());
    let (mut headers, mut direct_headers) = (BTreeMap::new(), BTreeMap::new());
    let mut pages = 0;
    for i in 0..repeats {
        for order in pair(i) {
            let through_proxy = order == Side::Proxy;
            let (target, side) = if through_proxy {
                (proxy, &mut p)
            } else {
                (direct, &mut d)
            };
            let window = LoadWindow::start(w.env, w.apiserver, w.hub.pid()).await?;
            let started = Instant::now();
            let listed = paged_list(&target.client, &collection).await?;
            side.secs.push(started.elapsed().as_secs_f64());
            let load = window.finish(w.env).await?;
            if listed.objects != objects {
                bail!(
                    "a paged LIST {} gave {} ConfigMaps, not {objects}",
                    if through_proxy {
                        "through the proxy"
                    } else {
                        "to the API server"
                    },
                    listed.objects
                );
            }
            pages = listed.pages;
            merge(
                if through_proxy {
                    &mut headers
                } else {
                    &mut direct_headers
                },
                listed.headers,
            );
            side.load.apiserver_cpu += load.apiserver_cpu / repeats as f64;
            side.load.hub_cpu += load.hub_cpu / repeats as f64;
            side.load.lists += load.lists / repeats as f64;
        }
    }
    let (ps, ds) = (Percentiles::of(&p.secs).p50, Percentiles::of(&d.secs).p50);
    rows.push(Row {
        id: "reads-list".into(),
        measure: 9,
        title: format!("LIST of {objects} ConfigMaps in pages of {PAGE} (`limit`/`continue`, kube's client) through the proxy"),
        system: format!("{} ({pages} pages); API server {:.2} CPU s, {:.0} LISTs", secs(ps), p.load.apiserver_cpu, p.load.lists),
        baseline_name: "the same pages straight to the API server".into(),
        baseline: format!("{} ({pages} pages); API server {:.2} CPU s, {:.0} LISTs", secs(ds), d.load.apiserver_cpu, d.load.lists),
        note: format!(
            "median of {repeats} per side, alternating, after one untimed each; every ConfigMap counted once per LIST; hub CPU {:.2} s per LIST through the proxy; {CACHE_HEADER} through the proxy: {}; directly: {}",
            p.load.hub_cpu,
            header_text(&headers),
            header_text(&direct_headers)
        ),
        values: json!({ "objects": objects, "page": PAGE, "pages": pages, "repeats": repeats,
            "proxy_seconds": p.secs, "direct_seconds": d.secs,
            "proxy_apiserver_cpu_seconds": p.load.apiserver_cpu, "direct_apiserver_cpu_seconds": d.load.apiserver_cpu,
            "proxy_apiserver_lists": p.load.lists, "direct_apiserver_lists": d.load.lists,
            "proxy_hub_cpu_seconds": p.load.hub_cpu, "cache_header": headers }),
    });
    Ok(())
}
