use super::*;
use crate::state::{HubAccountState, KindView, ROLE_STANDBY};

fn kind(plural: &str, group: &str, ns: &str, state: KindState, sent: u64) -> KindView {
    KindView {
        group: group.into(),
        version: "v1".into(),
        kind: plural.into(),
        plural: plural.into(),
        watch_namespace: ns.into(),
        state,
        message: if state == KindState::Forbidden {
            "secrets is forbidden: User cannot list".into()
        } else {
            String::new()
        },
        resource_version: "1".into(),
        objects_sent: sent,
        lists: 1,
    }
}

fn view(connected: bool) -> AgentView {
    AgentView {
        replica: "pod-a".into(),
        hub: "hub:9091".into(),
        hub_connected: connected,
        // Welcomed once: it has the hub's word for its identity.
        hub_identity: "prod-agent".into(),
        hub_error: (!connected).then(|| "connection refused".into()),
        hub_replicas: if connected {
            vec!["pod-a".into(), "pod-b".into()]
        } else {
            vec![]
        },
        ..Default::default()
    }
}

fn account(role: &str) -> AccountView {
    let mut a = AccountView::new("prod");
    a.role = role.into();
    a.kinds = vec![
        kind("deployments", "apps", "web", KindState::Watching, 3),
        kind("deployments", "apps", "db", KindState::Watching, 2),
        kind("secrets", "", "db", KindState::Forbidden, 0),
    ];
    a.hub_state = Some(HubAccountState {
        state: "ACTIVE".into(),
        reason: "streamed by replica x/pod-a".into(),
        since_unix_millis: 1,
    });
    a
}

#[test]
fn streaming_replica_speaks_for_the_account() {
    let d = account_desired(&view(true), &account(ROLE_STREAMING), None, Some("t")).unwrap();
    assert_eq!((d.status, d.reason), (STATUS_TRUE, REASON_STREAMING));
    assert!(d.authoritative);
    let hub = &d.fields["hub"];
    assert_eq!(hub["kindsWatched"], json!(["deployments.apps"]));
    assert_eq!(hub["kindsForbidden"][0]["kind"], "secrets");
    assert_eq!(hub["kindsForbidden"][0]["namespace"], "db");
    assert!(
        hub["kindsForbidden"][0]["message"]
            .as_str()
            .unwrap()
            .contains("forbidden")
    );
    assert_eq!(hub["objectsStreamed"], 5);
    assert_eq!(hub["state"], "ACTIVE");
    assert_eq!(hub["replica"], "pod-a");
    assert_eq!(hub["lastEventTime"], "t");
}

#[test]
fn standby_writes_nothing_and_rejection_carries_the_hubs_reason() {
    assert!(account_desired(&view(true), &account(ROLE_STANDBY), None, None).is_none());
    let mut rejected = account(ROLE_REJECTED);
    rejected.rejection_reason = Some("account \"prod\" is bound to cluster https://a".into());
    let d = account_desired(&view(true), &rejected, None, None).unwrap();
    assert_eq!((d.status, d.reason), (STATUS_FALSE, REASON_REJECTED));
    assert!(d.message.contains("https://a"), "{}", d.message);
}

/// An account the agent cannot prepare (unreachable target cluster) is reported on its
/// own AgentAccount, whatever the hub connection; once it is served again the streaming
/// replica's verdict replaces it.
#[test]
fn a_failing_account_says_why_on_its_own_object() {
    let mut failing = AccountView::new("prod");
    failing.error = Some("cannot reach https://10.0.0.1:6443: connection refused".into());
    for connected in [true, false] {
        let d = account_desired(&view(connected), &failing, None, None).unwrap();
        assert_eq!((d.status, d.reason), (STATUS_FALSE, REASON_ACCOUNT_FAILING));
        assert!(d.message.contains("connection refused"), "{}", d.message);
        assert!(d.message.contains("pod-a"), "{}", d.message);
        assert!(d.authoritative);
    }
    let spoke = account_desired(&view(true), &failing, None, None).unwrap();
    let served =
        account_desired(&view(true), &account(ROLE_STREAMING), Some(&spoke), None).unwrap();
    assert_eq!(served.reason, REASON_STREAMING);
}

#[test]
fn a_demoted_replica_says_standby_once_and_then_leaves_it_to_the_streaming_one() {
    let streamed = account_desired(&view(true), &account(ROLE_STREAMING), None, None).unwrap();
    let standby = account(ROLE_STANDBY);
    let d = account_desired(&view(true), &standby, Some(&streamed), None).unwrap();
    assert_eq!((d.status, d.reason), (STATUS_TRUE, REASON_STANDBY));
    assert!(d.message.contains("pod-a"), "{}", d.message);
    assert!(d.message.contains("another replica"), "{}", d.message);
    assert!(
        !d.authoritative,
        "written once: the streaming replica speaks after"
    );
    // Its last write was Standby: nothing more.
    assert!(account_desired(&view(true), &standby, Some(&d), None).is_none());
    let body = patch_body("AgentAccount", &d, "t");
    assert_eq!(body["status"]["conditions"][0]["reason"], "Standby");
}

#[test]
fn a_replica_demoted_while_away_takes_back_its_hub_unreachable() {
    // It streamed, lost the hub and said so; the hub promoted another replica meanwhile.
    let streamed = account_desired(&view(true), &account(ROLE_STREAMING), None, None).unwrap();
    let lost = account_desired(
        &view(false),
        &account(ROLE_STREAMING),
        Some(&streamed),
        None,
    )
    .unwrap();
    assert_eq!(lost.reason, REASON_HUB_UNREACHABLE);
    let standby = account(ROLE_STANDBY);
    let d = account_desired(&view(true), &standby, Some(&lost), None).unwrap();
    assert_eq!((d.status, d.reason), (STATUS_TRUE, REASON_STANDBY));
    assert!(account_desired(&view(true), &standby, Some(&d), None).is_none());
    // The same for a replica whose first connection failed and said so.
    let mut never = view(false);
    never.hub_identity.clear();
    let first = account_desired(&never, &standby, None, None).unwrap();
    assert_eq!(first.reason, REASON_HUB_UNREACHABLE);
    let d = account_desired(&view(true), &standby, Some(&first), None).unwrap();
    assert_eq!(d.reason, REASON_STANDBY);
}

#[test]
fn a_replica_that_never_reached_the_hub_reports_its_last_error() {
    let mut never = view(false);
    never.hub_identity.clear();
    never.hub_error = None;
    let a = account(ROLE_STANDBY);
    // Still trying its first connection: nothing to say yet.
    assert!(account_desired(&never, &a, None, None).is_none());
    assert!(scale_agent_desired(&never, None).is_none());
    never.hub_error = Some("tls handshake: unknown issuer".into());
    let d = account_desired(&never, &a, None, None).unwrap();
    assert_eq!((d.status, d.reason), (STATUS_FALSE, REASON_HUB_UNREACHABLE));
    assert!(d.message.contains("unknown issuer"), "{}", d.message);
    assert!(d.message.contains("since it started"), "{}", d.message);
    assert!(d.message.contains("hub:9091"), "{}", d.message);
    assert!(!d.authoritative);
    let s = scale_agent_desired(&never, None).unwrap();
    assert_eq!((s.status, s.reason), (STATUS_FALSE, REASON_HUB_UNREACHABLE));
    assert_eq!(s.fields["connected"], 0);
    assert!(s.message.contains("unknown issuer"), "{}", s.message);
    // A new error is news; the same one is not written again.
    let last = Written {
        desired: d.clone(),
        transition: "t".into(),
        at: Instant::now(),
    };
    assert!(!due(&d, Some(&last), Duration::ZERO));
    never.hub_error = Some("connection refused".into());
    let newer = account_desired(&never, &a, None, None).unwrap();
    assert!(due(&newer, Some(&last), Duration::from_secs(10)));
    // Once welcomed, the usual rules apply (HubUnreachable only where it spoke last).
    never.hub_identity = "prod-agent".into();
    assert!(account_desired(&never, &a, None, None).is_none());
}

#[test]
fn a_replica_that_lost_the_hub_says_the_hub_state_is_unknown() {
    let streaming =
        account_desired(&view(true), &account(ROLE_STREAMING), None, Some("t")).unwrap();
    assert_eq!(streaming.fields["hub"]["state"], "ACTIVE");
    let lost = account_desired(
        &view(false),
        &account(ROLE_STREAMING),
        Some(&streaming),
        Some("t"),
    )
    .unwrap();
    assert_eq!(lost.reason, REASON_HUB_UNREACHABLE);
    let hub = &lost.fields["hub"];
    assert_eq!(hub["state"], HUB_STATE_UNKNOWN, "{hub}");
    let reason = hub["stateReason"].as_str().unwrap();
    assert!(reason.contains("lost the hub at hub:9091"), "{reason}");
    assert!(reason.contains("connection refused"), "{reason}");
    // What it knows of its own watches stays.
    assert_eq!(hub["kindsWatched"], json!(["deployments.apps"]));
}

#[test]
fn hub_unreachable_only_from_the_replica_that_spoke_last() {
    let a = account(ROLE_STREAMING);
    assert!(account_desired(&view(false), &a, None, None).is_none());
    let streamed = account_desired(&view(true), &a, None, None).unwrap();
    let d = account_desired(&view(false), &a, Some(&streamed), None).unwrap();
    assert_eq!((d.status, d.reason), (STATUS_FALSE, REASON_HUB_UNREACHABLE));
    assert!(d.message.contains("connection refused"), "{}", d.message);
    assert!(!d.authoritative, "written once, then left to others");
    assert!(account_desired(&view(false), &a, Some(&d), None).is_none());
}

#[test]
fn scale_agent_counts_the_replicas_the_hub_names() {
    let connected = scale_agent_desired(&view(true), None).unwrap();
    assert_eq!(connected.fields["connected"], 2);
    assert_eq!(connected.reason, REASON_CONNECTED);
    // Disconnected without having said anything: silent.
    assert!(scale_agent_desired(&view(false), None).is_none());
    // Having said it was connected: takes itself out.
    let left = scale_agent_desired(&view(false), Some(&connected)).unwrap();
    assert_eq!(left.fields["connected"], 1);
    assert_eq!(left.fields["connectedReplicas"], json!(["pod-b"]));
    assert_eq!(left.status, STATUS_TRUE);
    let mut alone = connected.clone();
    alone.fields = json!({"connected": 1, "connectedReplicas": ["pod-a"]});
    let gone = scale_agent_desired(&view(false), Some(&alone)).unwrap();
    assert_eq!(
        (gone.status, gone.reason),
        (STATUS_FALSE, REASON_HUB_UNREACHABLE)
    );
    assert_eq!(gone.fields["connected"], 0);
    // A HubUnreachable is not repeated.
    assert!(scale_agent_desired(&view(false), Some(&gone)).is_none());
}

#[test]
fn writes_are_rate_limited() {
    let d = account_desired(&view(true), &account(ROLE_STREAMING), None, None).unwrap();
    assert!(due(&d, None, Duration::from_secs(10)));
    let last = Written {
        desired: d.clone(),
        transition: "t".into(),
        at: Instant::now(),
    };
    assert!(!due(&d, Some(&last), Duration::from_secs(10)));
    let mut more = d.clone();
    more.fields["hub"]["objectsStreamed"] = json!(6);
    assert!(
        !due(&more, Some(&last), Duration::from_secs(10)),
        "counters wait"
    );
    assert!(due(&more, Some(&last), Duration::ZERO));
    let mut other = d.clone();
    other.reason = REASON_HUB_UNREACHABLE;
    assert!(
        due(&other, Some(&last), Duration::from_secs(10)),
        "conditions do not"
    );
    let body = patch_body("AgentAccount", &d, "2026-01-01T00:00:00Z");
    assert_eq!(body["status"]["conditions"][0]["type"], CONNECTED);
    assert_eq!(
        body["status"]["conditions"][0]["lastTransitionTime"],
        "2026-01-01T00:00:00Z"
    );
    assert_eq!(body["status"]["hub"]["objectsStreamed"], 5);
}
