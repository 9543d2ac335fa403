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
pub mod unknown;

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
    /// How long the previous replica secret stays valid after the file changes
    /// ([`owners::secret::ROTATION_OVERLAP`]).
    pub secret_overlap: Duration,
    /// How often the small tables are read again, the replica says it is alive and the
    /// orphans are swept (`--replica-sync-period`).
    pub sync_period: Duration,
    /// How long an account may have no owner before it is swept out of the shared store
    /// (`--grace-period`).
    pub grace_period: Duration,
    /// Whether this replica's HTTP listener serves TLS: then it forwards only to https://.
    pub serves_tls: bool,
    /// `--replica-peer-cidrs`: the only hosts it forwards to, when given.
    pub peer_cidrs: Vec<scale_agent_hub_auth::forwarded::Cidr>,
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
    /// What this replica was started with (the sync period and grace period are read by
    /// [`sync`]).
    pub settings: ReplicaSettings,
    /// The owners of accounts it forwarded to, kept a short while ([`owners::lookup`]).
    pub owner_lookups: owners::lookup::OwnerLookups,
    /// Bounds the store lookups of credentials nobody knows ([`unknown`]).
    pub unknown: unknown::UnknownCredentials,
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
                Arc::new(owners::secret::RotatingSecret::new(
                    secret,
                    settings.secret_overlap,
                )),
                &replica.id,
                serving_ca_pem,
                settings.server_name.as_deref(),
                owners::peers::PeerRule::new(
                    &replica.address,
                    settings.serves_tls,
                    settings.peer_cidrs.clone(),
                )?,
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
            owner_lookups: owners::lookup::OwnerLookups::default(),
            unknown: unknown::UnknownCredentials::default(),
        })
    }

    /// This replica's name among the hub's replicas (`--replica-id`).
    pub fn id(&self) -> &str {
        &self.replica.id
    }
}

#[cfg(test)]
mod tests {
    use std::path::PathBuf;

    use scale_agent_hub_state::{
        Live, StreamMetrics, dynamic_accounts::DynamicAccounts, registry::Registry,
        session::HubState,
    };

    use super::*;
    use crate::owners::{
        Claim,
        directory::Directory,
        forward::{Forwarded, ReplicaSecret},
    };

    fn settings(id: &str) -> ReplicaSettings {
        ReplicaSettings {
            id: id.to_string(),
            address: Some(format!("http://{id}.example:8443")),
            server_name: None,
            secret: Some(ReplicaSecret::new("0123456789abcdef0123456789abcdef").unwrap()),
            secret_overlap: crate::owners::secret::ROTATION_OVERLAP,
            sync_period: Duration::from_secs(2),
            grace_period: Duration::from_secs(600),
            // No TLS in these tests: nothing is forwarded for real.
            serves_tls: false,
            peer_cidrs: Vec::new(),
        }
    }

    fn data_dir(name: &str) -> PathBuf {
        let dir = std::env::temp_dir().join(format!("hub-replicas-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        dir
    }

    /// The live state of a replica that shares its accounts and owns none of them yet.
    fn sharing_live() -> Live {
        Live::new(
            HubState {
                registry: Registry::shared(),
                cache: Default::default(),
            },
            DynamicAccounts::default(),
            StreamMetrics::default(),
            false,
        )
    }

    #[tokio::test]
    async fn one_replica_owns_everything_and_forwards_nothing() {
        let dir = data_dir("embedded");
        let mut store = Store::open(&dir).unwrap();
        let replicas = Replicas::open(settings("a"), &OwnershipSource::Embedded, None, &mut store)
            .await
            .unwrap();
        assert!(replicas.ownership.owns_everything());
        assert!(replicas.forwarder.is_none(), "nobody to forward to");
        assert!(
            replicas.shared.is_none(),
            "the embedded store is read at start-up only"
        );
        assert_eq!(replicas.id(), "a");
        assert_eq!(replicas.replica.address, "http://a.example:8443");
        let live = sharing_live();
        assert_eq!(
            replicas
                .owner_elsewhere(&live, "prod", &http::Extensions::new())
                .await,
            None
        );
        store.close().await.unwrap();
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[tokio::test]
    async fn a_request_goes_to_the_owner_elsewhere_once() {
        let directory = Directory::new();
        let source = OwnershipSource::Directory(directory);
        let (dir_a, dir_b) = (data_dir("a"), data_dir("b"));
        let (mut store_a, mut store_b) =
            (Store::open(&dir_a).unwrap(), Store::open(&dir_b).unwrap());
        let a = Replicas::open(settings("a"), &source, None, &mut store_a)
            .await
            .unwrap();
        let b = Replicas::open(settings("b"), &source, None, &mut store_b)
            .await
            .unwrap();
        assert!(!a.ownership.owns_everything());
        assert!(a.forwarder.is_some() && b.forwarder.is_some());
        assert!(matches!(
            b.ownership.try_acquire("prod").await.unwrap(),
            Claim::Acquired { .. }
        ));

        let live = sharing_live();
        let none = http::Extensions::new();
        let owner = a.owner_elsewhere(&live, "prod", &none).await.unwrap();
        assert_eq!(
            (owner.replica.as_str(), owner.address.as_str()),
            ("b", "http://b.example:8443")
        );
        // Forwarded once already: served where it arrived, never sent on.
        let mut forwarded = http::Extensions::new();
        forwarded.insert(Forwarded { from: "b".into() });
        assert_eq!(a.owner_elsewhere(&live, "prod", &forwarded).await, None);
        // Nobody owns it, or this replica does: served here.
        assert_eq!(a.owner_elsewhere(&live, "staging", &none).await, None);
        assert_eq!(b.owner_elsewhere(&live, "prod", &none).await, None);

        for (mut store, dir) in [(store_a, dir_a), (store_b, dir_b)] {
            store.close().await.unwrap();
            std::fs::remove_dir_all(&dir).unwrap();
        }
    }
}
