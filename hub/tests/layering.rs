//! The hub's crates depend one way. Cargo already refuses a cycle between crates; this test
//! also refuses an arrow that points sideways or up the layers of the hub's README
//! ("Architecture"), so a crate cannot quietly grow a dependency on a part it should not know.
//! It reads the workspace with `cargo metadata` (offline, no dependencies resolved).

#![allow(clippy::expect_used)]

use std::{collections::BTreeMap, process::Command};

use serde_json::Value;

/// Each hub crate and its layer: a crate may depend only on crates of lower layers. The
/// facade (`scale-agent-hub`, the wiring and the binary) is the top and may use them all.
const LAYERS: &[(&str, u32)] = &[
    ("scale-agent-hub-model", 0),
    ("scale-agent-hub-cache", 1),
    ("scale-agent-hub-net", 1),
    ("scale-agent-hub-state", 2),
    ("scale-agent-hub-auth", 2),
    ("scale-agent-hub-store", 2),
    ("scale-agent-hub-clouddriver", 3),
    ("scale-agent-hub-replicas", 3),
    ("scale-agent-hub-operations", 3),
    ("scale-agent-hub-proxy", 4),
    ("scale-agent-hub-grpc", 4),
    ("scale-agent-hub-api", 5),
    ("scale-agent-hub", 6),
];

fn workspace() -> Value {
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
    let out = Command::new(cargo)
        .args([
            "metadata",
            "--format-version",
            "1",
            "--no-deps",
            "--offline",
        ])
        .current_dir(env!("CARGO_MANIFEST_DIR"))
        .output()
        .expect("cargo metadata runs");
    assert!(
        out.status.success(),
        "cargo metadata: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout).expect("cargo metadata prints JSON")
}

/// Each workspace package named `scale-agent-hub*`, with the hub crates it depends on for
/// its library and binaries (dev-dependencies are the tests', which may use anything).
fn hub_crates() -> BTreeMap<String, Vec<String>> {
    let metadata = workspace();
    let packages = metadata["packages"].as_array().expect("packages");
    packages
        .iter()
        .filter_map(|p| {
            let name = p["name"].as_str()?;
            name.starts_with("scale-agent-hub").then(|| {
                let deps = p["dependencies"]
                    .as_array()
                    .into_iter()
                    .flatten()
                    .filter(|d| d["kind"].is_null() || d["kind"] == "build")
                    .filter_map(|d| d["name"].as_str())
                    .filter(|d| d.starts_with("scale-agent-hub"))
                    .map(str::to_string)
                    .collect();
                (name.to_string(), deps)
            })
        })
        .collect()
}

fn layer(name: &str) -> Option<u32> {
    LAYERS.iter().find(|(n, _)| *n == name).map(|(_, l)| *l)
}

#[test]
fn every_hub_crate_has_a_layer_and_depends_only_on_lower_ones() {
    let crates = hub_crates();
    assert!(
        crates.contains_key("scale-agent-hub") && crates.contains_key("scale-agent-hub-model"),
        "the workspace lists the hub's crates: {crates:?}"
    );
    let mut wrong = Vec::new();
    for (name, deps) in &crates {
        let Some(own) = layer(name) else {
            wrong.push(format!(
                "{name} has no layer: add it to LAYERS here and to the hub README's table"
            ));
            continue;
        };
        for dep in deps {
            match layer(dep) {
                Some(l) if l < own => {}
                Some(l) => wrong.push(format!(
                    "{name} (layer {own}) depends on {dep} (layer {l}): a crate may use only \
                     lower layers; move what it needs down, or pass it in (a handle or a trait)"
                )),
                None => wrong.push(format!("{name} depends on {dep}, which has no layer")),
            }
        }
    }
    assert!(wrong.is_empty(), "{}", wrong.join("\n"));
}

#[test]
fn nothing_outside_the_hub_reaches_past_its_facade() {
    // The agent and the operator never use the hub; e2e, bench and the test kit use its
    // facade (`scale_agent_hub::…`), which re-exports what they need.
    let metadata = workspace();
    let packages = metadata["packages"].as_array().expect("packages");
    let mut wrong = Vec::new();
    for p in packages {
        let name = p["name"].as_str().unwrap_or_default();
        if name.starts_with("scale-agent-hub") {
            continue;
        }
        for d in p["dependencies"].as_array().into_iter().flatten() {
            let dep = d["name"].as_str().unwrap_or_default();
            if dep.starts_with("scale-agent-hub-") {
                wrong.push(format!(
                    "{name} depends on {dep}: use scale-agent-hub's re-export"
                ));
            }
        }
    }
    assert!(wrong.is_empty(), "{}", wrong.join("\n"));
}
