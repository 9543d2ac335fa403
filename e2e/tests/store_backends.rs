//! The store's conformance suite: one set of cases, generic over the backend ([`Backend`]),
//! run against the embedded store (redb in a temporary directory) and against a real
//! PostgreSQL started by the harness ([`PostgresServer`]). Then what only PostgreSQL has:
//! versioned migrations, fencing, a batch PostgreSQL refuses halfway, and PostgreSQL
//! restarting under the store.

// Test code: a failed set-up should panic.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::{
    path::PathBuf,
    sync::{Arc, Mutex},
    time::Duration,
};

use scale_agent_e2e::{fixtures, postgres::PostgresServer};
use scale_agent_hub::{
    agent_tokens::{AgentTokenKind, AgentTokenRecord, EnrolledIdentity},
    cache::{CachedObject, KindInfo},
    registry::{AccountBinding, AccountRecord, ClusterRecord},
    store::{Fencing, PostgresOptions, Store, StoreOp},
    tokens::TokenRecord,
};
use serde_json::json;

// ---------------------------------------------------------------------------------------
// The backends

/// A backend under test: opens a store on the same data again and again (a hub restarting).
trait Backend {
    async fn open(&self) -> anyhow::Result<Store>;
}

/// redb in a directory removed at the end.
struct Embedded(PathBuf);

impl Embedded {
    fn new(name: &str) -> anyhow::Result<Self> {
        Ok(Embedded(fixtures::temp_dir(&format!(
            "scale-agent-store-{name}"
        ))?))
    }
}

impl Drop for Embedded {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

impl Backend for Embedded {
    async fn open(&self) -> anyhow::Result<Store> {
        Ok(Store::open(&self.0)?)
    }
}

/// A PostgreSQL server of its own (killed and removed when dropped).
struct Postgres(PostgresServer);

impl Postgres {
    async fn new() -> anyhow::Result<Self> {
        Ok(Postgres(PostgresServer::start().await?))
    }

    fn options(&self) -> PostgresOptions {
        PostgresOptions::new(self.0.url())
    }

    /// A client for assertions in SQL.
    async fn sql(&self) -> anyhow::Result<tokio_postgres::Client> {
        Ok(self.0.connect().await?)
    }
}

impl Backend for Postgres {
    async fn open(&self) -> anyhow::Result<Store> {
        Ok(Store::open_postgres(&self.options()).await?)
    }
}

/// Runs each case against both backends: `embedded::<case>` and `postgres::<case>`.
macro_rules! conformance {
    ($($case:ident),* $(,)?) => {
        mod embedded {
            $(
                #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
                async fn $case() -> anyhow::Result<()> {
                    super::$case(&super::Embedded::new(stringify!($case))?).await
                }
            )*
        }
        mod postgres {
            $(
                #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
                async fn $case() -> anyhow::Result<()> {
                    super::$case(&super::Postgres::new().await?).await
                }
            )*
        }
    };
}

conformance!(
    everything_round_trips,
    deletes_remove_what_they_name,
    an_abandoned_commit_leaves_all_or_nothing,
    operation_records_round_trip_and_expire,
);

// ---------------------------------------------------------------------------------------
// What the store keeps

fn record(host: &str) -> AccountRecord {
    AccountRecord {
        cluster: ClusterRecord {
            api_server_host: host.into(),
            ca_fingerprint: "ab01".into(),
            kubernetes_version: "v1.37.1".into(),
        },
        namespaces: vec!["web".into()],
        properties: json!({"environment": "prod"}),
    }
}

fn configmaps() -> KindInfo {
    KindInfo {
        group: String::new(),
        version: "v1".into(),
        kind: "ConfigMap".into(),
        plural: "configmaps".into(),
        namespaced: true,
    }
}

fn deployments() -> KindInfo {
    KindInfo {
        group: "apps".into(),
        version: "v1".into(),
        kind: "Deployment".into(),
        plural: "deployments".into(),
        namespaced: true,
    }
}

fn object(name: &str, rv: &str) -> CachedObject {
    let json = json!({
        "apiVersion": "v1", "kind": "ConfigMap",
        "metadata": {"name": name, "namespace": "web", "uid": format!("uid-{name}"),
                     "resourceVersion": rv},
        // A newline and non-ASCII text inside the JSON: the stored form must keep both.
        "data": {"text": "line one\nline two ✓"},
    });
    CachedObject {
        namespace: "web".into(),
        name: name.into(),
        uid: format!("uid-{name}"),
        resource_version: rv.into(),
        json: serde_json::to_vec(&json).unwrap().into(),
        truncated: name.ends_with("-big"),
    }
}

fn token(id: &str) -> TokenRecord {
    TokenRecord {
        id: id.into(),
        account: "prod".into(),
        name: "alice".into(),
        sha256: "00ff".into(),
        created: 5,
        generation: Some(2),
        role: None,
        revoked: false,
        expires: None,
        accounts: Vec::new(),
    }
}

fn agent_token(id: &str) -> AgentTokenRecord {
    AgentTokenRecord {
        id: id.into(),
        kind: AgentTokenKind::Enrolment,
        identity: "agent-a".into(),
        accounts: "prod-*".into(),
        sha256: "aa".into(),
        created: 1,
        expires: 2,
        used: Some(3),
    }
}

fn dynamic_account(name: &str) -> scale_agent_hub::dynamic_accounts::DynamicAccountRecord {
    serde_json::from_value(json!({
        "spec": {"name": name, "agent": "agent-a",
                 "kubeconfigSecret": {"name": "kc", "key": "config"}},
        "created": 10,
        "updated": 11,
    }))
    .unwrap()
}

/// Puts one of everything the store keeps, for accounts `prod` and `dev`.
fn one_of_everything() -> Vec<StoreOp> {
    let mut ops = Vec::new();
    for account in ["prod", "dev"] {
        ops.push(StoreOp::PutAccount {
            account: account.into(),
            record: record(&format!("https://{account}:6443")),
        });
        for info in [configmaps(), deployments()] {
            ops.push(StoreOp::PutKind {
                account: account.into(),
                info: info.clone(),
            });
            for watch_namespace in ["", "web"] {
                ops.push(StoreOp::PutResume {
                    account: account.into(),
                    kind: info.key(),
                    watch_namespace: watch_namespace.into(),
                    resource_version: "41".into(),
                });
            }
        }
        for name in ["a", "b", "c-big"] {
            ops.push(StoreOp::PutObject {
                account: account.into(),
                kind: configmaps().key(),
                object: Arc::new(object(name, "40")),
            });
        }
        ops.push(StoreOp::PutBinding {
            account: account.into(),
            binding: AccountBinding {
                identity: "agent-a".into(),
                since: 7,
            },
        });
        ops.push(StoreOp::PutRegistration {
            account: account.into(),
            body_hash: format!("hash-{account}"),
        });
    }
    ops.extend([
        StoreOp::PutToken {
            record: token("t1"),
        },
        StoreOp::PutMeta {
            key: "derivation-key".into(),
            value: "k3y".into(),
        },
        StoreOp::PutAgentToken {
            record: agent_token("at1"),
        },
        StoreOp::PutEnrolledIdentity {
            record: EnrolledIdentity {
                identity: "agent-a".into(),
                accounts: "prod-*".into(),
                enrolled: 9,
                token_id: "at1".into(),
            },
        },
        StoreOp::PutDynamicAccount {
            record: dynamic_account("dyn"),
        },
    ]);
    ops
}

// ---------------------------------------------------------------------------------------
// The cases every backend passes

/// Everything the store keeps comes back after a reopen, the same.
async fn everything_round_trips(backend: &impl Backend) -> anyhow::Result<()> {
    let mut store = backend.open().await?;
    store.commit(one_of_everything()).await?;
    // A later object version replaces the first; a resume point moves on.
    store
        .commit(vec![
            StoreOp::PutObject {
                account: "prod".into(),
                kind: configmaps().key(),
                object: Arc::new(object("a", "45")),
            },
            StoreOp::PutResume {
                account: "prod".into(),
                kind: configmaps().key(),
                watch_namespace: "web".into(),
                resource_version: "45".into(),
            },
        ])
        .await?;
    store.close().await?;

    let store = backend.open().await?;
    let loaded = store.load().await?;
    let mut accounts = loaded.accounts.clone();
    accounts.sort_by(|a, b| a.0.cmp(&b.0));
    assert_eq!(
        accounts,
        vec![
            ("dev".to_string(), record("https://dev:6443")),
            ("prod".to_string(), record("https://prod:6443")),
        ]
    );
    assert_eq!(loaded.tokens, vec![token("t1")]);
    assert_eq!(loaded.meta["derivation-key"], "k3y");
    assert_eq!(loaded.registrations["prod"], "hash-prod");
    assert_eq!(loaded.agent_tokens, vec![agent_token("at1")]);
    assert_eq!(loaded.enrolled.len(), 1);
    assert_eq!(loaded.enrolled[0].token_id, "at1");
    let mut bindings = loaded.bindings.clone();
    bindings.sort_by(|a, b| a.0.cmp(&b.0));
    assert_eq!(bindings.len(), 2);
    assert_eq!(bindings[1].1.identity, "agent-a");
    assert_eq!(
        loaded.dynamic_accounts,
        vec![("dyn".to_string(), dynamic_account("dyn"))]
    );

    let prod = store.load_account("prod").await?;
    assert_eq!(prod.record, Some(record("https://prod:6443")));
    assert_eq!(prod.cache.kinds.len(), 2);
    let cms = &prod.cache.kinds[&configmaps().key()];
    assert_eq!(cms.info, configmaps());
    assert_eq!(cms.objects.len(), 3);
    assert_eq!(*cms.objects["uid-a"], object("a", "45"));
    assert_eq!(*cms.objects["uid-c-big"], object("c-big", "40"));
    assert_eq!(
        cms.objects["uid-b"].json.unpack().unwrap(),
        object("b", "40").json.unpack().unwrap()
    );
    assert_eq!(cms.resume["web"], "45");
    assert_eq!(cms.resume[""], "41");
    let deploys = &prod.cache.kinds[&deployments().key()];
    assert!(deploys.objects.is_empty());
    assert_eq!(deploys.resume.len(), 2);
    let missing = store.load_account("nobody").await?;
    assert!(missing.record.is_none() && missing.cache.kinds.is_empty());
    Ok(())
}

/// Deleting an account removes its kinds, objects and resume points, and only its; single
/// deletes remove one row each.
async fn deletes_remove_what_they_name(backend: &impl Backend) -> anyhow::Result<()> {
    let mut store = backend.open().await?;
    store.commit(one_of_everything()).await?;
    store
        .commit(vec![
            StoreOp::DeleteAccount {
                account: "dev".into(),
            },
            StoreOp::DeleteObject {
                account: "prod".into(),
                kind: configmaps().key(),
                uid: "uid-b".into(),
            },
            StoreOp::DeleteResume {
                account: "prod".into(),
                kind: configmaps().key(),
                watch_namespace: "web".into(),
            },
            StoreOp::DeleteToken { id: "t1".into() },
            StoreOp::DeleteRegistration {
                account: "prod".into(),
            },
            StoreOp::DeleteAgentToken { id: "at1".into() },
            StoreOp::DeleteDynamicAccount {
                account: "dyn".into(),
            },
        ])
        .await?;
    store.close().await?;

    let store = backend.open().await?;
    let loaded = store.load().await?;
    let names: Vec<&str> = loaded.accounts.iter().map(|(a, _)| a.as_str()).collect();
    assert_eq!(names, ["prod"]);
    assert!(loaded.tokens.is_empty());
    assert!(loaded.agent_tokens.is_empty());
    assert!(loaded.dynamic_accounts.is_empty());
    assert_eq!(
        loaded.registrations.keys().collect::<Vec<_>>(),
        ["dev"],
        "a registration is Clouddriver's, kept until unregistered"
    );
    assert_eq!(loaded.bindings.len(), 2, "bindings outlive the account");
    let dev = store.load_account("dev").await?;
    assert!(dev.record.is_none());
    assert!(dev.cache.kinds.is_empty(), "{:?}", dev.cache.kinds.keys());
    let prod = store.load_account("prod").await?;
    let cms = &prod.cache.kinds[&configmaps().key()];
    assert_eq!(
        cms.objects.keys().collect::<Vec<_>>(),
        ["uid-a", "uid-c-big"]
    );
    assert_eq!(cms.resume.keys().collect::<Vec<_>>(), [""]);
    drop(prod);

    // The account comes back with the same kinds: nothing of its old cache comes with it.
    let mut store = store;
    store
        .commit(vec![
            StoreOp::PutAccount {
                account: "dev".into(),
                record: record("https://dev:6443"),
            },
            StoreOp::PutKind {
                account: "dev".into(),
                info: configmaps(),
            },
        ])
        .await?;
    let dev = store.load_account("dev").await?;
    let cms = &dev.cache.kinds[&configmaps().key()];
    assert!(cms.objects.is_empty(), "{:?}", cms.objects.keys());
    assert!(cms.resume.is_empty(), "{:?}", cms.resume);
    Ok(())
}

/// A commit whose caller goes away while it is written (the hub's maintenance task aborted
/// at shutdown) leaves the whole batch or none of it.
async fn an_abandoned_commit_leaves_all_or_nothing(backend: &impl Backend) -> anyhow::Result<()> {
    const OBJECTS: usize = 20_000;
    let mut store = backend.open().await?;
    store
        .commit(vec![
            StoreOp::PutAccount {
                account: "big".into(),
                record: record("https://big:6443"),
            },
            StoreOp::PutKind {
                account: "big".into(),
                info: configmaps(),
            },
        ])
        .await?;
    let ops: Vec<StoreOp> = (0..OBJECTS)
        .map(|i| StoreOp::PutObject {
            account: "big".into(),
            kind: configmaps().key(),
            object: Arc::new(object(&format!("cm-{i:05}"), "3")),
        })
        .collect();
    let abandoned = tokio::time::timeout(Duration::from_millis(30), store.commit(ops)).await;
    assert!(
        abandoned.is_err(),
        "the write finished at once: make it larger"
    );
    store.close().await?;

    let store = backend.open().await?;
    let big = store.load_account("big").await?;
    let count = big.cache.kinds[&configmaps().key()].objects.len();
    assert!(
        count == 0 || count == OBJECTS,
        "{count} of {OBJECTS} objects of one batch were written"
    );
    Ok(())
}

/// Operation records: written, replaced, removed, swept when expired, and read back by
/// `account\0submitter\0id`; the same id of another submitter is another record (F18).
async fn operation_records_round_trip_and_expire(backend: &impl Backend) -> anyhow::Result<()> {
    let store = backend.open().await?;
    let records = store.operation_records().expect("an open store");
    for (key, value) in [
        ("prod\0api:ci\0op-1", "old"),
        ("prod\0api:ci\0op-2", "keep"),
        ("prod\0api:other\0op-1", "other's"),
        ("dev\0api:ci\0op-1", "expired"),
        ("prod\0api:ci\0op-1", "new"),
        ("dev\0api:ci\0op-3", "gone"),
    ] {
        records
            .clone()
            .write(key.into(), Some(value.as_bytes().to_vec()), None)
            .await?;
    }
    records
        .clone()
        .write("dev\0api:ci\0op-3".into(), None, None)
        .await?;
    // Another submitter's op-2 is free to claim.
    let fresh = records
        .clone()
        .claim("prod\0api:third\0op-2".into(), b"third's".to_vec())
        .await?;
    assert_eq!(fresh, None);
    // A write that sweeps removes what the check calls expired, its own row included if so.
    records
        .write(
            "prod\0api:ci\0op-4".into(),
            Some(b"fresh".to_vec()),
            Some(Box::new(|bytes: &[u8]| bytes == b"expired")),
        )
        .await?;
    let mut rows = store.load_operation_records().await?;
    rows.sort();
    let rows: Vec<(String, String)> = rows
        .into_iter()
        .map(|(k, v)| (k, String::from_utf8(v).unwrap()))
        .collect();
    let expected: Vec<(String, String)> = [
        ("prod\0api:ci\0op-1", "new"),
        ("prod\0api:ci\0op-2", "keep"),
        ("prod\0api:ci\0op-4", "fresh"),
        ("prod\0api:other\0op-1", "other's"),
        ("prod\0api:third\0op-2", "third's"),
    ]
    .iter()
    .map(|(k, v)| (k.to_string(), v.to_string()))
    .collect();
    assert_eq!(rows, expected);
    Ok(())
}

// ---------------------------------------------------------------------------------------
// PostgreSQL only: in its own file

#[path = "store_backends/postgres_only.rs"]
mod postgres_only;
