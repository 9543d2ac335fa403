//! "Deploying through the hub": what Spinnaker does through the hub's operations API. Each
//! scripted operation (apply, a change, scale, rollout history and undo, delete) is a `POST`
//! over HTTPS to `/api/v1/accounts/<account>/operations`; the hub hands it to a connected
//! agent, which runs it as its ServiceAccount. The cluster's side is read with the admin
//! client.

use std::{collections::BTreeSet, io::Write, time::Duration};

use k8s_openapi::api::{
    apps::v1::{Deployment, ReplicaSet},
    core::v1::{Pod, Service},
};
use kube::{Api, Client, api::ListParams};
use serde_json::{Value, json};

use super::{
    ACCOUNT, APPS_NAMESPACE, SCALE_AGENT,
    hub::Hub,
    support::{line, text, wait_for},
};
use crate::error::{Error, Result};

/// The sample application deployed through the hub, in [`APPS_NAMESPACE`].
pub const APP: &str = "hello";
/// Its image, without the tag.
pub const APP_IMAGE: &str = "registry.example/hello";

/// How long the hub may take to answer one operation.
const OPERATION_TIMEOUT: Duration = Duration::from_secs(60);

/// The whole step, one scripted operation after the other. Returns the id of the last
/// operation (the "Ready" block shows how to look it up).
pub(super) async fn deploy_through_hub(
    client: &Client,
    hub: &Hub,
    out: &mut dyn Write,
) -> Result<String> {
    line(
        out,
        format!(
            "==> Deploying through the hub (what Spinnaker does): each operation is a POST to {}{}; the hub hands it to a connected agent, which runs it as ServiceAccount {SCALE_AGENT}-agent (ScaleAgent access Deploy; with ReadOnly these would answer 403 Forbidden)",
            hub.url,
            Operations::path()
        ),
    );
    let mut ops = Operations {
        hub,
        shown: BTreeSet::new(),
        last_id: String::new(),
    };
    let first = deploy(client, &mut ops, out).await?;
    change_image(client, &mut ops, &first, out).await?;
    scale(client, &mut ops, out).await?;
    history_and_undo(client, &mut ops, out).await?;
    delete(client, &mut ops, out).await?;
    Ok(ops.last_id)
}

fn image(tag: &str) -> String {
    format!("{APP_IMAGE}:{tag}")
}

fn resource_version(object: &Value) -> String {
    text(&object["metadata"]["resourceVersion"])
}

/// (1) Server-side apply of the Deployment and its Service; returns revision 1's
/// ReplicaSet.
async fn deploy(client: &Client, ops: &mut Operations<'_>, out: &mut dyn Write) -> Result<String> {
    let v1 = image("1.0");
    ops.submit(
        out,
        &format!("apply (server-side) Deployment {APP} ({v1}, 1 replica, strategy Recreate) and Service {APP} in {APPS_NAMESPACE}"),
        json!({
            "type": "apply", "serverSide": true, "fieldManager": "spinnaker",
            "manifests": [app_deployment("1.0"), app_service()],
        }),
        |r| {
            format!(
                "resourceVersion {} (Deployment), {} (Service)",
                resource_version(result_object(r, "Deployment")),
                resource_version(result_object(r, "Service"))
            )
        },
    )
    .await?;
    let first = wait_for_revision(client, "1", &v1, 1).await?;
    line(
        out,
        format!(
            "      revision 1: ReplicaSet {first} runs {v1} (its Pod is KWOK's: reported Running, no container runs)"
        ),
    );
    Ok(first)
}

/// (2) A change: a second revision, replacing `first`.
async fn change_image(
    client: &Client,
    ops: &mut Operations<'_>,
    first: &str,
    out: &mut dyn Write,
) -> Result<()> {
    let v2 = image("1.1");
    ops.submit(
        out,
        &format!("apply (server-side) Deployment {APP} with image {v2}"),
        json!({
            "type": "apply", "serverSide": true, "fieldManager": "spinnaker",
            "manifest": app_deployment("1.1"),
        }),
        |r| {
            let deployment = result_object(r, "Deployment");
            format!(
                "resourceVersion {}, image {}",
                resource_version(deployment),
                text(&deployment["spec"]["template"]["spec"]["containers"][0]["image"])
            )
        },
    )
    .await?;
    let second = wait_for_revision(client, "2", &v2, 1).await?;
    line(
        out,
        format!("      revision 2: ReplicaSet {second} runs {v2}; {first} scaled to 0"),
    );
    Ok(())
}

/// (3) Scale to 3; the ReplicaSet follows.
async fn scale(client: &Client, ops: &mut Operations<'_>, out: &mut dyn Write) -> Result<()> {
    ops.submit(
        out,
        &format!("scale Deployment {APP} to 3"),
        json!({
            "type": "scale", "kind": "deployment", "namespace": APPS_NAMESPACE,
            "name": APP, "replicas": 3,
        }),
        |r| {
            format!(
                "replicas {}",
                text(&result_object(r, "Deployment")["spec"]["replicas"])
            )
        },
    )
    .await?;
    let scaled = wait_for_revision(client, "2", &image("1.1"), 3).await?;
    line(
        out,
        format!(
            "      ReplicaSet {scaled} follows: replicas 3, 3 Pods created (kube-controller-manager)"
        ),
    );
    Ok(())
}

/// (4) Rollout history, and undo to revision 1.
async fn history_and_undo(
    client: &Client,
    ops: &mut Operations<'_>,
    out: &mut dyn Write,
) -> Result<()> {
    ops.submit(
        out,
        &format!("rollout history Deployment {APP}"),
        json!({
            "type": "rollout", "action": "history", "kind": "deployment",
            "namespace": APPS_NAMESPACE, "name": APP,
        }),
        |r| {
            let revisions: Vec<&str> = r["text"]
                .as_str()
                .unwrap_or_default()
                .lines()
                .filter_map(|l| l.split_whitespace().next())
                .filter(|w| w.parse::<u64>().is_ok())
                .collect();
            format!("revisions {}", revisions.join(", "))
        },
    )
    .await?;
    ops.submit(
        out,
        &format!("rollout undo Deployment {APP} to revision 1"),
        json!({
            "type": "rollout", "action": "undo", "kind": "deployment",
            "namespace": APPS_NAMESPACE, "name": APP, "toRevision": 1,
        }),
        |r| {
            format!(
                "{}, image {}",
                text(&r["text"]),
                text(&result_object(r, "Deployment")["spec"]["template"]["spec"]["containers"][0]["image"])
            )
        },
    )
    .await?;
    let back = wait_for_revision(client, "3", &image("1.0"), 3).await?;
    let deployment = Api::<Deployment>::namespaced(client.clone(), APPS_NAMESPACE)
        .get(APP)
        .await?;
    line(
        out,
        format!(
            "      the API server: Deployment {APP} image {}, revision {} (revision 1's template again), ReplicaSet {back} back at 3 replicas",
            deployment_image(&deployment),
            revision_of(&deployment)
        ),
    );
    Ok(())
}

/// (5) Delete the Deployment (waiting for the foreground deletion to finish) and the
/// Service, then check that nothing of the application is left.
async fn delete(client: &Client, ops: &mut Operations<'_>, out: &mut dyn Write) -> Result<()> {
    let deleted = |r: &Value| {
        let names: Vec<String> = r["deleted"]
            .as_array()
            .cloned()
            .unwrap_or_default()
            .iter()
            .map(text)
            .collect();
        format!("deleted {}", names.join(", "))
    };
    ops.submit(
        out,
        &format!("delete Deployment {APP} (propagation Foreground, wait)"),
        json!({
            "type": "delete", "kind": "deployment", "namespace": APPS_NAMESPACE, "name": APP,
            "propagationPolicy": "Foreground", "wait": true, "timeoutSeconds": 45,
        }),
        deleted,
    )
    .await?;
    ops.submit(
        out,
        &format!("delete Service {APP} (wait)"),
        json!({
            "type": "delete", "kind": "service", "namespace": APPS_NAMESPACE, "name": APP,
            "wait": true,
        }),
        deleted,
    )
    .await?;
    let selector = ListParams::default().labels(&format!("app={APP}"));
    wait_for("the sample application's objects to be gone", || async {
        let deployments = Api::<Deployment>::namespaced(client.clone(), APPS_NAMESPACE)
            .list(&selector)
            .await?
            .items
            .len();
        let replica_sets = Api::<ReplicaSet>::namespaced(client.clone(), APPS_NAMESPACE)
            .list(&selector)
            .await?
            .items
            .len();
        let pods = Api::<Pod>::namespaced(client.clone(), APPS_NAMESPACE)
            .list(&selector)
            .await?
            .items
            .len();
        let services = Api::<Service>::namespaced(client.clone(), APPS_NAMESPACE)
            .list(&selector)
            .await?
            .items
            .len();
        Ok((deployments + replica_sets + pods + services == 0).then_some(()))
    })
    .await?;
    line(
        out,
        format!(
            "      the API server: no Deployment, ReplicaSet, Pod or Service app={APP} left in {APPS_NAMESPACE}"
        ),
    );
    Ok(())
}

/// The sample application's Deployment. Strategy Recreate: the old ReplicaSet is at 0
/// before the new one is created, so each revision change is one step whose end
/// [`wait_for_revision`] can recognise and the narration can state.
fn app_deployment(tag: &str) -> Value {
    json!({
        "apiVersion": "apps/v1", "kind": "Deployment",
        "metadata": { "name": APP, "namespace": APPS_NAMESPACE, "labels": { "app": APP } },
        "spec": {
            "replicas": 1,
            "strategy": { "type": "Recreate" },
            "selector": { "matchLabels": { "app": APP } },
            "template": {
                "metadata": { "labels": { "app": APP } },
                "spec": { "containers": [{
                    "name": APP,
                    "image": image(tag),
                    "ports": [{ "containerPort": 8080 }],
                }] },
            },
        },
    })
}

fn app_service() -> Value {
    json!({
        "apiVersion": "v1", "kind": "Service",
        "metadata": { "name": APP, "namespace": APPS_NAMESPACE, "labels": { "app": APP } },
        "spec": { "selector": { "app": APP }, "ports": [{ "port": 80, "targetPort": 8080 }] },
    })
}

/// Submits operations to the hub's HTTP API for [`ACCOUNT`], one narrated line each.
struct Operations<'a> {
    hub: &'a Hub,
    /// Operation types whose curl command was shown.
    shown: BTreeSet<String>,
    /// The id of the latest operation.
    last_id: String,
}

impl Operations<'_> {
    fn path() -> String {
        format!("/api/v1/accounts/{ACCOUNT}/operations")
    }

    /// Submits `body`; prints `label`, the HTTP status, the state, who ran it and
    /// `summary(response)`, plus the curl command the first time of each operation type.
    /// Anything but a success is an error.
    async fn submit(
        &mut self,
        out: &mut dyn Write,
        label: &str,
        body: Value,
        summary: impl FnOnce(&Value) -> String,
    ) -> Result<Value> {
        let path = Self::path();
        let (status, response) = self.hub.post_json(&path, &body, OPERATION_TIMEOUT).await?;
        let state = text(&response["state"]);
        if !(200..300).contains(&status) || state != "succeeded" {
            line(
                out,
                format!(
                    "    {label}: HTTP {status} {state}: {}",
                    response["status"]["message"]
                        .as_str()
                        .or(response["message"].as_str())
                        .unwrap_or_default()
                ),
            );
            return Err(Error::Http {
                method: "POST".into(),
                url: format!("{}{path}", self.hub.url),
                message: format!("{label}: HTTP {status} {state}: {response}"),
            });
        }
        self.last_id = text(&response["id"]);
        line(
            out,
            format!(
                "    {label}: HTTP {status} {state} (agent {}); {}",
                text(&response["replica"]),
                summary(&response)
            ),
        );
        let kind = match body["action"].as_str() {
            Some(action) => format!("{} {action}", text(&body["type"])),
            None => text(&body["type"]),
        };
        if self.shown.insert(kind) {
            line(
                out,
                format!(
                    "      curl -sS --cacert {} -X POST {}{path} {} -H 'Content-Type: application/json' -d '{}'",
                    self.hub.ca_file.display(),
                    self.hub.url,
                    self.hub.authorization(),
                    body.to_string().replace('\'', "'\\''")
                ),
            );
        }
        Ok(response)
    }
}

/// The result object of `kind` in an operation's answer.
fn result_object<'a>(response: &'a Value, kind: &str) -> &'a Value {
    response["objects"]
        .as_array()
        .and_then(|objects| objects.iter().find(|o| o["kind"] == kind))
        .unwrap_or(&Value::Null)
}

fn deployment_image(deployment: &Deployment) -> String {
    deployment
        .spec
        .template
        .spec
        .as_ref()
        .and_then(|p| p.containers.first())
        .and_then(|c| c.image.clone())
        .unwrap_or_default()
}

fn replica_set_image(replica_set: &ReplicaSet) -> String {
    replica_set
        .spec
        .template
        .as_ref()
        .and_then(|t| t.spec.as_ref())
        .and_then(|p| p.containers.first())
        .and_then(|c| c.image.clone())
        .unwrap_or_default()
}

fn revision_of(deployment: &Deployment) -> String {
    deployment
        .metadata
        .annotations
        .as_ref()
        .and_then(|a| a.get("deployment.kubernetes.io/revision"))
        .cloned()
        .unwrap_or_default()
}

/// Waits until the Deployment is at `revision`, its ReplicaSet running `image` wants
/// `replicas` and has created them, and its other ReplicaSets are scaled to 0 (strategy
/// Recreate); returns that ReplicaSet's name.
async fn wait_for_revision(
    client: &Client,
    revision: &str,
    image: &str,
    replicas: i32,
) -> Result<String> {
    let deployments = Api::<Deployment>::namespaced(client.clone(), APPS_NAMESPACE);
    let replica_sets = Api::<ReplicaSet>::namespaced(client.clone(), APPS_NAMESPACE);
    wait_for(
        &format!("Deployment {APP} revision {revision} with {replicas} replica(s) of {image}"),
        || async {
            let deployment = deployments.get(APP).await?;
            if revision_of(&deployment) != revision || deployment_image(&deployment) != image {
                return Ok(None);
            }
            let list = replica_sets
                .list(&ListParams::default().labels(&format!("app={APP}")))
                .await?;
            let (current, old): (Vec<&ReplicaSet>, Vec<&ReplicaSet>) = list
                .items
                .iter()
                .partition(|rs| replica_set_image(rs) == image);
            let created = |rs: &ReplicaSet, n: i32| {
                rs.spec.replicas == Some(n) && rs.status.as_ref().map(|s| s.replicas) == Some(n)
            };
            Ok(match current.as_slice() {
                [rs] if created(rs, replicas) && old.iter().all(|rs| created(rs, 0)) => {
                    rs.metadata.name.clone()
                }
                _ => None,
            })
        },
    )
    .await
}
