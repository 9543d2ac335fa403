//! `scale-agent-hub-replicas` (layer 3): the hub as several replicas sharing one store, and
//! nothing else. Which replica owns each account and the task that acquires and releases
//! them ([`owners`], [`owners::duty`]); requests for an account sent to its owner over the
//! replicas' internal channel ([`owners::forward`]); duties one replica carries at a time
//! ([`owners::singleton`]); and what replicas keep in step through the shared store
//! ([`sync`]: credentials, bindings and dynamic accounts read again, unknown credentials
//! looked up, liveness, the orphan sweep).
//!
//! [`Replicas`] is what this replica knows of the others, as one handle: which accounts it
//! owns ([`owners::Ownership`]), who it is to the others ([`owners::ReplicaIdentity`]), how
//! it reaches an account's owner ([`owners::forward::Forwarder`]) and the shared store's reads
//! ([`sync`]), with the settings these read ([`ReplicaSettings`]). Whatever forwards, keeps
//! replicas in step or asks who owns an account takes this handle (and the live state, the
//! credentials or the commit queue where it needs them) rather than the whole hub.
//!
//! It depends on the model, net, state, auth and store crates, and on no crate above them:
//! the live state ([`scale_agent_hub_state::Live`]), the credentials
//! ([`scale_agent_hub_auth::AuthBook`]), the commit queue, the store's lock and the shutdown
//! signal are parameters of the functions that use them.

pub mod owners;
pub mod sync;

use std::{sync::Arc, time::Duration};

use scale_agent_hub_model::Result;
use scale_agent_hub_store::{Fencing, SharedStore, Store};

use crate::owners::{Ownership, OwnershipSource, ReplicaIdentity, forward};

/// How this replica takes part among the hub's replicas (from `--replica-id`,
/// `--replica-address`, `--replica-server-name`, `--replica-secret-file`,
/// `--replica-sync-period` and `--grace-period`).
#[derive(Clone, Debug)]
pub struct ReplicaSettings {
    /// This replica's name among the hub's replicas (`--replica-id`).
    pub id: String,
    /// The base URL other replicas reach this one's HTTP listener at (`--replica-address`);
    /// `None` with the embedded store, where nobody forwards.
    pub address: Option<String>,
    /// The name other replicas' serving certificates are verified for
    /// (`--replica-server-name`); `None`: the host of each one's address.
    pub server_name: Option<String>,
    /// The secret replicas present to each other's internal routes
    /// (`--replica-secret-file`); with none, nothing is forwarded.
    pub secret: Option<forward::ReplicaSecret>,
    /// How often the small tables are read again, the replica says it is alive and the
    /// orphans are swept (`--replica-sync-period`).
    pub sync_period: Duration,
    /// How long an account may have no owner before it is swept out of the shared store
    /// (`--grace-period`).
    pub grace_period: Duration,
}

/// What this replica knows of the others.
pub struct Replicas {
    /// Which accounts this replica owns ([`owners`]).
    pub ownership: Arc<dyn Ownership>,
    /// Who this replica is to the others.
    pub replica: ReplicaIdentity,
    /// Sends requests to the owners of accounts; `None` with one replica.
    pub forwarder: Option<forward::Forwarder>,
    /// The shared store's reads ([`sync`]); `None` with one replica (the embedded
    /// store), which reads its store at start-up only.
    pub shared: Option<SharedStore>,
    pub settings: ReplicaSettings,
}

impl Replicas {
    /// Opens the ownership `source` names. When replicas share the accounts, every write of
    /// an account's data to `store` commits only while this replica owns the account
    /// (fencing), requests go to an account's owner (with a secret: a client trusting the
    /// public roots and `serving_ca_pem`, the replicas' serving certificates being the hub's
    /// own), and the shared store's reads are kept.
    pub async fn open(
        settings: ReplicaSettings,
        source: &OwnershipSource,
        serving_ca_pem: Option<&[u8]>,
        store: &mut Store,
    ) -> Result<Self> {
        let replica = ReplicaIdentity {
            id: settings.id.clone(),
            address: settings.address.clone().unwrap_or_default(),
        };
        let ownership = owners::open(source, &replica).await?;
        let forwarder = match (&settings.secret, ownership.owns_everything()) {
            (Some(secret), false) => Some(forward::Forwarder::new(
                secret.clone(),
                &replica.id,
                serving_ca_pem,
                settings.server_name.as_deref(),
            )?),
            _ => None,
        };
        if !ownership.owns_everything() {
            // Every write of an account's data commits only while this replica owns it.
            let held = ownership.clone();
            store.set_fencing(Some(Fencing {
                replica: replica.id.clone(),
                epoch: Arc::new(move |account| held.held_epoch(account)),
            }));
        }
        // Replicas sharing the store read each other's writes ([`sync`]).
        let shared = if ownership.owns_everything() {
            None
        } else {
            store.shared()
        };
        Ok(Replicas {
            ownership,
            replica,
            forwarder,
            shared,
            settings,
        })
    }

    /// This replica's name among the hub's replicas (`--replica-id`).
    pub fn id(&self) -> &str {
        &self.replica.id
    }
}
