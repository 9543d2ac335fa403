//! Reading Armory's files: agent configs, their `*-local` overlays (merged key by key) and
//! the Kubernetes manifests that run the agent, sorted into an [`ArmoryInput`].

use std::path::{Path, PathBuf};

use serde_json::Value;

use super::ArmoryInput;
use crate::config::{merge_values, yaml_value};
use crate::error::{Error, Result};

/// Names of the agent's config file in Armory's ConfigMap (and on disk), the overlay's last.
const CONFIG_KEYS: &[&str] = &[
    "armory-agent.yml",
    "armory-agent.yaml",
    "kubesvc.yml",
    "kubesvc.yaml",
];
const OVERLAY_KEYS: &[&str] = &["armory-agent-local.yml", "armory-agent-local.yaml"];

/// Reads Armory's files: agent configs (`armory-agent.yml`, `*-local.yml` overlays) and
/// Kubernetes manifests (the config ConfigMap, the Deployment, ClusterRoles and Roles),
/// several documents per file allowed.
pub fn read_input(paths: &[PathBuf]) -> Result<ArmoryInput> {
    let mut files = Vec::new();
    for path in paths {
        let text = std::fs::read_to_string(path).map_err(|source| Error::ReadFile {
            what: "Armory file",
            path: path.clone(),
            source,
        })?;
        files.push((path.clone(), text));
    }
    parse_input(&files)
}

fn is_overlay_name(path: &Path) -> bool {
    path.file_stem()
        .is_some_and(|stem| stem.to_string_lossy().ends_with("-local"))
}

/// Sorts the documents of the files read into config, overlays and manifests.
pub fn parse_input(files: &[(PathBuf, String)]) -> Result<ArmoryInput> {
    let mut input = ArmoryInput::default();
    let mut configs: Vec<(String, Value)> = Vec::new();
    let mut overlays: Vec<(String, Value)> = Vec::new();
    for (path, text) in files {
        let documents: Vec<Value> =
            serde_saphyr::from_multiple(text).map_err(|e| Error::ParseConfig {
                path: path.clone(),
                message: e.to_string(),
            })?;
        for document in documents.into_iter().filter(|d| !d.is_null()) {
            let kind = document.get("kind").and_then(Value::as_str);
            let is_manifest = kind.is_some() && document.get("apiVersion").is_some();
            if !is_manifest {
                let shown = path.display().to_string();
                if is_overlay_name(path) {
                    overlays.push((shown, document));
                } else {
                    configs.push((shown, document));
                }
                continue;
            }
            let name = document
                .pointer("/metadata/name")
                .and_then(Value::as_str)
                .unwrap_or_default()
                .to_owned();
            if let Some(namespace) = document
                .pointer("/metadata/namespace")
                .and_then(Value::as_str)
            {
                input.namespace.get_or_insert_with(|| namespace.to_owned());
            }
            match kind.unwrap_or_default() {
                "ConfigMap" => {
                    let data = document.get("data");
                    let mut used = false;
                    for (keys, into) in [(CONFIG_KEYS, &mut configs), (OVERLAY_KEYS, &mut overlays)]
                    {
                        for key in keys {
                            if let Some(text) =
                                data.and_then(|d| d.get(*key)).and_then(Value::as_str)
                            {
                                let shown = format!("ConfigMap {name} key {key}");
                                into.push((shown, yaml_value(path, text)?));
                                used = true;
                            }
                        }
                    }
                    if !used {
                        input.skipped.push(format!("ConfigMap {name}"));
                    }
                }
                "Deployment" => input.deployment = Some(document),
                "ClusterRole" | "Role" => input.roles.push(document),
                other => input.skipped.push(format!("{other} {name}")),
            }
        }
    }
    let mut config = Value::Null;
    for (source, value) in configs.into_iter().chain(overlays) {
        merge_values(&mut config, value);
        input.sources.push(source);
    }
    input.config = config;
    Ok(input)
}
