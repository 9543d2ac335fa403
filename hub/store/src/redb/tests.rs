use super::*;
use scale_agent_hub_cache::CachedObject;
use scale_agent_hub_model::records::ClusterRecord;

fn record() -> AccountRecord {
    AccountRecord {
        cluster: ClusterRecord {
            api_server_host: "https://10.0.0.1:443".into(),
            ca_fingerprint: "ab".into(),
            kubernetes_version: "v1.37.1".into(),
        },
        namespaces: vec![],
        properties: serde_json::Value::Null,
    }
}

fn config_maps() -> KindInfo {
    KindInfo {
        group: String::new(),
        version: "v1".into(),
        kind: "ConfigMap".into(),
        plural: "configmaps".into(),
        namespaced: true,
    }
}

/// A store much larger than its page cache: commits read and write the pages the cache
/// let go of, and a reopen loads every object (the packed JSON with what selectors read).
#[tokio::test]
async fn a_store_larger_than_its_page_cache() {
    let dir = std::env::temp_dir().join(format!("hub-store-small-cache-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    let info = config_maps();
    let object = |i: usize, rv: usize| CachedObject {
        namespace: "default".into(),
        name: format!("cm-{i}"),
        uid: format!("{:08x}-uid", i.wrapping_mul(2_654_435_761) % 1_000_003),
        resource_version: rv.to_string(),
        json: format!(
            r#"{{"metadata":{{"name":"cm-{i}","labels":{{"n":"{i}"}}}},"data":{{"v":"{}"}}}}"#,
            "x".repeat(i % 900)
        )
        .into_bytes()
        .into(),
        truncated: false,
    };
    let put = |o: CachedObject| StoreOp::PutObject {
        account: "acc".into(),
        kind: info.key(),
        object: Arc::new(o),
    };
    {
        let mut store = RedbStore::open_with_cache(&dir, 64 * 1024).unwrap();
        store
            .commit(vec![
                StoreOp::PutAccount {
                    account: "acc".into(),
                    record: record(),
                },
                StoreOp::PutKind {
                    account: "acc".into(),
                    info: info.clone(),
                },
            ])
            .await
            .unwrap();
        store
            .commit((0..3000).map(|i| put(object(i, 1))).collect())
            .await
            .unwrap();
        // Changes spread over the whole tree, in several commits.
        for round in 0..3 {
            let ops = (0..3000)
                .filter(|i| i % 7 == round)
                .map(|i| put(object(i, 2 + round)))
                .collect();
            store.commit(ops).await.unwrap();
        }
        store.close().await.unwrap();
    }
    let loaded = RedbStore::open_with_cache(&dir, 64 * 1024)
        .unwrap()
        .load()
        .unwrap();
    let kind = &loaded.cache.accounts["acc"].kinds[&info.key()];
    assert_eq!(kind.objects.len(), 3000);
    for i in [0, 1, 2, 3, 7, 1500, 2999] {
        let want = object(i, if i % 7 < 3 { 2 + i % 7 } else { 1 });
        assert_eq!(*kind.objects[&want.uid], want, "object {i}");
        let kept = kind.objects[&want.uid].json.selectable().unwrap();
        assert_eq!(kept.label("n"), Some(i.to_string().as_str()));
    }
    let _ = std::fs::remove_dir_all(&dir);
}

/// A durable commit lets go of the non-durable commits' changes it made durable, their
/// vector's allocation included. A cleared vector kept it: after a snapshot's commit
/// that was one `StoreOp` per object for the hub's life (bench measure 5's hub RSS per
/// object fell on two levels, about 3 MiB apart at 10,000 objects, by whether the
/// snapshot's commit happened to be durable).
#[tokio::test]
async fn a_durable_commit_releases_the_changes_it_made_durable() {
    let dir = std::env::temp_dir().join(format!("hub-store-unsynced-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    let info = config_maps();
    let put = |i: usize| StoreOp::PutObject {
        account: "acc".into(),
        kind: info.key(),
        object: Arc::new(CachedObject {
            namespace: "default".into(),
            name: format!("cm-{i}"),
            uid: format!("uid-{i}"),
            resource_version: "1".into(),
            json: br#"{"a":"b"}"#.to_vec().into(),
            truncated: false,
        }),
    };
    let mut store = RedbStore::open_with_cache(&dir, 64 * 1024).unwrap();
    let mut ops = vec![StoreOp::PutKind {
        account: "acc".into(),
        info: info.clone(),
    }];
    ops.extend((0..1000).map(put));
    // Non-durable: the last durable commit is recent.
    store.last_durable = Instant::now();
    store.commit(ops).await.unwrap();
    assert_eq!(store.unsynced.len(), 1001, "kept until a durable commit");
    store.flush().await.unwrap();
    assert_eq!(
        (store.unsynced.len(), store.unsynced.capacity()),
        (0, 0),
        "the durable commit keeps neither the changes nor their allocation"
    );
    store.close().await.unwrap();
    let _ = std::fs::remove_dir_all(&dir);
}

#[tokio::test]
async fn round_trip_and_delete_account() {
    let dir = std::env::temp_dir().join(format!("hub-store-test-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    let info = config_maps();
    let object = CachedObject {
        namespace: "default".into(),
        name: "cm".into(),
        uid: "u1".into(),
        resource_version: "7".into(),
        json: br#"{"a":"b\nc"}"#.to_vec().into(),
        truncated: false,
    };
    let mut ops = vec![];
    for account in ["acc", "acc2"] {
        ops.push(StoreOp::PutAccount {
            account: account.into(),
            record: record(),
        });
        ops.push(StoreOp::PutKind {
            account: account.into(),
            info: info.clone(),
        });
        ops.push(StoreOp::PutObject {
            account: account.into(),
            kind: info.key(),
            object: Arc::new(object.clone()),
        });
        ops.push(StoreOp::PutResume {
            account: account.into(),
            kind: info.key(),
            watch_namespace: "default".into(),
            resource_version: "9".into(),
        });
    }
    {
        let mut store = RedbStore::open(&dir).unwrap();
        store.commit(ops).await.unwrap();
        store
            .commit(vec![StoreOp::DeleteAccount {
                account: "acc2".into(),
            }])
            .await
            .unwrap();
        store.close().await.unwrap();
        assert!(!store.is_open());
    }
    let store = RedbStore::open(&dir).unwrap();
    let loaded = store.load().unwrap();
    assert_eq!(loaded.accounts.len(), 1);
    assert_eq!(loaded.accounts[0].0, "acc");
    assert_eq!(loaded.accounts[0].1, record());
    let kind = &loaded.cache.accounts["acc"].kinds[&info.key()];
    assert_eq!(*kind.objects["u1"], object);
    assert_eq!(kind.resume["default"], "9");
    assert!(!loaded.cache.accounts.contains_key("acc2"));
    drop(store);
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn objects_of_a_store_written_before_packing_load() {
    let old = b"{\"namespace\":\"ns\",\"name\":\"cm\",\"uid\":\"u1\",\"rv\":\"7\",\"truncated\":false}\n{\"a\":\"b\\nc\"}";
    let object = decode_object("k", old).unwrap();
    assert_eq!(object.json.unpack().unwrap(), br#"{"a":"b\nc"}"#);
    assert_eq!(object.resource_version, "7");
    let again = decode_object("k", &encode_object(&object)).unwrap();
    assert_eq!(again, object);
    let mut corrupt = encode_object(&object);
    corrupt.pop();
    assert!(decode_object("k", &corrupt).is_err());
}

#[tokio::test]
async fn tokens_meta_and_registrations_survive_a_reopen() {
    let dir = std::env::temp_dir().join(format!("hub-store-tokens-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    let token = |id: &str| TokenRecord {
        id: id.into(),
        account: "prod".into(),
        name: "alice".into(),
        sha256: "00ff".into(),
        created: 5,
        generation: None,
        role: None,
        revoked: false,
        expires: None,
        accounts: Vec::new(),
    };
    {
        let mut store = RedbStore::open(&dir).unwrap();
        store
            .commit(vec![
                StoreOp::PutToken {
                    record: token("t1"),
                },
                StoreOp::PutToken {
                    record: token("t2"),
                },
                StoreOp::DeleteToken { id: "t1".into() },
                StoreOp::PutMeta {
                    key: "k".into(),
                    value: "v".into(),
                },
                StoreOp::PutRegistration {
                    account: "prod".into(),
                    body_hash: "h1".into(),
                },
                StoreOp::PutRegistration {
                    account: "gone".into(),
                    body_hash: "h2".into(),
                },
                StoreOp::DeleteRegistration {
                    account: "gone".into(),
                },
            ])
            .await
            .unwrap();
        // Token ops are committed durably at once: nothing is left dirty to flush.
        assert!(!store.dirty);
        store.close().await.unwrap();
    }
    let loaded = RedbStore::open(&dir).unwrap().load().unwrap();
    assert_eq!(loaded.tokens, vec![token("t2")]);
    assert_eq!(loaded.meta.get("k").map(String::as_str), Some("v"));
    assert_eq!(
        loaded.registrations.into_iter().collect::<Vec<_>>(),
        vec![("prod".to_string(), "h1".to_string())]
    );
    let _ = std::fs::remove_dir_all(&dir);
}
