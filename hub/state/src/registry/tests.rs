use scale_agent_proto::v1::kind_status::State as KindStatusState;

use super::*;

fn rec(host: &str) -> AccountRecord {
    AccountRecord {
        cluster: ClusterRecord {
            api_server_host: host.into(),
            ca_fingerprint: "ff".into(),
            kubernetes_version: "v1.37.0".into(),
        },
        namespaces: vec![],
        properties: serde_json::Value::Null,
    }
}

fn now() -> (Instant, SystemTime) {
    (Instant::now(), SystemTime::now())
}

#[test]
fn roles_promotion_and_grace() {
    let mut r = Registry::default();
    let (a, _, _) = r.connect("agent", "pod-a", "v", now());
    let (b, _, _) = r.connect("agent", "pod-b", "v", now());
    assert_eq!(
        r.register(a, "prod", rec("h1")).0,
        Registration::Assigned(Role::Streaming)
    );
    assert_eq!(
        r.register(b, "prod", rec("h1")).0,
        Registration::Assigned(Role::Standby)
    );
    // Registering again keeps the role.
    assert_eq!(
        r.register(a, "prod", rec("h1")).0,
        Registration::Assigned(Role::Streaming)
    );
    assert!(r.is_streaming(a, "prod"));
    assert!(!r.is_streaming(b, "prod"));

    let promotions = r.disconnect(a, now());
    assert_eq!(
        promotions,
        vec![Promotion {
            session: b,
            account: "prod".into()
        }]
    );
    assert!(r.is_streaming(b, "prod"));
    assert!(r.expired(Instant::now(), Duration::ZERO).is_empty());

    assert!(r.disconnect(b, now()).is_empty());
    assert_eq!(
        r.expired(Instant::now(), Duration::ZERO),
        vec!["prod".to_string()]
    );
    assert!(
        r.expired(Instant::now(), Duration::from_secs(60))
            .is_empty()
    );

    // Reconnecting within the grace period keeps the account.
    let (c, _, _) = r.connect("agent", "pod-c", "v", now());
    assert_eq!(
        r.register(c, "prod", rec("h1")).0,
        Registration::Assigned(Role::Streaming)
    );
    assert!(r.expired(Instant::now(), Duration::ZERO).is_empty());
}

/// Credentials refused are the streaming replica's: a standby promoted in its place
/// streams, so the account is ACTIVE again; a standby's report changes nothing.
#[test]
fn refused_credentials_fail_the_account_only_while_their_replica_streams_it() {
    let mut r = Registry::default();
    let (a, _, _) = r.connect("agent", "pod-a", "v", now());
    let (b, _, _) = r.connect("agent", "pod-b", "v", now());
    r.register(a, "prod", rec("h1"));
    r.register(b, "prod", rec("h1"));
    let state = |r: &mut Registry| {
        r.observe(SystemTime::now());
        r.states["prod"].state
    };
    assert_eq!(state(&mut r), AccountState::Active);
    r.note_kind_status(a, "prod", KindStatusState::Forbidden, "401 looks alike");
    r.note_kind_status(a, "prod", KindStatusState::Failing, "500 InternalError: x");
    assert_eq!(state(&mut r), AccountState::Active);
    r.note_kind_status(a, "prod", KindStatusState::Failing, "401 Unauthorized: y");
    assert_eq!(state(&mut r), AccountState::Failed);
    assert!(r.states["prod"].reason.contains("agent/pod-a"));
    // Another replica watching says nothing about pod-a's credentials.
    r.note_kind_status(b, "prod", KindStatusState::Watching, "");
    assert_eq!(state(&mut r), AccountState::Failed);
    r.disconnect(a, now());
    assert_eq!(state(&mut r), AccountState::Active);
    assert!(r.credential_failures.is_empty());
}

/// An account a replica cannot serve (AccountUnavailable) is FAILED with its reason
/// while nobody streams it; the replica stops serving it (its standby takes over); the
/// report ends when the replica registers the account or its stream ends.
#[test]
fn an_account_a_replica_cannot_serve_is_failed_until_someone_streams_it() {
    use AccountState::*;
    let mut r = Registry::default();
    let (a, _, _) = r.connect("agent", "pod-a", "v", now());
    let (b, _, _) = r.connect("agent", "pod-b", "v", now());
    // Never registered: FAILED with the agent's words, and the reporter is told.
    assert!(
        r.note_unavailable(a, "new", "kubeconfig /k: no such file", now())
            .is_empty()
    );
    assert_eq!(states(&mut r), vec![("new".into(), None, Failed)]);
    let reason = &r.states["new"].reason;
    assert!(
        reason.contains("agent/pod-a") && reason.contains("/k: no such file"),
        "{reason}"
    );
    assert_eq!(r.interested_in("new"), vec![a]);
    // Once it can, it registers: ACTIVE.
    r.register(a, "new", rec("h"));
    assert_eq!(states(&mut r), vec![("new".into(), Some(Failed), Active)]);

    // The streaming replica's kubeconfig breaks: the standby streams, ACTIVE stays.
    r.register(b, "new", rec("h"));
    let promotions = r.note_unavailable(a, "new", "401 Unauthorized", now());
    assert_eq!(
        promotions,
        vec![Promotion {
            session: b,
            account: "new".into()
        }]
    );
    assert!(states(&mut r).is_empty());
    assert!(r.is_streaming(b, "new"));
    assert_eq!(r.role(a, "new"), None);
    // The standby's stream ends too: nobody serves it, FAILED with pod-a's reason.
    r.disconnect(b, now());
    assert_eq!(states(&mut r), vec![("new".into(), Some(Active), Failed)]);
    assert!(r.states["new"].reason.contains("401 Unauthorized"));
    // pod-a's stream ends: its report goes with it, INACTIVE (cache kept for the grace).
    r.disconnect(a, now());
    assert_eq!(states(&mut r), vec![("new".into(), Some(Failed), Inactive)]);
    assert!(r.unavailable.is_empty());
}

#[test]
fn other_cluster_is_rejected() {
    let mut r = Registry::default();
    let (a, _, _) = r.connect("agent", "x", "v", now());
    let (b, _, _) = r.connect("other", "x", "v", now());
    r.register(a, "prod", rec("https://h1"));
    let (reg, persist) = r.register(b, "prod", rec("https://h2"));
    assert!(persist.is_none());
    match reg {
        Registration::Rejected(reason) => {
            assert!(reason.contains("https://h1"), "{reason}");
            assert!(reason.contains("https://h2"), "{reason}");
        }
        other => panic!("{other:?}"),
    }
    // A new Kubernetes version of the same cluster is fine.
    let mut newer = rec("https://h1");
    newer.cluster.kubernetes_version = "v1.38.0".into();
    assert_eq!(
        r.register(b, "prod", newer).0,
        Registration::Assigned(Role::Standby)
    );
    assert_eq!(
        r.accounts["prod"].record.cluster.kubernetes_version,
        "v1.38.0"
    );
}

#[test]
fn same_identity_and_replica_replaces() {
    let mut r = Registry::default();
    let (a, _, _) = r.connect("agent", "x", "v", now());
    r.register(a, "prod", rec("h"));
    let (a2, old, promotions) = r.connect("agent", "x", "v", now());
    assert_eq!(old, Some(a));
    assert!(promotions.is_empty());
    assert!(!r.sessions.contains_key(&a));
    assert_eq!(r.accounts["prod"].streaming, None);
    assert_eq!(
        r.register(a2, "prod", rec("h")).0,
        Registration::Assigned(Role::Streaming)
    );
    // A different replica does not replace.
    let (_, old, _) = r.connect("agent", "y", "v", now());
    assert_eq!(old, None);
}

fn states(r: &mut Registry) -> Vec<(String, Option<AccountState>, AccountState)> {
    r.observe(SystemTime::now())
        .into_iter()
        .map(|t| (t.account, t.from, t.to.state))
        .collect()
}

#[test]
fn lifecycle_active_inactive_orphaned_and_back() {
    use AccountState::*;
    let mut r = Registry::default();
    let (a, _, _) = r.connect("agent", "pod-a", "v", now());
    r.register(a, "prod", rec("h"));
    r.bind("prod", "agent", 0);
    assert_eq!(states(&mut r), vec![("prod".into(), None, Active)]);
    assert!(r.states["prod"].reason.contains("agent/pod-a"));
    // Nothing changed: no transition, and the time of the last one is kept.
    let since = r.states["prod"].since;
    assert!(states(&mut r).is_empty());
    assert_eq!(r.states["prod"].since, since);
    assert_eq!(r.interested_in("prod"), vec![a]);

    r.disconnect(a, now());
    assert_eq!(
        states(&mut r),
        vec![("prod".into(), Some(Active), Inactive)]
    );
    assert!(r.states["prod"].reason.contains("grace period"));

    // The grace period ends: the record goes, the binding stays.
    r.remove_account("prod");
    assert_eq!(
        states(&mut r),
        vec![("prod".into(), Some(Inactive), Orphaned)]
    );
    let orphaned = &r.states["prod"];
    assert!(orphaned.reason.contains("\"agent\""), "{}", orphaned.reason);
    assert_eq!(
        orphaned
            .cluster
            .as_ref()
            .map(|c| c.api_server_host.as_str()),
        Some("h")
    );
    assert_eq!(r.state_counts()[&Orphaned], 1);
    assert_eq!(r.state_counts()[&Active], 0);

    // Its agent returns.
    let (b, _, _) = r.connect("agent", "pod-b", "v", now());
    r.register(b, "prod", rec("h"));
    assert_eq!(
        states(&mut r),
        vec![("prod".into(), Some(Orphaned), Active)]
    );
}

#[test]
fn rejection_fails_an_account_nobody_streams() {
    use AccountState::*;
    let mut r = Registry::default();
    let (a, _, _) = r.connect("agent", "a", "v", now());
    let (other, _, _) = r.connect("other", "x", "v", now());
    r.register(a, "prod", rec("h1"));
    states(&mut r);
    // A clash while the owner streams: the account stays ACTIVE, the claimant is told.
    r.note_rejection(other, "prod", "bound to cluster h1");
    assert!(states(&mut r).is_empty());
    assert_eq!(r.interested_in("prod"), vec![a, other]);
    // The owner leaves: the last word is the rejection.
    r.disconnect(a, now());
    assert_eq!(states(&mut r), vec![("prod".into(), Some(Active), Failed)]);
    assert!(r.states["prod"].reason.contains("other/x"));
    assert!(r.states["prod"].reason.contains("bound to cluster h1"));
    // The claimant leaves: INACTIVE again.
    r.disconnect(other, now());
    assert_eq!(
        states(&mut r),
        vec![("prod".into(), Some(Failed), Inactive)]
    );

    // A name the hub knows only through a rejection is forgotten with the stream.
    let (c, _, _) = r.connect("other", "y", "v", now());
    r.note_rejection(c, "unknown", "not allowed");
    assert_eq!(states(&mut r), vec![("unknown".into(), None, Failed)]);
    r.disconnect(c, now());
    assert!(states(&mut r).is_empty());
    assert!(!r.states.contains_key("unknown"));

    // Rejections are bounded.
    let (d, _, _) = r.connect("other", "z", "v", now());
    for i in 0..MAX_REJECTIONS + 10 {
        r.note_rejection(d, &format!("n{i}"), "no");
    }
    states(&mut r);
    assert_eq!(r.state_counts()[&Failed], MAX_REJECTIONS);
}

/// A replica sharing its accounts streams only those it owns: the agents of others stand
/// by, the first is promoted when it acquires, and streams stand by again when it loses
/// the account; it releases what no agent of its own serves.
#[test]
fn shared_replicas_stream_only_what_they_own() {
    use AccountState::*;
    let mut r = Registry::shared();
    let (a, _, _) = r.connect("agent", "a", "v", now());
    let (b, _, _) = r.connect("agent", "b", "v", now());
    assert_eq!(
        r.register(a, "prod", rec("h")).0,
        Registration::Assigned(Role::Standby)
    );
    assert_eq!(
        r.register(b, "prod", rec("h")).0,
        Registration::Assigned(Role::Standby)
    );
    assert!(!r.owns("prod"));
    assert_eq!(r.to_acquire(), vec!["prod".to_string()]);
    assert!(r.to_release().is_empty());
    // Served elsewhere: ACTIVE, and no grace period while its agents stand by here.
    assert_eq!(states(&mut r), vec![("prod".into(), None, Active)]);
    assert!(r.states["prod"].reason.contains("another hub replica"));
    assert!(r.unregister(b, "prod", now()).is_empty());
    assert!(r.expired(Instant::now(), Duration::ZERO).is_empty());
    r.register(b, "prod", rec("h"));

    assert_eq!(
        r.acquired("prod"),
        Some(Promotion {
            session: a,
            account: "prod".into()
        })
    );
    assert!(r.owns("prod") && r.is_streaming(a, "prod"));
    assert!(r.to_acquire().is_empty());

    // Lost: the streaming session stands by first, to be ended.
    assert_eq!(r.lost_all(), vec![a]);
    assert!(!r.owns("prod"));
    assert_eq!(r.accounts["prod"].standbys, vec![a, b]);
    assert_eq!(r.acquired("prod").map(|p| p.session), Some(a));

    // The agents leave: the account is released and its grace period starts.
    r.disconnect(a, now());
    assert!(r.is_streaming(b, "prod"));
    r.disconnect(b, now());
    assert_eq!(r.to_release(), vec!["prod".to_string()]);
    assert_eq!(r.released("prod"), None);
    assert!(r.to_release().is_empty());
    assert_eq!(
        r.expired(Instant::now(), Duration::ZERO),
        vec!["prod".to_string()]
    );

    // One replica owns everything and never acquires or releases.
    let mut one = Registry::default();
    let (c, _, _) = one.connect("agent", "c", "v", now());
    one.register(c, "prod", rec("h"));
    assert!(one.owns("prod") && one.is_streaming(c, "prod"));
    assert!(one.to_acquire().is_empty() && one.to_release().is_empty());
    assert!(one.lost_all().is_empty());
}

#[test]
fn unregister_promotes() {
    let mut r = Registry::default();
    let (a, _, _) = r.connect("agent", "a", "v", now());
    let (b, _, _) = r.connect("agent", "b", "v", now());
    r.register(a, "prod", rec("h"));
    r.register(b, "prod", rec("h"));
    assert_eq!(r.accounts_of(b), vec![("prod".to_string(), Role::Standby)]);
    assert_eq!(r.replicas("prod"), vec![a, b]);
    assert_eq!(r.replica_label(b), "agent/b");
    let p = r.unregister(a, "prod", now());
    assert_eq!(p.len(), 1);
    assert_eq!(r.role(b, "prod"), Some(Role::Streaming));
    assert_eq!(r.role(a, "prod"), None);
    assert_eq!(r.replicas("prod"), vec![b]);
    assert!(r.replicas("other").is_empty());
    assert_eq!(r.replica_label(999), "");
}
