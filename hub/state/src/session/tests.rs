//! Tests of the stream protocol state (`super`), without a hub or a network.

#[test]
fn json_objects_are_accepted_without_being_built_and_other_json_is_not() {
    let object = |text: &str| {
        serde_json::from_slice::<super::snapshot::AnyJsonObject>(text.as_bytes()).is_ok()
    };
    assert!(object(
        r#"{"metadata":{"name":"a","labels":{"x":"y"}},"data":[1,2,{"z":null}]}"#
    ));
    assert!(object("{}"));
    for not_an_object in [
        "[]",
        "\"text\"",
        "3",
        "null",
        r#"{"a":1"#,
        r#"{"a":1} trailing"#,
    ] {
        assert!(!object(not_an_object), "{not_an_object}");
    }
}

use scale_agent_proto::v1::object_event::Type as PbType;

use super::*;

fn now() -> (Instant, SystemTime) {
    (Instant::now(), SystemTime::now())
}

fn limits() -> Limits {
    Limits {
        max_object_bytes: 1024,
        max_staged_bytes: 64 * 1024,
        max_objects_per_account: 0,
        max_accounts_per_identity: 0,
        allow: vec![AllowRule::parse("agent=prod-*").unwrap()],
    }
}

fn kind() -> pb::Kind {
    pb::Kind {
        group: String::new(),
        version: "v1".into(),
        kind: "ConfigMap".into(),
        plural: "configmaps".into(),
        namespaced: true,
    }
}

fn msg(seq: u64, kind: Msg) -> pb::AgentMessage {
    pb::AgentMessage {
        seq,
        kind: Some(kind),
    }
}

fn register(account: &str, host: &str) -> Msg {
    Msg::RegisterAccount(pb::RegisterAccount {
        account: account.into(),
        cluster: Some(pb::ClusterInfo {
            api_server_host: host.into(),
            ca_fingerprint: "aa".into(),
            kubernetes_version: "v1.37.0".into(),
        }),
        namespaces: vec![],
        properties_json: br#"{"kinds":["ConfigMap"]}"#.to_vec(),
    })
}

fn object(account: &str, name: &str, rv: &str) -> Msg {
    Msg::Object(pb::ObjectEvent {
        account: account.into(),
        kind: Some(kind()),
        r#type: PbType::Applied as i32,
        namespace: "default".into(),
        name: name.into(),
        uid: format!("uid-{name}"),
        resource_version: rv.into(),
        object_json: format!(r#"{{"metadata":{{"name":"{name}"}}}}"#).into_bytes(),
        truncated: false,
        watch_namespace: String::new(),
    })
}

fn roles(fx: &Effects) -> Vec<(String, i32, String)> {
    fx.replies
        .iter()
        .filter_map(|m| match &m.kind {
            Some(Out::Assignment(a)) => Some((a.account.clone(), a.role, a.reason.clone())),
            _ => None,
        })
        .collect()
}

fn connect(st: &mut HubState, identity: &str, replica: &str) -> Session {
    let (id, _, _) = st.registry.connect(identity, replica, "v", now());
    Session::new(id, identity.into())
}

#[test]
fn hello_must_come_first() {
    assert!(check_hello(msg(1, Msg::Hello(pb::Hello::default()))).is_ok());
    assert!(matches!(
        check_hello(msg(2, Msg::Hello(pb::Hello::default()))),
        Err(ProtocolError::InvalidArgument(_))
    ));
    let err = check_hello(msg(1, register("prod-a", "h"))).unwrap_err();
    assert!(matches!(&err, ProtocolError::FailedPrecondition(m) if m.contains("must be Hello")));
}

#[test]
fn seq_must_increase_by_one() {
    let mut st = HubState::default();
    let mut s = connect(&mut st, "agent", "r");
    let mut fx = Effects::default();
    s.handle(
        &mut st,
        &limits(),
        msg(2, Msg::Heartbeat(pb::Heartbeat::default())),
        now(),
        &mut fx,
    )
    .unwrap();
    let err = s
        .handle(
            &mut st,
            &limits(),
            msg(4, Msg::Heartbeat(pb::Heartbeat::default())),
            now(),
            &mut fx,
        )
        .unwrap_err();
    assert!(
        matches!(&err, ProtocolError::InvalidArgument(m) if m.contains("expected 3")),
        "{err:?}"
    );
}

#[test]
fn register_snapshot_and_delta() {
    let mut st = HubState::default();
    let mut s = connect(&mut st, "agent", "r");
    let mut fx = Effects::default();
    let l = limits();
    s.handle(
        &mut st,
        &l,
        msg(2, register("prod-a", "https://h")),
        now(),
        &mut fx,
    )
    .unwrap();
    s.handle(
        &mut st,
        &l,
        msg(3, register("dev", "https://h")),
        now(),
        &mut fx,
    )
    .unwrap();
    let r = roles(&fx);
    assert_eq!(r[0].1, PbRole::Streaming as i32);
    assert_eq!(r[1].1, PbRole::Rejected as i32);
    assert!(r[1].2.contains("--allow"), "{}", r[1].2);

    let begin = Msg::SnapshotBegin(pb::SnapshotBegin {
        account: "prod-a".into(),
        kind: Some(kind()),
        watch_namespace: String::new(),
    });
    s.handle(&mut st, &l, msg(4, begin), now(), &mut fx)
        .unwrap();
    s.handle(
        &mut st,
        &l,
        msg(5, object("prod-a", "one", "5")),
        now(),
        &mut fx,
    )
    .unwrap();
    // Not visible before SnapshotEnd.
    assert_eq!(st.cache.object_count(), 0);
    let end = |count| {
        Msg::SnapshotEnd(pb::SnapshotEnd {
            account: "prod-a".into(),
            kind: Some(kind()),
            resource_version: "10".into(),
            object_count: count,
            watch_namespace: String::new(),
        })
    };
    s.handle(&mut st, &l, msg(6, end(1)), now(), &mut fx)
        .unwrap();
    assert_eq!(st.cache.object_count(), 1);
    s.handle(
        &mut st,
        &l,
        msg(7, object("prod-a", "two", "11")),
        now(),
        &mut fx,
    )
    .unwrap();
    assert_eq!(st.cache.object_count(), 2);
    assert_eq!(fx.relists, 1);
    // SnapshotEnd without SnapshotBegin.
    let err = s
        .handle(&mut st, &l, msg(8, end(0)), now(), &mut fx)
        .unwrap_err();
    assert!(
        matches!(&err, ProtocolError::FailedPrecondition(m) if m.contains("without a SnapshotBegin"))
    );
}

#[test]
fn snapshot_count_mismatch_and_unregister() {
    let mut st = HubState::default();
    let l = limits();
    let mut a = connect(&mut st, "agent", "a");
    let mut b = connect(&mut st, "agent", "b");
    let mut fx = Effects::default();
    a.handle(
        &mut st,
        &l,
        msg(2, register("prod-a", "https://h")),
        now(),
        &mut fx,
    )
    .unwrap();
    b.handle(
        &mut st,
        &l,
        msg(2, register("prod-a", "https://h")),
        now(),
        &mut fx,
    )
    .unwrap();
    let begin = Msg::SnapshotBegin(pb::SnapshotBegin {
        account: "prod-a".into(),
        kind: Some(kind()),
        watch_namespace: String::new(),
    });
    a.handle(&mut st, &l, msg(3, begin), now(), &mut fx)
        .unwrap();
    assert_eq!(a.open_snapshots(), 1);
    // Unregistering drops the open snapshot and promotes the standby.
    let un = Msg::UnregisterAccount(pb::UnregisterAccount {
        account: "prod-a".into(),
    });
    a.handle(&mut st, &l, msg(4, un), now(), &mut fx).unwrap();
    assert_eq!(a.open_snapshots(), 0);
    assert_eq!(
        fx.promotions,
        vec![Promotion {
            session: b.id,
            account: "prod-a".into()
        }]
    );
    let begin = Msg::SnapshotBegin(pb::SnapshotBegin {
        account: "prod-a".into(),
        kind: Some(kind()),
        watch_namespace: String::new(),
    });
    b.handle(&mut st, &l, msg(3, begin), now(), &mut fx)
        .unwrap();
    b.handle(
        &mut st,
        &l,
        msg(4, object("prod-a", "one", "5")),
        now(),
        &mut fx,
    )
    .unwrap();
    let end = Msg::SnapshotEnd(pb::SnapshotEnd {
        account: "prod-a".into(),
        kind: Some(kind()),
        resource_version: "10".into(),
        object_count: 2,
        watch_namespace: String::new(),
    });
    let err = b
        .handle(&mut st, &l, msg(5, end), now(), &mut fx)
        .unwrap_err();
    assert!(
        matches!(&err, ProtocolError::FailedPrecondition(m) if m.contains("object_count 2 but 1")),
        "{err:?}"
    );
    assert_eq!(st.cache.object_count(), 0);
}

#[test]
fn events_for_accounts_not_streamed_are_refused() {
    let mut st = HubState::default();
    let l = limits();
    let mut a = connect(&mut st, "agent", "a");
    let mut b = connect(&mut st, "agent", "b");
    let mut fx = Effects::default();
    a.handle(
        &mut st,
        &l,
        msg(2, register("prod-a", "https://h")),
        now(),
        &mut fx,
    )
    .unwrap();
    b.handle(
        &mut st,
        &l,
        msg(2, register("prod-a", "https://h")),
        now(),
        &mut fx,
    )
    .unwrap();
    let err = b
        .handle(
            &mut st,
            &l,
            msg(3, object("prod-a", "x", "1")),
            now(),
            &mut fx,
        )
        .unwrap_err();
    assert!(
        matches!(&err, ProtocolError::FailedPrecondition(m) if m.contains("STANDBY")),
        "{err:?}"
    );
    let err = a
        .handle(
            &mut st,
            &l,
            msg(3, object("prod-b", "x", "1")),
            now(),
            &mut fx,
        )
        .unwrap_err();
    assert!(matches!(&err, ProtocolError::FailedPrecondition(m) if m.contains("did not register")));
    assert_eq!(st.cache.object_count(), 0);
}

#[test]
fn malformed_objects() {
    let mut st = HubState::default();
    let l = limits();
    let mut s = connect(&mut st, "agent", "a");
    let mut fx = Effects::default();
    s.handle(
        &mut st,
        &l,
        msg(2, register("prod-a", "https://h")),
        now(),
        &mut fx,
    )
    .unwrap();
    let Msg::Object(mut ev) = object("prod-a", "x", "1") else {
        unreachable!()
    };
    ev.object_json = b"not json".to_vec();
    let err = s
        .handle(&mut st, &l, msg(3, Msg::Object(ev.clone())), now(), &mut fx)
        .unwrap_err();
    assert!(matches!(&err, ProtocolError::InvalidArgument(m) if m.contains("not a JSON object")));
    let mut s = connect(&mut st, "agent", "a2");
    let mut fx = Effects::default();
    s.handle(
        &mut st,
        &l,
        msg(2, register("prod-b", "https://h")),
        now(),
        &mut fx,
    )
    .unwrap();
    ev.account = "prod-b".into();
    ev.object_json = vec![b' '; 2048];
    // Too large: kept as truncated, payload dropped.
    s.handle(&mut st, &l, msg(3, Msg::Object(ev)), now(), &mut fx)
        .unwrap();
    let o = st.cache.accounts["prod-b"]
        .kinds
        .values()
        .next()
        .unwrap()
        .objects["uid-x"]
        .clone();
    assert!(o.truncated && o.json.is_empty());
}

#[test]
fn open_snapshots_are_bounded_in_bytes() {
    let mut st = HubState::default();
    let mut s = connect(&mut st, "agent", "r");
    let mut fx = Effects::default();
    let l = Limits {
        max_object_bytes: 1024,
        max_staged_bytes: 2000,
        max_objects_per_account: 0,
        max_accounts_per_identity: 0,
        allow: vec![],
    };
    let mut seq = 1;
    let mut send = |s: &mut Session, st: &mut HubState, kind: Msg| {
        seq += 1;
        s.handle(st, &l, msg(seq, kind), now(), &mut fx)
    };
    send(&mut s, &mut st, register("prod-a", "https://h")).unwrap();
    let begin = |ns: &str| {
        Msg::SnapshotBegin(pb::SnapshotBegin {
            account: "prod-a".into(),
            kind: Some(kind()),
            watch_namespace: ns.into(),
        })
    };
    let big = |name: &str, ns: &str| {
        let Msg::Object(mut ev) = object("prod-a", name, "5") else {
            unreachable!()
        };
        ev.watch_namespace = ns.into();
        // Staged objects count as the hub keeps them (packed): a pad that does not compress.
        const DIGITS: &[u8] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
        let mut x = name.len() as u64 + 0x9E37_79B9_7F4A_7C15;
        let pad: String = (0..1000)
            .map(|_| {
                x ^= x << 13;
                x ^= x >> 7;
                x ^= x << 17;
                char::from(DIGITS[(x >> 58) as usize])
            })
            .collect();
        ev.object_json = format!(r#"{{"pad":"{pad}"}}"#).into_bytes();
        Msg::Object(ev)
    };
    // Two snapshots open at once share the stream's budget.
    send(&mut s, &mut st, begin("a")).unwrap();
    send(&mut s, &mut st, begin("b")).unwrap();
    send(&mut s, &mut st, big("one", "a")).unwrap();
    // The same object again replaces, not adds to, what is staged.
    send(&mut s, &mut st, big("one", "a")).unwrap();
    send(&mut s, &mut st, big("two", "b")).unwrap();
    let err = send(&mut s, &mut st, big("three", "b")).unwrap_err();
    let ProtocolError::ResourceExhausted(message) = &err else {
        panic!("{err:?}")
    };
    assert!(message.contains("2000 bytes"), "{message}");
    assert!(message.contains(r#"account "prod-a""#), "{message}");
    assert!(message.contains(r#"namespace "b""#), "{message}");
    assert!(message.contains("raise --max-staged-bytes"), "{message}");
    assert_eq!(err.to_status().code(), tonic::Code::ResourceExhausted);
    // Nothing reached the cache.
    assert_eq!(st.cache.object_count(), 0);
}
