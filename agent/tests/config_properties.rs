//! Property tests of the agent's config file, which the platform team (or an operator, or
//! a Helm chart written for Armory's agent) writes: Armory-shaped YAML with arbitrary keys
//! and values, Armory's documented files with lines changed, and any text at all. Each is a
//! config or a clear error naming the file; never a panic.
//!
//! Bounded for CI: 64 cases per property by default; `PROPTEST_CASES=100000` runs long
//! ones.

// Test code: a failed set-up should panic.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::path::{Path, PathBuf};

use proptest::prelude::*;
use scale_agent::config::{ConfigFiles, parse_config_files};
use scale_agent_testkit::properties::config;
use serde_json::{Map, Value, json};

/// Keys an Armory agent config has (honoured, refused or without effect here), with
/// `[]` for an item of a list.
const ARMORY_PATHS: &[&str] = &[
    "clouddriver.grpc",
    "clouddriver.insecure",
    "clouddriver.keepAliveHeartbeatSeconds",
    "clouddriver.responseRetries",
    "clouddriver.tls.cacertFile",
    "clouddriver.tls.clientCertFile",
    "clouddriver.tls.clientKeyFile",
    "clouddriver.tls.insecureSkipVerify",
    "clouddriver.tls.serverName",
    "clouddriver.auth.token",
    "clouddriver.auth.tokenCommand",
    "clouddriver.backoff.baseDelay",
    "clouddriver.backoff.maxDelay",
    "clouddriver.backoff.multiplier",
    "kubernetes.accounts[].name",
    "kubernetes.accounts[].serviceAccount",
    "kubernetes.accounts[].kubeconfigFile",
    "kubernetes.accounts[].context",
    "kubernetes.accounts[].namespaces",
    "kubernetes.accounts[].omitNamespaces",
    "kubernetes.accounts[].kinds",
    "kubernetes.accounts[].omitKinds",
    "kubernetes.accounts[].onlySpinnakerManaged",
    "kubernetes.accounts[].insecure",
    "kubernetes.accounts[].permissions.READ",
    "kubernetes.accounts[].metrics",
    "kubernetes.serverSideApply",
    "kubernetes.retries",
    "tasks.totalBudget",
    "tasks.budgetPerAccount",
    "server.port",
    "server.ssl.enabled",
    "logging.level",
    "prometheus.enabled",
    "secrets.vault.enabled",
    "dynamicAccounts.enabled",
    "timeoutSeconds",
    "certFile",
];

fn scalar() -> impl Strategy<Value = Value> {
    prop_oneof![
        Just(Value::Null),
        any::<bool>().prop_map(Value::from),
        any::<i64>().prop_map(Value::from),
        (-1e6f64..1e6).prop_map(|f| json!(f)),
        Just(json!(1e300)),
        prop_oneof![
            Just("prod"),
            Just(""),
            Just("host:9091"),
            Just("10s"),
            Just("-1s"),
            Just("encryptedFile:vault!a"),
            Just("ConfigMap"),
            Just("*"),
        ]
        .prop_map(Value::from),
        ".{0,10}".prop_map(Value::from),
    ]
}

fn value() -> impl Strategy<Value = Value> {
    scalar().prop_recursive(2, 8, 3, |inner| {
        prop_oneof![
            proptest::collection::vec(inner.clone(), 0..3).prop_map(Value::from),
            proptest::collection::btree_map("[a-zA-Z]{1,6}", inner, 0..3)
                .prop_map(|m| Value::Object(m.into_iter().collect())),
        ]
    })
}

/// A path: an Armory one, an Armory one with a made-up last key, or a made-up one.
fn path() -> impl Strategy<Value = String> {
    let armory = proptest::sample::select(ARMORY_PATHS).prop_map(str::to_string);
    prop_oneof![
        6 => armory.clone(),
        1 => (armory, "[a-zA-Z]{1,6}").prop_map(|(p, k)| format!("{p}.{k}")),
        1 => "[a-z]{1,5}(\\.[a-zA-Z]{1,5}){0,2}",
    ]
}

/// Puts `value` at `path` (`a.b[].c`: `[]` is item `item` of a list), replacing whatever
/// is in the way.
fn insert(root: &mut Value, path: &str, item: usize, value: Value) {
    let mut node = root;
    let keys: Vec<&str> = path.split('.').collect();
    for (i, key) in keys.iter().enumerate() {
        let last = i + 1 == keys.len();
        let (key, list) = match key.strip_suffix("[]") {
            Some(k) => (k, true),
            None => (*key, false),
        };
        if !node.is_object() {
            *node = Value::Object(Map::new());
        }
        let Value::Object(map) = node else {
            unreachable!()
        };
        let slot = map.entry(key.to_string()).or_insert(Value::Null);
        if list {
            if !slot.is_array() {
                *slot = Value::Array(Vec::new());
            }
            let Value::Array(items) = slot else {
                unreachable!()
            };
            while items.len() <= item {
                items.push(json!({}));
            }
            node = &mut items[item];
        } else {
            node = slot;
        }
        if last {
            *node = value;
            return;
        }
    }
}

/// An Armory-shaped config: keys at Armory's paths (and others) with values of any type.
fn armory_shaped() -> impl Strategy<Value = Value> {
    proptest::collection::vec((path(), 0usize..2, value()), 0..10).prop_map(|entries| {
        let mut root = json!({});
        for (path, item, value) in entries {
            insert(&mut root, &path, item, value);
        }
        root
    })
}

fn fixture(name: &str) -> (PathBuf, String) {
    let path = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures/armory")
        .join(name);
    let text = std::fs::read_to_string(&path).unwrap();
    (path, text)
}

/// One of Armory's documented files with lines dropped, repeated, or inserted (at any
/// indentation, any text).
fn edited_fixture() -> impl Strategy<Value = String> {
    let files = [
        "complete-manifest.armory-agent.yml",
        "mtls.armory-agent.yml",
        "permissions.armory-agent.yml",
    ];
    let edit = (0usize..40, 0u8..3, 0usize..8, ".{0,12}");
    (
        proptest::sample::select(files.to_vec()),
        proptest::collection::vec(edit, 0..4),
    )
        .prop_map(|(file, edits)| {
            let mut lines: Vec<String> = fixture(file).1.lines().map(str::to_string).collect();
            for (at, what, indent, text) in edits {
                let at = at % (lines.len() + 1);
                match what {
                    0 if at < lines.len() => {
                        lines.remove(at);
                    }
                    1 if at < lines.len() => {
                        let line = lines[at].clone();
                        lines.insert(at, line);
                    }
                    _ => lines.insert(at, format!("{}{text}", " ".repeat(indent))),
                }
            }
            lines.join("\n")
        })
}

/// Parses as the agent does at start-up and on every change; a refusal must be the parse
/// error that names the file and says what is wrong.
fn parse(main: Option<&str>, overlay: Option<&str>) {
    let files = ConfigFiles {
        main: main.map(|t| {
            (
                PathBuf::from("/etc/scale-agent/armory-agent.yaml"),
                t.to_string(),
            )
        }),
        overlay: overlay.map(|t| {
            (
                PathBuf::from("/etc/scale-agent/armory-agent-local.yml"),
                t.to_string(),
            )
        }),
    };
    if let Err(e) = parse_config_files(&files) {
        let message = e.to_string();
        assert!(
            matches!(e, scale_agent::Error::ParseConfig { .. }),
            "{message}"
        );
        assert!(
            message.contains("/etc/scale-agent/armory-agent"),
            "{message}"
        );
    }
}

proptest! {
    #![proptest_config(config())]

    #[test]
    fn armory_shaped_yaml_is_a_config_or_a_clear_error(doc in armory_shaped()) {
        // JSON is YAML (flow style).
        parse(Some(&doc.to_string()), None);
        parse(Some(&serde_json::to_string_pretty(&doc).unwrap()), None);
    }

    #[test]
    fn an_overlay_of_any_shape_is_a_config_or_a_clear_error(
        main in armory_shaped(),
        overlay in armory_shaped(),
    ) {
        parse(Some(&main.to_string()), Some(&overlay.to_string()));
        parse(None, Some(&overlay.to_string()));
    }

    #[test]
    fn edited_armory_files_are_a_config_or_a_clear_error(text in edited_fixture()) {
        parse(Some(&text), None);
    }

    #[test]
    fn any_text_is_a_config_or_a_clear_error(text in ".{0,64}") {
        parse(Some(&text), None);
        parse(Some("clouddriver:\n  grpc: h:1\n"), Some(&text));
    }
}
