//! Installing the CustomResourceDefinitions generated into `manifests/crds/`.

use std::{
    path::{Path, PathBuf},
    time::Duration,
};

use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::{
    Client,
    api::{Api, Patch, PatchParams},
    runtime::wait::{await_condition, conditions},
};

use crate::error::{Error, Result, io_err};

/// Field manager for everything the harness applies.
pub const FIELD_MANAGER: &str = "scale-agent-e2e";

/// `manifests/crds/` of this checkout.
pub fn manifests_dir() -> PathBuf {
    crate::repo_root().join("manifests").join("crds")
}

/// Reads every `*.yaml` CRD in `dir` (not its `kustomization.yaml`), sorted by file name.
pub fn read_crds(dir: &Path) -> Result<Vec<CustomResourceDefinition>> {
    let mut paths: Vec<PathBuf> = std::fs::read_dir(dir)
        .map_err(io_err(format!("read {}", dir.display())))?
        .filter_map(|entry| entry.ok().map(|e| e.path()))
        .filter(|path| path.extension().is_some_and(|ext| ext == "yaml"))
        .filter(|path| !path.ends_with("kustomization.yaml"))
        .collect();
    paths.sort();
    paths
        .iter()
        .map(|path| {
            let text = std::fs::read_to_string(path)
                .map_err(io_err(format!("read {}", path.display())))?;
            serde_saphyr::from_str(&text).map_err(|e| Error::Manifest {
                path: path.clone(),
                message: e.to_string(),
            })
        })
        .collect()
}

/// A namespaced custom resource `plural.group`, version `v1`, with no schema (every field
/// kept): a kind of a test's own (list kind `<kind>List`, singular the lower-case kind).
pub fn schemaless_crd(group: &str, kind: &str, plural: &str) -> CustomResourceDefinition {
    use k8s_openapi::{
        apiextensions_apiserver::pkg::apis::apiextensions::v1::{
            CustomResourceDefinitionNames, CustomResourceDefinitionSpec,
            CustomResourceDefinitionVersion, CustomResourceValidation, JSONSchemaProps,
        },
        apimachinery::pkg::apis::meta::v1::ObjectMeta,
    };
    CustomResourceDefinition {
        metadata: ObjectMeta {
            name: Some(format!("{plural}.{group}")),
            ..Default::default()
        },
        spec: CustomResourceDefinitionSpec {
            group: group.to_string(),
            names: CustomResourceDefinitionNames {
                kind: kind.to_string(),
                list_kind: Some(format!("{kind}List")),
                plural: plural.to_string(),
                singular: Some(kind.to_ascii_lowercase()),
                ..Default::default()
            },
            scope: "Namespaced".to_string(),
            versions: vec![CustomResourceDefinitionVersion {
                name: "v1".to_string(),
                served: true,
                storage: true,
                schema: Some(CustomResourceValidation {
                    open_api_v3_schema: Some(JSONSchemaProps {
                        type_: Some("object".to_string()),
                        x_kubernetes_preserve_unknown_fields: Some(true),
                        ..Default::default()
                    }),
                }),
                ..Default::default()
            }],
            ..Default::default()
        },
        status: None,
    }
}

/// Applies `crds` (server-side apply) and waits until the apiserver serves each of them.
/// Returns their names.
pub async fn install(client: &Client, crds: &[CustomResourceDefinition]) -> Result<Vec<String>> {
    let api = Api::<CustomResourceDefinition>::all(client.clone());
    let params = PatchParams::apply(FIELD_MANAGER).force();
    let mut names = Vec::new();
    for crd in crds {
        let name = crd.metadata.name.clone().unwrap_or_default();
        api.patch(&name, &params, &Patch::Apply(crd)).await?;
        names.push(name);
    }
    for name in &names {
        let established = await_condition(api.clone(), name, conditions::is_crd_established());
        tokio::time::timeout(Duration::from_secs(30), established)
            .await
            .map_err(|_| Error::Timeout {
                what: format!("CustomResourceDefinition {name} to be established"),
                secs: 30,
            })?
            .map_err(|e| Error::Timeout {
                what: format!("CustomResourceDefinition {name} to be established ({e})"),
                secs: 30,
            })?;
    }
    Ok(names)
}
