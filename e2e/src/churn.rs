//! Objects created, updated and deleted at random in some namespaces of real API servers
//! while a test breaks something, so that what the hub's caches missed shows: each namespace
//! churns in its own task until [`Churn::finish`], drawing from a few names so that updates
//! and deletes are frequent. ConfigMaps by default ([`Churn::start`]); any mix of
//! [`ChurnKind`]s with [`Churn::start_kinds`]. A change the API server refuses for a while
//! (it is restarting) is tried again for up to [`RETRY`].

use std::{
    sync::{
        Arc,
        atomic::{AtomicBool, AtomicUsize, Ordering},
    },
    time::{Duration, Instant},
};

use kube::{
    Api, Client,
    api::{ApiResource, DeleteParams, DynamicObject, Patch, PatchParams, PostParams},
};
use rand::{Rng, SeedableRng, rngs::StdRng};
use serde_json::json;

/// Names the churn draws from (`cm-0`..): few, so it updates and deletes often.
pub const NAMES: usize = 6;

/// How long one change is tried again while the API server refuses it (a restart of
/// kube-apiserver takes a few seconds); past that its task ends with the error.
pub const RETRY: Duration = Duration::from_secs(60);

/// A kind the churn changes, and the prefix of its objects' names (`<prefix>-0`..).
#[derive(Clone, Debug)]
pub struct ChurnKind {
    pub resource: ApiResource,
    pub prefix: &'static str,
}

impl ChurnKind {
    fn core(kind: &str, plural: &str, prefix: &'static str) -> ChurnKind {
        ChurnKind {
            resource: ApiResource {
                group: String::new(),
                version: "v1".into(),
                api_version: "v1".into(),
                kind: kind.into(),
                plural: plural.into(),
            },
            prefix,
        }
    }

    /// ConfigMaps, `cm-0`..: a value in their data changes.
    pub fn config_maps() -> ChurnKind {
        ChurnKind::core("ConfigMap", "configmaps", "cm")
    }

    /// Secrets, `secret-0`..: a value in their data changes (the agent strips it).
    pub fn secrets() -> ChurnKind {
        ChurnKind::core("Secret", "secrets", "secret")
    }

    /// PodTemplates, `pt-0`..: a label changes. The control plane harness turns their watch
    /// cache off, so a watch from a compacted resourceVersion gets a real 410 Gone.
    pub fn pod_templates() -> ChurnKind {
        ChurnKind::core("PodTemplate", "podtemplates", "pt")
    }
}

/// Churn in some namespaces, until [`Churn::finish`].
pub struct Churn {
    stop: Arc<AtomicBool>,
    changes: Arc<AtomicUsize>,
    tasks: Vec<tokio::task::JoinHandle<anyhow::Result<()>>>,
}

impl Churn {
    /// Starts churning ConfigMaps in each `(client, namespace)`, seeded from `seed` (one
    /// seed each).
    pub fn start(namespaces: impl IntoIterator<Item = (Client, String)>, seed: u64) -> Churn {
        Churn::start_kinds(namespaces, seed, vec![ChurnKind::config_maps()])
    }

    /// Starts churning `kinds` (each change picks one) in each `(client, namespace)`,
    /// seeded from `seed` (one seed each).
    pub fn start_kinds(
        namespaces: impl IntoIterator<Item = (Client, String)>,
        seed: u64,
        kinds: Vec<ChurnKind>,
    ) -> Churn {
        let stop = Arc::new(AtomicBool::new(false));
        let changes = Arc::new(AtomicUsize::new(0));
        let tasks = namespaces
            .into_iter()
            .enumerate()
            .map(|(i, (client, namespace))| {
                tokio::spawn(churn(
                    client,
                    namespace,
                    kinds.clone(),
                    seed + i as u64,
                    stop.clone(),
                    changes.clone(),
                ))
            })
            .collect();
        Churn {
            stop,
            changes,
            tasks,
        }
    }

    /// Changes made so far.
    pub fn changes(&self) -> usize {
        self.changes.load(Ordering::SeqCst)
    }

    /// Stops it; the number of changes made (a change refused past [`RETRY`] ends its
    /// task: returned).
    pub async fn finish(mut self) -> anyhow::Result<usize> {
        self.stop.store(true, Ordering::SeqCst);
        for task in std::mem::take(&mut self.tasks) {
            task.await??;
        }
        Ok(self.changes.load(Ordering::SeqCst))
    }
}

impl Drop for Churn {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::SeqCst);
    }
}

async fn churn(
    client: Client,
    namespace: String,
    kinds: Vec<ChurnKind>,
    seed: u64,
    stop: Arc<AtomicBool>,
    changes: Arc<AtomicUsize>,
) -> anyhow::Result<()> {
    let apis: Vec<Api<DynamicObject>> = kinds
        .iter()
        .map(|k| Api::namespaced_with(client.clone(), &namespace, &k.resource))
        .collect();
    let mut rng = StdRng::seed_from_u64(seed);
    while !stop.load(Ordering::SeqCst) {
        // One kind draws nothing: a ConfigMap churn replays the same changes from a seed as
        // before kinds could be mixed.
        let k = if kinds.len() > 1 {
            rng.random_range(0..kinds.len())
        } else {
            0
        };
        let name = format!("{}-{}", kinds[k].prefix, rng.random_range(0..NAMES));
        let value = rng.random_range(0..1_000_000u32).to_string();
        let delete = rng.random_bool(0.3);
        let began = Instant::now();
        loop {
            match change(&apis[k], &kinds[k].resource, &name, &value, delete).await {
                Ok(()) => break,
                Err(e) if began.elapsed() < RETRY => {
                    tracing::debug!("churn on {name}: {e}; again");
                    tokio::time::sleep(Duration::from_millis(200)).await;
                }
                Err(e) => {
                    return Err(e.context(format!(
                        "churn on {}/{name} in {namespace}",
                        kinds[k].resource.plural
                    )));
                }
            }
        }
        changes.fetch_add(1, Ordering::SeqCst);
        tokio::time::sleep(Duration::from_millis(rng.random_range(20..120))).await;
    }
    Ok(())
}

/// Deletes `name` (`delete`), or changes it, or creates it when it does not exist.
async fn change(
    api: &Api<DynamicObject>,
    resource: &ApiResource,
    name: &str,
    value: &str,
    delete: bool,
) -> anyhow::Result<()> {
    let exists = api.get_opt(name).await?.is_some();
    match (exists, delete) {
        (true, true) => match api.delete(name, &DeleteParams::default()).await {
            // Deleted by an attempt whose answer was lost.
            Err(kube::Error::Api(e)) if e.code == 404 => {}
            other => {
                other?;
            }
        },
        (true, false) => {
            let change = match resource.kind.as_str() {
                "ConfigMap" => json!({ "data": { "v": value } }),
                "Secret" => json!({ "stringData": { "v": value } }),
                _ => json!({ "metadata": { "labels": { "v": value } } }),
            };
            api.patch(name, &PatchParams::default(), &Patch::Merge(change))
                .await?;
        }
        (false, _) => {
            let mut object = json!({
                "apiVersion": resource.api_version,
                "kind": resource.kind,
                "metadata": { "name": name },
            });
            match resource.kind.as_str() {
                "ConfigMap" => object["data"] = json!({ "v": value }),
                "Secret" => object["stringData"] = json!({ "v": value }),
                _ => {
                    object["metadata"]["labels"] = json!({ "v": value });
                    object["template"] = json!({
                        "spec": { "containers": [{ "name": "c", "image": "nginx" }] }
                    });
                }
            }
            let object: DynamicObject = serde_json::from_value(object)?;
            match api.create(&PostParams::default(), &object).await {
                // Created by an attempt whose answer was lost.
                Err(kube::Error::Api(e)) if e.code == 409 => {}
                other => {
                    other?;
                }
            }
        }
    }
    Ok(())
}
