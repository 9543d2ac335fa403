//! ConfigMaps created, updated and deleted at random in some namespaces of real API servers
//! while a test breaks something, so that what the hub's caches missed shows: each namespace
//! churns in its own task until [`Churn::finish`], drawing from a few names so that updates
//! and deletes are frequent.

use std::{
    sync::{
        Arc,
        atomic::{AtomicBool, AtomicUsize, Ordering},
    },
    time::Duration,
};

use k8s_openapi::api::core::v1::ConfigMap;
use kube::{
    Api, Client,
    api::{DeleteParams, Patch, PatchParams, PostParams},
};
use rand::{Rng, SeedableRng, rngs::StdRng};
use serde_json::json;

/// Names the churn draws from (`cm-0`..): few, so it updates and deletes often.
pub const NAMES: usize = 6;

/// Churn in some namespaces, until [`Churn::finish`].
pub struct Churn {
    stop: Arc<AtomicBool>,
    changes: Arc<AtomicUsize>,
    tasks: Vec<tokio::task::JoinHandle<anyhow::Result<()>>>,
}

impl Churn {
    /// Starts churning each `(client, namespace)`, seeded from `seed` (one seed each).
    pub fn start(namespaces: impl IntoIterator<Item = (Client, String)>, seed: u64) -> Churn {
        let stop = Arc::new(AtomicBool::new(false));
        let changes = Arc::new(AtomicUsize::new(0));
        let tasks = namespaces
            .into_iter()
            .enumerate()
            .map(|(i, (client, namespace))| {
                tokio::spawn(churn(
                    client,
                    namespace,
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

    /// Stops it; the number of changes made (an API server's error ends its task: returned).
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
    seed: u64,
    stop: Arc<AtomicBool>,
    changes: Arc<AtomicUsize>,
) -> anyhow::Result<()> {
    let api = Api::<ConfigMap>::namespaced(client, &namespace);
    let mut rng = StdRng::seed_from_u64(seed);
    while !stop.load(Ordering::SeqCst) {
        let name = format!("cm-{}", rng.random_range(0..NAMES));
        let value = rng.random_range(0..1_000_000u32).to_string();
        let exists = api.get_opt(&name).await?.is_some();
        match (exists, rng.random_bool(0.3)) {
            (true, true) => {
                api.delete(&name, &DeleteParams::default()).await?;
            }
            (true, false) => {
                let change = json!({ "data": { "v": value } });
                api.patch(&name, &PatchParams::default(), &Patch::Merge(change))
                    .await?;
            }
            (false, _) => {
                let object: ConfigMap = serde_json::from_value(json!({
                    "metadata": { "name": name },
                    "data": { "v": value },
                }))?;
                api.create(&PostParams::default(), &object).await?;
            }
        }
        changes.fetch_add(1, Ordering::SeqCst);
        tokio::time::sleep(Duration::from_millis(rng.random_range(20..120))).await;
    }
    Ok(())
}
