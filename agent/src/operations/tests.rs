use super::*;

fn cand(group: &str, version: &str, kind: &str, plural: &str, preferred: bool) -> Candidate {
    Candidate {
        kind: KindRef {
            group: group.into(),
            version: version.into(),
            kind: kind.into(),
            plural: plural.into(),
            namespaced: true,
        },
        verbs: vec![],
        preferred,
    }
}

fn sel(kind: &str) -> v1::KindSelector {
    v1::KindSelector {
        kind: kind.into(),
        ..Default::default()
    }
}

#[test]
fn kinds_resolve_like_kubectl() {
    let c = vec![
        cand("apps", "v1", "Deployment", "deployments", true),
        cand("", "v1", "Event", "events", true),
        cand("events.k8s.io", "v1", "Event", "events", true),
        cand("example.com", "v1", "Widget", "widgets", false),
        cand("example.com", "v2", "Widget", "widgets", true),
        cand("other.io", "v1", "Widget", "widgets", true),
    ];
    let g =
        |k: &str| pick_kind(&sel(k), &c).map(|k| format!("{}/{}/{}", k.group, k.version, k.kind));
    assert_eq!(g("deploy").as_deref(), Some("apps/v1/Deployment"));
    assert_eq!(g("Deployment").as_deref(), Some("apps/v1/Deployment"));
    assert_eq!(g("deployments.apps").as_deref(), Some("apps/v1/Deployment"));
    assert_eq!(
        g("deployments.v1.apps").as_deref(),
        Some("apps/v1/Deployment")
    );
    assert_eq!(g("event").as_deref(), Some("/v1/Event"));
    assert_eq!(
        g("events.events.k8s.io").as_deref(),
        Some("events.k8s.io/v1/Event")
    );
    assert_eq!(
        g("widget.example.com").as_deref(),
        Some("example.com/v2/Widget")
    );
    assert_eq!(
        g("widgets.v1.example.com").as_deref(),
        Some("example.com/v1/Widget")
    );
    assert_eq!(g("widget.other.io").as_deref(), Some("other.io/v1/Widget"));
    assert_eq!(g("gadget"), None);
    let explicit = v1::KindSelector {
        group: "example.com".into(),
        version: "v1".into(),
        kind: "Widget".into(),
    };
    assert_eq!(pick_kind(&explicit, &c).unwrap().version, "v1");
}

#[test]
fn the_relative_timeout_wins_over_the_absolute_deadline() {
    let now = 1_000_000;
    // The hub's clock is behind this agent's: its absolute deadline has passed here.
    let skewed = v1::Operation {
        deadline_unix_millis: now - 60_000,
        timeout_millis: 30_000,
        ..Default::default()
    };
    assert_eq!(budget(&skewed, now), Duration::from_secs(30));
    // An older hub sends only the absolute deadline.
    let old = v1::Operation {
        deadline_unix_millis: now + 5_000,
        ..Default::default()
    };
    assert_eq!(budget(&old, now), Duration::from_secs(5));
    let past = v1::Operation {
        deadline_unix_millis: now - 1,
        ..Default::default()
    };
    assert_eq!(budget(&past, now), Duration::ZERO);
    assert_eq!(budget(&v1::Operation::default(), now), DEFAULT_DEADLINE);
}

#[test]
fn large_results_are_split_below_the_message_limit() {
    let max = 200 * 1024;
    let result = v1::OperationResult {
        id: "op".into(),
        ok: true,
        status: Some(v1::OperationStatus {
            code: 200,
            ..Default::default()
        }),
        objects_json: (0..100)
            .map(|i| vec![b'a' + (i % 26) as u8; 10_000])
            .collect(),
        object_kinds: (0..100).map(|_| v1::Kind::default()).collect(),
        deleted: vec!["ConfigMap/ns/a".into()],
        deleted_kinds: vec![v1::Kind::default()],
        deleted_uids: vec!["uid".into()],
        text: "é".repeat(150_000),
        continue_token: "next".into(),
        executed: true,
        account: "a".into(),
        ..Default::default()
    };
    // An older hub (0) gets it whole; a small result is never split.
    assert_eq!(split(result.clone(), 0).len(), 1);
    let small = v1::OperationResult {
        id: "s".into(),
        ..Default::default()
    };
    assert_eq!(
        split(small, max),
        [v1::OperationResult {
            id: "s".into(),
            ..Default::default()
        }]
    );
    let parts = split(result.clone(), max);
    assert!(parts.len() > 3, "{} parts", parts.len());
    for (i, part) in parts.iter().enumerate() {
        assert!(
            part.encoded_len() <= max as usize,
            "part {i}: {}",
            part.encoded_len()
        );
        assert_eq!(part.more, i + 1 < parts.len());
        assert_eq!(part.id, "op");
        assert_eq!(part.account, "a");
        assert_eq!(part.object_kinds.len(), part.objects_json.len());
    }
    let objects: Vec<Vec<u8>> = parts.iter().flat_map(|p| p.objects_json.clone()).collect();
    assert_eq!(objects, result.objects_json);
    let text: String = parts.iter().map(|p| p.text.as_str()).collect();
    assert_eq!(text, result.text);
    let deleted: Vec<String> = parts.iter().flat_map(|p| p.deleted.clone()).collect();
    assert_eq!(deleted, result.deleted);
    let last = parts.last().unwrap();
    assert_eq!(last.continue_token, "next");
    assert!(
        parts[..parts.len() - 1]
            .iter()
            .all(|p| p.continue_token.is_empty())
    );

    // One object that cannot fit: a 413 instead of a message the hub would refuse.
    let huge = v1::OperationResult {
        id: "h".into(),
        ok: true,
        objects_json: vec![vec![b'x'; max as usize]],
        executed: true,
        ..Default::default()
    };
    let parts = split(huge, max);
    assert_eq!(parts.len(), 1);
    assert!(!parts[0].ok);
    let status = parts[0].status.as_ref().unwrap();
    assert_eq!(status.code, 413);
    assert!(
        status.message.contains("--max-object-bytes"),
        "{}",
        status.message
    );
}

#[test]
fn labels_and_failures() {
    let k = cand("apps", "v1", "Deployment", "deployments", true).kind;
    assert_eq!(label(&k, "ns", "web"), "Deployment.apps/ns/web");
    let s: Status = serde_json::from_value(serde_json::json!({
        "code": 422, "reason": "Invalid", "message": "bad",
        "details": {"causes": [{"reason": "FieldValueRequired", "message": "Required value", "field": "spec.x"}]}
    }))
    .unwrap();
    let f = status_failure(&s);
    assert_eq!(f.code(), 422);
    assert_eq!(f.status.causes[0].field, "spec.x");
}
