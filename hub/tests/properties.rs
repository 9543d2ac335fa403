//! Property tests of everything the hub parses from another party: agents' protocol
//! messages (arbitrary bytes, and arbitrary well-formed `AgentMessage`s in arbitrary order,
//! through the stream's session handling), operation bodies (JSON, with manifests as JSON or
//! multi-document YAML) and label and field selectors (checked against a reference that
//! follows the API server's own parsers in `k8s.io/apimachinery`).
//!
//! Bounded for CI: 64 cases per property by default; `PROPTEST_CASES=100000` runs long
//! ones. A failure prints the minimal input; add it to the regression tests below it.

// Test code: a failed set-up should panic.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::{
    collections::{BTreeMap, BTreeSet},
    time::{Instant, SystemTime},
};

use proptest::prelude::*;
use prost::Message as _;
use scale_agent_hub::{
    identity::AllowRule,
    operations::OperationRequest,
    proxy::cached::selector::{FieldSelector, LabelSelector},
    session::{Effects, HubState, Limits, ProtocolError, Session, check_hello},
};
use scale_agent_proto::v1::{self as pb, agent_message::Kind as Msg};
use scale_agent_testkit::properties::config;
use serde_json::{Value, json};

// ---------------------------------------------------------------------------------------
// Protocol messages

fn now() -> (Instant, SystemTime) {
    (Instant::now(), SystemTime::now())
}

fn limits() -> Limits {
    Limits {
        max_object_bytes: 512,
        max_staged_bytes: 4 * 1024,
        // Small, so that generated snapshots also reach the quota's paths.
        max_objects_per_account: 64,
        max_accounts_per_identity: 0,
        allow: vec![AllowRule::parse("agent=prod-*").unwrap()],
    }
}

/// Mostly names the hub accepts and allows, sometimes not.
fn account() -> impl Strategy<Value = String> {
    prop_oneof![
        4 => Just("prod-a".to_string()),
        2 => Just("prod-b".to_string()),
        1 => Just("other".to_string()),
        1 => "[a-z!/ ]{0,6}",
    ]
}

fn kind() -> impl Strategy<Value = Option<pb::Kind>> {
    let known = |group: &str, version: &str, kind: &str, plural: &str, namespaced| pb::Kind {
        group: group.into(),
        version: version.into(),
        kind: kind.into(),
        plural: plural.into(),
        namespaced,
    };
    prop_oneof![
        4 => Just(Some(known("", "v1", "ConfigMap", "configmaps", true))),
        2 => Just(Some(known("apps", "v1", "Deployment", "deployments", true))),
        1 => Just(Some(known("", "v1", "Namespace", "namespaces", false))),
        1 => Just(None),
        1 => ("[a-z./]{0,8}", "[a-z0-9]{0,3}", "[A-Za-z]{0,8}", "[a-z/]{0,8}", any::<bool>())
            .prop_map(move |(g, v, k, p, n)| Some(known(&g, &v, &k, &p, n))),
    ]
}

fn resource_version() -> impl Strategy<Value = String> {
    prop_oneof![
        4 => (1u64..200).prop_map(|n| n.to_string()),
        1 => ".{0,5}",
    ]
}

fn name() -> impl Strategy<Value = String> {
    prop_oneof![4 => "[a-c]", 1 => ".{0,4}"]
}

/// Object JSON: mostly a small object, sometimes any bytes or a large object.
fn object_json() -> impl Strategy<Value = Vec<u8>> {
    prop_oneof![
        4 => (name(), "[a-z]{0,3}").prop_map(|(n, app)| {
            json!({"metadata": {"name": n, "labels": {"app": app}}}).to_string().into_bytes()
        }),
        1 => proptest::collection::vec(any::<u8>(), 0..32),
        1 => (600usize..2000).prop_map(|n| format!("{{\"data\":\"{}\"}}", "x".repeat(n)).into_bytes()),
    ]
}

fn watch_namespace() -> impl Strategy<Value = String> {
    prop_oneof![4 => Just(String::new()), 1 => Just("ns".to_string())]
}

fn object_event() -> impl Strategy<Value = pb::ObjectEvent> {
    (
        (account(), kind(), 0i32..4, watch_namespace()),
        (
            name(),
            name(),
            resource_version(),
            object_json(),
            any::<bool>(),
        ),
    )
        .prop_map(
            |((account, kind, r#type, watch_namespace), (name, uid, rv, json, truncated))| {
                pb::ObjectEvent {
                    account,
                    kind,
                    r#type,
                    namespace: "default".into(),
                    name,
                    uid,
                    resource_version: rv,
                    object_json: json,
                    truncated,
                    watch_namespace,
                }
            },
        )
}

fn message_kind() -> impl Strategy<Value = Msg> {
    prop_oneof![
        3 => (account(), "[a-z:/.0-9]{0,12}", proptest::collection::vec("[a-z]{0,3}", 0..2),
              proptest::collection::vec(any::<u8>(), 0..8), any::<bool>())
            .prop_map(|(account, host, namespaces, mut props, json_props)| {
                if json_props {
                    props = br#"{"kinds":["ConfigMap"]}"#.to_vec();
                }
                Msg::RegisterAccount(pb::RegisterAccount {
                    account,
                    cluster: Some(pb::ClusterInfo {
                        api_server_host: host,
                        ca_fingerprint: "aa".into(),
                        kubernetes_version: "v1.37.0".into(),
                    }),
                    namespaces,
                    properties_json: props,
                })
            }),
        1 => account().prop_map(|account| Msg::UnregisterAccount(pb::UnregisterAccount { account })),
        2 => (account(), kind(), 0i32..8, ".{0,8}").prop_map(|(account, kind, state, message)| {
            Msg::KindStatus(pb::KindStatus { account, kind, state, message, namespaces: vec![] })
        }),
        3 => (account(), kind(), watch_namespace()).prop_map(|(account, kind, watch_namespace)| {
            Msg::SnapshotBegin(pb::SnapshotBegin { account, kind, watch_namespace })
        }),
        8 => object_event().prop_map(Msg::Object),
        3 => (account(), kind(), resource_version(), 0u64..5, watch_namespace())
            .prop_map(|(account, kind, resource_version, object_count, watch_namespace)| {
                Msg::SnapshotEnd(pb::SnapshotEnd {
                    account, kind, resource_version, object_count, watch_namespace,
                })
            }),
        2 => (account(), kind(), resource_version(), watch_namespace())
            .prop_map(|(account, kind, resource_version, watch_namespace)| {
                Msg::Bookmark(pb::Bookmark { account, kind, resource_version, watch_namespace })
            }),
        1 => any::<i64>().prop_map(|t| Msg::Heartbeat(pb::Heartbeat { sent_at_unix_millis: t })),
        1 => (".{0,6}", any::<bool>(), proptest::collection::vec(object_json(), 0..2))
            .prop_map(|(id, ok, objects_json)| {
                Msg::OperationResult(pb::OperationResult { id, ok, objects_json, ..Default::default() })
            }),
        1 => account().prop_map(|account| Msg::DiscoveryChanged(pb::DiscoveryChanged { account })),
        1 => Just(Msg::Tunnel(pb::TunnelFrame::default())),
        1 => ".{0,8}".prop_map(|csr_pem| Msg::RenewCertificate(pb::RenewCertificate { csr_pem })),
        1 => account().prop_map(|account| {
            Msg::DynamicAccountStatus(pb::DynamicAccountStatus { account, ..Default::default() })
        }),
        1 => Just(Msg::Hello(pb::Hello::default())),
    ]
}

/// One step of a run: which of two streams sends, whether its seq is the expected one
/// (else the given one), and the message; or raw bytes decoded as a message.
#[derive(Clone, Debug)]
enum Step {
    Message {
        stream: usize,
        seq: Option<u64>,
        kind: Option<Box<Msg>>,
    },
    Bytes {
        stream: usize,
        bytes: Vec<u8>,
    },
}

fn step() -> impl Strategy<Value = Step> {
    prop_oneof![
        20 => (0usize..2, prop_oneof![19 => Just(None), 1 => any::<u64>().prop_map(Some)],
               prop_oneof![30 => message_kind().prop_map(|m| Some(Box::new(m))), 1 => Just(None)])
            .prop_map(|(stream, seq, kind)| Step::Message { stream, seq, kind }),
        1 => (0usize..2, proptest::collection::vec(any::<u8>(), 0..64))
            .prop_map(|(stream, bytes)| Step::Bytes { stream, bytes }),
    ]
}

/// Runs `steps` on two streams (replicas of one agent) as the hub's stream task does: a
/// stream whose message is refused ends (its session disconnects) and sends no more.
/// Returns each refusal.
fn run_streams(steps: Vec<Step>) -> Vec<ProtocolError> {
    let mut st = HubState::default();
    let limits = limits();
    let mut streams: Vec<Option<Session>> = ["r0", "r1"]
        .iter()
        .map(|replica| {
            let (id, _, _) = st.registry.connect("agent", replica, "v", now());
            Some(Session::new(id, "agent".into()))
        })
        .collect();
    let mut refusals = Vec::new();
    for step in steps {
        let (stream, msg) = match step {
            Step::Message { stream, seq, kind } => {
                let Some(session) = &streams[stream] else {
                    continue;
                };
                let seq = seq.unwrap_or(session.last_seq() + 1);
                (
                    stream,
                    pb::AgentMessage {
                        seq,
                        kind: kind.map(|k| *k),
                    },
                )
            }
            Step::Bytes { stream, bytes } => match pb::AgentMessage::decode(bytes.as_slice()) {
                Ok(msg) => (stream, msg),
                // Undecodable bytes never reach the session: tonic ends the stream.
                Err(_) => continue,
            },
        };
        let Some(session) = &mut streams[stream] else {
            continue;
        };
        let mut fx = Effects::default();
        if let Err(refusal) = session.handle(&mut st, &limits, msg, now(), &mut fx) {
            let status = refusal.to_status();
            assert!(
                !status.message().is_empty(),
                "a refusal says why: {refusal:?}"
            );
            st.registry.disconnect(session.id, now());
            streams[stream] = None;
            refusals.push(refusal);
        }
    }
    for session in streams.into_iter().flatten() {
        st.registry.disconnect(session.id, now());
    }
    refusals
}

proptest! {
    #![proptest_config(config())]

    /// Any sequence of messages on two streams: each is handled or refused with a protocol
    /// error that names the problem, never a panic.
    #[test]
    fn any_message_sequence_is_handled_or_refused(
        steps in proptest::collection::vec(step(), 0..60)
    ) {
        run_streams(steps);
    }

    /// The first message of a stream, from any bytes: Hello with seq 1, or a refusal.
    #[test]
    fn any_first_message_is_hello_or_refused(bytes in proptest::collection::vec(any::<u8>(), 0..64)) {
        if let Ok(msg) = pb::AgentMessage::decode(bytes.as_slice()) {
            let was_hello = msg.seq == 1 && matches!(msg.kind, Some(Msg::Hello(_)));
            prop_assert_eq!(check_hello(msg).is_ok(), was_hello);
        }
    }
}

#[test]
fn a_wrong_seq_and_a_second_hello_are_refused() {
    let steps = vec![
        Step::Message {
            stream: 0,
            seq: None,
            kind: Some(Box::new(Msg::Hello(pb::Hello::default()))),
        },
        Step::Message {
            stream: 1,
            seq: Some(7),
            kind: Some(Box::new(Msg::Heartbeat(pb::Heartbeat::default()))),
        },
        // Both streams ended: nothing more is handled.
        Step::Message {
            stream: 1,
            seq: None,
            kind: None,
        },
    ];
    let refusals = run_streams(steps);
    assert!(
        matches!(
            refusals.as_slice(),
            [
                ProtocolError::FailedPrecondition(_),
                ProtocolError::InvalidArgument(_)
            ]
        ),
        "{refusals:?}"
    );
}

// ---------------------------------------------------------------------------------------
// Operation bodies

/// Any JSON value, a few levels deep.
fn json_value() -> impl Strategy<Value = Value> {
    let leaf = prop_oneof![
        Just(Value::Null),
        any::<bool>().prop_map(Value::from),
        any::<i64>().prop_map(Value::from),
        any::<f64>().prop_map(|f| json!(f)),
        ".{0,8}".prop_map(Value::from),
    ];
    leaf.prop_recursive(3, 16, 4, |inner| {
        prop_oneof![
            proptest::collection::vec(inner.clone(), 0..4).prop_map(Value::from),
            proptest::collection::btree_map("[a-zA-Z]{0,6}", inner, 0..4)
                .prop_map(|m| Value::Object(m.into_iter().collect())),
        ]
    })
}

/// A multi-document YAML manifest: documents separated by `---`, some of them not YAML.
fn yaml_manifest() -> impl Strategy<Value = String> {
    proptest::collection::vec(
        prop_oneof![
            json_value().prop_map(|v| v.to_string()),
            (name(), "[a-z]{0,5}").prop_map(|(n, k)| {
                format!("apiVersion: v1\nkind: {k}\nmetadata:\n  name: {n}\n")
            }),
            ".{0,16}",
        ],
        0..4,
    )
    .prop_map(|documents| documents.join("\n---\n"))
}

/// A body shaped like an operation request: known fields with values of any type.
fn operation_body() -> impl Strategy<Value = Value> {
    let field = prop_oneof![
        Just("id"),
        Just("type"),
        Just("timeoutSeconds"),
        Just("manifest"),
        Just("manifests"),
        Just("yaml"),
        Just("kind"),
        Just("apiVersion"),
        Just("namespace"),
        Just("name"),
        Just("labelSelector"),
        Just("patchType"),
        Just("patch"),
        Just("replicas"),
        Just("action"),
        Just("tailLines"),
        Just("limit"),
    ];
    let value = prop_oneof![
        json_value(),
        yaml_manifest().prop_map(Value::from),
        prop_oneof![
            Just("apply"),
            Just("create"),
            Just("replace"),
            Just("delete"),
            Just("patch"),
            Just("scale"),
            Just("rollout"),
            Just("get"),
            Just("list"),
            Just("events"),
            Just("logs"),
            Just("restart"),
        ]
        .prop_map(Value::from),
        prop_oneof![
            Just(1e300),
            Just(-1.0),
            Just(0.5),
            Just(f64::MAX),
            Just(1e-300)
        ]
        .prop_map(|f| json!(f)),
    ];
    proptest::collection::btree_map(field, value, 0..6).prop_map(|fields| {
        Value::Object(
            fields
                .into_iter()
                .map(|(k, v)| (k.to_string(), v))
                .collect(),
        )
    })
}

/// What the hub does with a body before it sends anything: parse it (a 400 if it does not),
/// bound its timeout and build the wire operation (a 400 if either fails).
fn check_operation_body(body: &[u8]) -> Result<(), String> {
    let request: OperationRequest = serde_json::from_slice(body).map_err(|e| e.to_string())?;
    request.timeout()?;
    request.to_op()?;
    Ok(())
}

proptest! {
    #![proptest_config(config())]

    #[test]
    fn any_operation_body_is_a_request_or_a_400(body in operation_body()) {
        if let Err(message) = check_operation_body(body.to_string().as_bytes()) {
            prop_assert!(!message.is_empty());
        }
    }

    #[test]
    fn any_bytes_are_a_request_or_a_400(body in proptest::collection::vec(any::<u8>(), 0..64)) {
        let _ = check_operation_body(&body);
    }
}

#[test]
fn a_huge_timeout_is_bounded_not_a_panic() {
    for seconds in ["1e300", "1.7976931348623157e308", "18446744073709551616"] {
        let body = format!(r#"{{"type":"get","timeoutSeconds":{seconds}}}"#);
        let request: OperationRequest = serde_json::from_str(&body).unwrap();
        let timeout = request.timeout().unwrap();
        assert!(
            timeout <= std::time::Duration::from_secs(3600),
            "{timeout:?}"
        );
    }
}

// ---------------------------------------------------------------------------------------
// Label and field selectors

/// A label selector requirement as the reference sees it.
#[derive(Clone, Debug)]
enum Req {
    Exists(String, bool),
    Equals(String, String, &'static str),
    In(String, BTreeSet<String>, bool),
    Compare(String, i64, bool),
}

fn label_key() -> impl Strategy<Value = String> {
    prop_oneof![
        4 => prop_oneof![Just("app"), Just("tier"), Just("n"), Just("example.com/team")]
            .prop_map(str::to_string),
        1 => "[a-z]([a-z0-9._-]{0,6}[a-z0-9])?",
    ]
}

fn label_value() -> impl Strategy<Value = String> {
    prop_oneof![
        4 => prop_oneof![Just("web"), Just("db"), Just("1"), Just("7"), Just("")].prop_map(str::to_string),
        1 => "[a-zA-Z0-9]([a-zA-Z0-9._-]{0,6}[a-zA-Z0-9])?",
    ]
}

fn requirement() -> impl Strategy<Value = Req> {
    prop_oneof![
        (label_key(), any::<bool>()).prop_map(|(k, want)| Req::Exists(k, want)),
        (
            label_key(),
            label_value(),
            prop_oneof![Just("="), Just("=="), Just("!=")]
        )
            .prop_map(|(k, v, op)| Req::Equals(k, v, op)),
        (
            label_key(),
            proptest::collection::btree_set(label_value(), 1..4),
            any::<bool>()
        )
            .prop_map(|(k, vs, positive)| Req::In(k, vs, positive)),
        (label_key(), -10i64..10, any::<bool>()).prop_map(|(k, n, gt)| Req::Compare(k, n, gt)),
    ]
}

/// Spaces the API server's lexer skips: around operators, commas and parentheses.
fn pad() -> impl Strategy<Value = &'static str> {
    prop_oneof![3 => Just(""), 1 => Just(" ")]
}

/// The selector's text, with optional spaces where the API server allows them.
fn render(reqs: &[Req], pads: &[&str]) -> String {
    let mut p = pads.iter().cycle();
    let mut pad = || *p.next().unwrap_or(&"");
    reqs.iter()
        .map(|r| match r {
            Req::Exists(k, true) => format!("{}{k}{}", pad(), pad()),
            Req::Exists(k, false) => format!("{}!{}{k}", pad(), pad()),
            Req::Equals(k, v, op) => format!("{k}{}{op}{}{v}", pad(), pad()),
            Req::In(k, vs, positive) => {
                let op = if *positive { "in" } else { "notin" };
                let list: Vec<String> = vs
                    .iter()
                    .map(|v| format!("{}{v}{}", pad(), pad()))
                    .collect();
                format!("{k} {op} ({})", list.join(","))
            }
            Req::Compare(k, n, gt) => {
                format!("{k}{}{}{}{n}", pad(), if *gt { ">" } else { "<" }, pad())
            }
        })
        .collect::<Vec<_>>()
        .join(",")
}

/// The API server's meaning of each requirement (`k8s.io/apimachinery/pkg/labels`):
/// `!=` and `notin` select objects without the label; `>`/`<` need an integer label.
fn reference_matches(reqs: &[Req], labels: &BTreeMap<String, String>) -> bool {
    reqs.iter().all(|r| match r {
        Req::Exists(k, want) => labels.contains_key(k) == *want,
        Req::Equals(k, v, "!=") => labels.get(k) != Some(v),
        Req::Equals(k, v, _) => labels.get(k) == Some(v),
        Req::In(k, vs, true) => labels.get(k).is_some_and(|l| vs.contains(l)),
        Req::In(k, vs, false) => labels.get(k).is_none_or(|l| !vs.contains(l)),
        Req::Compare(k, n, gt) => labels
            .get(k)
            .and_then(|l| l.parse::<i64>().ok())
            .is_some_and(|l| if *gt { l > *n } else { l < *n }),
    })
}

fn labels() -> impl Strategy<Value = BTreeMap<String, String>> {
    proptest::collection::btree_map(label_key(), label_value(), 0..4)
}

fn as_json_map(labels: &BTreeMap<String, String>) -> serde_json::Map<String, Value> {
    labels
        .iter()
        .map(|(k, v)| (k.clone(), Value::from(v.as_str())))
        .collect()
}

/// A field selector term as the API server splits it (`k8s.io/apimachinery/pkg/fields`,
/// `splitTerm`): at the leftmost of `!=`, `==`, `=`, with nothing trimmed.
fn reference_field_term(term: &str) -> Option<(&str, &str, bool)> {
    for i in 0..term.len() {
        if !term.is_char_boundary(i) {
            continue;
        }
        for (op, equal) in [("!=", false), ("==", true), ("=", true)] {
            if term[i..].starts_with(op) {
                return Some((&term[..i], &term[i + op.len()..], equal));
            }
        }
    }
    None
}

fn field_term() -> impl Strategy<Value = String> {
    let field = prop_oneof![
        Just("metadata.name"),
        Just("metadata.namespace"),
        Just("spec.nodeName"),
        Just("status.phase"),
        Just("spec.unknown"),
    ];
    let value = prop_oneof![
        Just("p"),
        Just("ns"),
        Just("n1"),
        Just("Running"),
        Just(""),
        Just("a=b")
    ];
    (
        pad(),
        field,
        pad(),
        prop_oneof![Just("="), Just("=="), Just("!=")],
        pad(),
        value,
        pad(),
    )
        .prop_map(|(p1, f, p2, op, p3, v, p4)| format!("{p1}{f}{p2}{op}{p3}{v}{p4}"))
}

proptest! {
    #![proptest_config(config())]

    /// Whatever the text, parsing neither panics nor accepts what the API server refuses
    /// (a parse is `None` then, and the request goes to the API server).
    #[test]
    fn any_selector_text_parses_or_is_left_to_the_api_server(text in ".{0,24}", labels in labels()) {
        if let Some(selector) = LabelSelector::parse(&text) {
            selector.matches(Some(&as_json_map(&labels)));
        }
        if let Some(selector) = FieldSelector::parse(&text, "", "Pod") {
            selector.matches(&json!({"metadata": {"name": "p"}}));
        }
    }

    /// Well-formed label selectors parse, and select exactly what the API server would (the
    /// proxy's cache and the hub's REST API share this parser).
    #[test]
    fn label_selectors_select_what_the_api_server_would(
        reqs in proptest::collection::vec(requirement(), 1..4),
        pads in proptest::collection::vec(pad(), 8),
        labels in labels(),
    ) {
        let text = render(&reqs, &pads);
        let expected = reference_matches(&reqs, &labels);
        let map = as_json_map(&labels);
        let parsed = LabelSelector::parse(&text);
        prop_assert!(parsed.is_some(), "{text:?} is a valid selector");
        prop_assert_eq!(parsed.unwrap().matches(Some(&map)), expected, "{:?} on {:?}", text, labels);
    }

    /// A field selector the cache answers selects what the API server would; one whose
    /// terms the API server reads differently (spaces are part of names and values there)
    /// is left to it.
    #[test]
    fn field_selectors_select_what_the_api_server_would(
        terms in proptest::collection::vec(field_term(), 1..3),
        name in prop_oneof![Just("p"), Just("q")],
        node in prop_oneof![Just("n1"), Just("")],
    ) {
        let text = terms.join(",");
        let pod = json!({"metadata": {"name": name, "namespace": "ns"}, "spec": {"nodeName": node}, "status": {"phase": "Running"}});
        let Some(selector) = FieldSelector::parse(&text, "", "Pod") else {
            return Ok(());
        };
        let mut expected = true;
        for term in text.split(',').filter(|t| !t.is_empty()) {
            let reference = reference_field_term(term);
            prop_assert!(reference.is_some(), "{text:?}: the API server refuses {term:?}");
            let (field, value, equal) = reference.unwrap();
            let actual = match field {
                "metadata.name" => name,
                "metadata.namespace" => "ns",
                "spec.nodeName" => node,
                "status.phase" => "Running",
                other => {
                    prop_assert!(false, "{text:?}: the API server refuses field {other:?}");
                    unreachable!()
                }
            };
            expected &= (actual == value) == equal;
        }
        prop_assert_eq!(selector.matches(&pod), expected, "{:?} on {}", text, pod);
    }
}
