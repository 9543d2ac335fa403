//! The footprint baseline: a process that does nothing but keep kube-runtime reflectors
//! (list + watch + in-memory store, what an informer does) of the same kinds and namespace
//! as the agent. Run as this executable with `SCALE_AGENT_BENCH_ROLE=watch-floor`.

use anyhow::{Context as _, Result};
use futures::StreamExt as _;
use kube::{
    Api,
    api::DynamicObject,
    config::{KubeConfigOptions, Kubeconfig},
    discovery::ApiResource,
    runtime::{WatchStreamExt as _, reflector, watcher},
};

pub const KUBECONFIG_ENV: &str = "SCALE_AGENT_BENCH_FLOOR_KUBECONFIG";
pub const NAMESPACE_ENV: &str = "SCALE_AGENT_BENCH_FLOOR_NAMESPACE";
/// `group/version/Kind/plural`, comma-separated (`/v1/ConfigMap/configmaps` for core).
pub const KINDS_ENV: &str = "SCALE_AGENT_BENCH_FLOOR_KINDS";
/// Printed on stdout once every reflector has its initial list.
pub const SYNCED_MARKER: &str = "floor synced objects=";

/// The ten kinds of the idle-footprint measure: (group, version, kind, plural).
pub const TEN_KINDS: &[(&str, &str, &str, &str)] = &[
    ("", "v1", "ConfigMap", "configmaps"),
    ("", "v1", "Secret", "secrets"),
    ("", "v1", "Service", "services"),
    ("", "v1", "ServiceAccount", "serviceaccounts"),
    ("", "v1", "Pod", "pods"),
    ("apps", "v1", "Deployment", "deployments"),
    ("apps", "v1", "ReplicaSet", "replicasets"),
    ("apps", "v1", "StatefulSet", "statefulsets"),
    ("batch", "v1", "Job", "jobs"),
    ("batch", "v1", "CronJob", "cronjobs"),
];

pub fn kinds_env(kinds: &[(&str, &str, &str, &str)]) -> String {
    kinds
        .iter()
        .map(|(g, v, k, p)| format!("{g}/{v}/{k}/{p}"))
        .collect::<Vec<_>>()
        .join(",")
}

pub fn main() -> Result<()> {
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()?;
    runtime.block_on(run())
}

async fn run() -> Result<()> {
    let kubeconfig = std::env::var(KUBECONFIG_ENV).context(KUBECONFIG_ENV)?;
    let namespace = std::env::var(NAMESPACE_ENV).context(NAMESPACE_ENV)?;
    let kinds = std::env::var(KINDS_ENV).context(KINDS_ENV)?;
    let config = kube::Config::from_custom_kubeconfig(
        Kubeconfig::read_from(&kubeconfig)?,
        &KubeConfigOptions::default(),
    )
    .await?;
    let client = kube::Client::try_from(config)?;
    let mut readers = Vec::new();
    for spec in kinds.split(',').filter(|s| !s.is_empty()) {
        let parts: Vec<&str> = spec.split('/').collect();
        let [group, version, kind, plural] = parts[..] else {
            anyhow::bail!("bad kind {spec:?}");
        };
        let resource = ApiResource {
            group: group.into(),
            version: version.into(),
            api_version: if group.is_empty() {
                version.into()
            } else {
                format!("{group}/{version}")
            },
            kind: kind.into(),
            plural: plural.into(),
        };
        let api = Api::<DynamicObject>::namespaced_with(client.clone(), &namespace, &resource);
        let writer = reflector::store::Writer::new(resource);
        let reader = writer.as_reader();
        let stream = reflector(writer, watcher(api, watcher::Config::default())).applied_objects();
        tokio::spawn(async move {
            let mut stream = std::pin::pin!(stream);
            while stream.next().await.is_some() {}
        });
        readers.push(reader);
    }
    let mut objects = 0;
    for reader in &readers {
        reader.wait_until_ready().await?;
        objects += reader.len();
    }
    println!("{SYNCED_MARKER}{objects}");
    std::future::pending::<()>().await;
    Ok(())
}
