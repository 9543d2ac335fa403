//! The RBAC the operator generates covers the documented operations (issue 17, item 2):
//! on a real control plane (with kube-controller-manager, so Deployments have ReplicaSets and
//! StatefulSets ControllerRevisions), an in-process operator makes a `ReadOnly` and a
//! `Deploy` ScaleAgent; an agent for each runs with a TokenRequest token of the ServiceAccount
//! the operator made (so exactly the generated RBAC applies) against a real hub, and every
//! operation of the hub's operations API is run through each: it succeeds, or is refused with
//! the API server's 403 where the access level documents it; then kubectl runs the same kinds
//! of commands through the hub's Kubernetes API proxy (exec included), and a
//! SubjectAccessReview checks exec, attach and port-forward. Also: an account deploys a kind
//! it does not watch (`deployKinds`), each scope namespace's Role holds only what its own
//! accounts need, and an account naming a namespace outside the scope is refused with what to
//! change.

use std::{path::Path, time::Duration};

use k8s_openapi::api::{
    apps::v1::{Deployment, ReplicaSet, StatefulSet},
    authorization::v1::{ResourceAttributes, SubjectAccessReview, SubjectAccessReviewSpec},
    core::v1::{ConfigMap, Secret, Service},
    rbac::v1::Role,
};
use kube::{
    Api, Client,
    api::{ListParams, Patch, PatchParams, PostParams},
};
use scale_agent_crds::{
    AgentAccount,
    agent_config::AgentConfig,
    conditions::{ACCEPTED, find_condition},
};
use scale_agent_e2e::{
    ControlPlane, ControlPlaneOptions, crds,
    fixtures::{self, TlsHub},
    kubectl::Kubectl,
    operator::Operator,
    wait::{EVERY, wait_for_within},
};
use serde_json::{Value, json};

/// Generous: two cores are shared by many builds and tests.
const TIMEOUT: Duration = Duration::from_secs(180);
const HTTP_TIMEOUT: Duration = Duration::from_secs(300);
const KUBECTL_TIMEOUT: Duration = Duration::from_secs(180);

/// The kinds both accounts watch (and the Deploy account deploys, with Jobs besides).
const KINDS: &[&str] = &["Deployment", "StatefulSet", "ConfigMap", "Secret", "Pod"];

fn control_plane() -> anyhow::Result<&'static ControlPlane> {
    Ok(ControlPlane::shared_with(|| {
        ControlPlaneOptions::default().with_controller_manager()
    })?)
}

async fn apply(client: &Client, namespace: &str, value: Value) -> anyhow::Result<()> {
    let api_version = value["apiVersion"].as_str().unwrap_or_default();
    let kind = value["kind"].as_str().unwrap_or_default();
    let name = value["metadata"]["name"].as_str().unwrap_or_default();
    let (group, version) = api_version.split_once('/').unwrap_or(("", api_version));
    let gvk = kube::api::GroupVersionKind::gvk(group, version, kind);
    let (resource, _) = kube::discovery::pinned_kind(client, &gvk).await?;
    let api: Api<kube::api::DynamicObject> =
        Api::namespaced_with(client.clone(), namespace, &resource);
    api.patch(
        name,
        &PatchParams::apply("scale-agent-e2e").force(),
        &Patch::Apply(&value),
    )
    .await?;
    Ok(())
}

/// A kubectl command run through the proxy: (what, args, stdin, allowed with `ReadOnly`,
/// allowed with `Deploy`).
type KubectlCommand<'a> = (&'a str, Vec<String>, Option<&'a str>, bool, bool);

fn args(list: &[&str]) -> Vec<String> {
    list.iter().map(|s| s.to_string()).collect()
}

fn scale_agent(name: &str, access: &str, scope: &[&str]) -> Value {
    json!({
        "apiVersion": "scaleagent.dev/v1alpha1", "kind": "ScaleAgent",
        "metadata": { "name": name },
        "spec": {
            "hub": { "address": "127.0.0.1:9", "tls": { "insecurePlaintext": true } },
            "access": access,
            "replicas": 1,
            "scope": { "type": "Namespaces", "namespaces": scope },
        },
    })
}

fn agent_account(name: &str, spec: Value) -> Value {
    json!({
        "apiVersion": "scaleagent.dev/v1alpha1", "kind": "AgentAccount",
        "metadata": { "name": name },
        "spec": spec,
    })
}

fn deployment(ns: &str, name: &str, image: &str) -> Value {
    json!({
        "apiVersion": "apps/v1", "kind": "Deployment",
        "metadata": { "name": name, "namespace": ns },
        "spec": {
            "replicas": 1,
            "selector": { "matchLabels": { "app": name } },
            "template": {
                "metadata": { "labels": { "app": name } },
                "spec": { "containers": [{ "name": "main", "image": image }] },
            },
        },
    })
}

fn stateful_set(ns: &str, name: &str, image: &str) -> Value {
    let mut value = deployment(ns, name, image);
    value["kind"] = json!("StatefulSet");
    value["spec"]["serviceName"] = json!(name);
    value
}

fn configmap(ns: &str, name: &str) -> Value {
    json!({
        "apiVersion": "v1", "kind": "ConfigMap",
        "metadata": { "name": name, "namespace": ns },
        "data": { "written-by": "spinnaker" },
    })
}

fn secret(ns: &str, name: &str, value: &str) -> Value {
    json!({
        "apiVersion": "v1", "kind": "Secret",
        "metadata": { "name": name, "namespace": ns },
        "stringData": { "password": value },
    })
}

fn job(ns: &str, name: &str) -> Value {
    json!({
        "apiVersion": "batch/v1", "kind": "Job",
        "metadata": { "name": name, "namespace": ns },
        "spec": { "template": { "spec": {
            "restartPolicy": "Never",
            "containers": [{ "name": "main", "image": "registry.example/job:1" }],
        } } },
    })
}

/// What an operation must give under an access level.
#[derive(Clone, Copy, Debug)]
enum Expect {
    /// Success with this HTTP status.
    Ok(u16),
    /// The API server's 403, naming the agent's ServiceAccount.
    Forbidden,
}

/// Every operation the hub's operations API documents, against the objects the test made:
/// (what, body, expected with `ReadOnly`, expected with `Deploy`). Run in this order; the
/// writes of the Deploy run build on each other.
fn operations(ns: &str) -> Vec<(&'static str, Value, Expect, Expect)> {
    use Expect::{Forbidden, Ok};
    let target = |kind: &str, name: &str| json!({"kind": kind, "namespace": ns, "name": name});
    let with = |mut base: Value, extra: Value| {
        if let (Some(base), Some(extra)) = (base.as_object_mut(), extra.as_object()) {
            base.extend(extra.clone());
        }
        base
    };
    let rollout = |action: &str, kind: &str, name: &str| {
        with(
            target(kind, name),
            json!({"type": "rollout", "action": action}),
        )
    };
    vec![
        // Reads.
        (
            "get",
            with(target("Deployment", "web"), json!({"type": "get"})),
            Ok(200),
            Ok(200),
        ),
        (
            "list",
            json!({"type": "list", "kind": "ConfigMap", "namespace": ns}),
            Ok(200),
            Ok(200),
        ),
        (
            "events",
            with(target("Deployment", "web"), json!({"type": "events"})),
            Ok(200),
            Ok(200),
        ),
        (
            "logs of a Deployment",
            with(
                target("Deployment", "web"),
                json!({"type": "logs", "tailLines": 10}),
            ),
            Ok(200),
            Ok(200),
        ),
        (
            "rollout history of a Deployment",
            rollout("history", "Deployment", "web"),
            Ok(200),
            Ok(200),
        ),
        (
            "rollout history of a StatefulSet",
            rollout("history", "StatefulSet", "db"),
            Ok(200),
            Ok(200),
        ),
        (
            "rollout status",
            rollout("status", "Deployment", "web"),
            Ok(200),
            Ok(200),
        ),
        // ReadOnly watches Secrets as metadata and may not read one; Deploy may.
        (
            "get a Secret",
            with(target("Secret", "creds"), json!({"type": "get"})),
            Forbidden,
            Ok(200),
        ),
        // Writes.
        (
            "server-side apply",
            json!({"type": "apply", "serverSide": true, "fieldManager": "spinnaker", "manifest": configmap(ns, "by-ssa")}),
            Forbidden,
            Ok(200),
        ),
        (
            "client-side apply",
            json!({"type": "apply", "serverSide": false, "manifest": configmap(ns, "by-csa")}),
            Forbidden,
            Ok(200),
        ),
        (
            "client-side apply again",
            json!({"type": "apply", "serverSide": false, "manifest": configmap(ns, "by-csa")}),
            Forbidden,
            Ok(200),
        ),
        (
            "create",
            json!({"type": "create", "manifest": configmap(ns, "by-create")}),
            Forbidden,
            Ok(201),
        ),
        (
            "replace",
            json!({"type": "replace", "manifest": configmap(ns, "existing")}),
            Forbidden,
            Ok(200),
        ),
        (
            "merge patch",
            with(
                target("ConfigMap", "existing"),
                json!({"type": "patch", "patchType": "merge", "patch": {"data": {"patched": "yes"}}}),
            ),
            Forbidden,
            Ok(200),
        ),
        (
            "json patch",
            with(
                target("ConfigMap", "existing"),
                json!({"type": "patch", "patchType": "json", "patch": [{"op": "add", "path": "/data/json", "value": "yes"}]}),
            ),
            Forbidden,
            Ok(200),
        ),
        (
            "strategic patch",
            with(
                target("Deployment", "web"),
                json!({"type": "patch", "patchType": "strategic", "patch": {"metadata": {"labels": {"patched": "yes"}}}}),
            ),
            Forbidden,
            Ok(200),
        ),
        (
            "apply patch",
            with(
                target("ConfigMap", "existing"),
                json!({"type": "patch", "patchType": "apply", "fieldManager": "spinnaker", "force": true, "patch": configmap(ns, "existing")}),
            ),
            Forbidden,
            Ok(200),
        ),
        (
            "server-side apply of a Secret",
            json!({"type": "apply", "serverSide": true, "manifest": secret(ns, "by-ssa", "one")}),
            Forbidden,
            Ok(200),
        ),
        (
            "client-side apply of a Secret",
            json!({"type": "apply", "serverSide": false, "manifest": secret(ns, "creds", "two")}),
            Forbidden,
            Ok(200),
        ),
        (
            "replace of a Secret",
            json!({"type": "replace", "manifest": secret(ns, "creds", "three")}),
            Forbidden,
            Ok(200),
        ),
        (
            "scale",
            with(
                target("Deployment", "web"),
                json!({"type": "scale", "replicas": 2}),
            ),
            Forbidden,
            Ok(200),
        ),
        (
            "scale with currentReplicas",
            with(
                target("Deployment", "web"),
                json!({"type": "scale", "replicas": 1, "currentReplicas": 2}),
            ),
            Forbidden,
            Ok(200),
        ),
        (
            "rollout pause",
            rollout("pause", "Deployment", "web"),
            Forbidden,
            Ok(200),
        ),
        (
            "rollout resume",
            rollout("resume", "Deployment", "web"),
            Forbidden,
            Ok(200),
        ),
        (
            "rollout restart",
            rollout("restart", "Deployment", "web"),
            Forbidden,
            Ok(200),
        ),
        (
            "rollout undo of a Deployment",
            with(
                rollout("undo", "Deployment", "web"),
                json!({"toRevision": 1}),
            ),
            Forbidden,
            Ok(200),
        ),
        (
            "rollout restart of a StatefulSet",
            rollout("restart", "StatefulSet", "db"),
            Forbidden,
            Ok(200),
        ),
        (
            "rollout undo of a StatefulSet",
            with(
                rollout("undo", "StatefulSet", "db"),
                json!({"toRevision": 1}),
            ),
            Forbidden,
            Ok(200),
        ),
        // Jobs are in the Deploy account's deployKinds, not in its kinds.
        (
            "apply of a Job, deployed but not watched",
            json!({"type": "apply", "manifest": job(ns, "migrate")}),
            Forbidden,
            Ok(200),
        ),
        // Documented refusals for both.
        (
            "patch of the status subresource",
            with(
                target("Deployment", "web"),
                json!({"type": "patch", "patchType": "merge", "subresource": "status", "patch": {"status": {"observedGeneration": 1}}}),
            ),
            Forbidden,
            Forbidden,
        ),
        (
            "apply of a kind neither watched nor deployable",
            json!({"type": "apply", "manifest": {"apiVersion": "v1", "kind": "Service", "metadata": {"name": "web", "namespace": ns}, "spec": {"ports": [{"port": 80}]}}}),
            Forbidden,
            Forbidden,
        ),
        (
            "delete, waiting",
            json!({"type": "delete", "kind": "ConfigMap", "namespace": ns, "name": "existing", "wait": true}),
            Forbidden,
            Ok(200),
        ),
        (
            "delete by label selector",
            json!({"type": "delete", "kind": "ConfigMap", "namespace": ns, "labelSelector": "doomed=yes"}),
            Forbidden,
            Ok(200),
        ),
        (
            "delete of a Secret",
            json!({"type": "delete", "kind": "Secret", "namespace": ns, "name": "by-ssa-seed"}),
            Forbidden,
            Ok(200),
        ),
    ]
}

/// Objects the operations act on, made by the admin: a Deployment and a StatefulSet with two
/// revisions each, ConfigMaps and Secrets.
async fn seed(admin: &Client, ns: &str) -> anyhow::Result<()> {
    for image in ["registry.example/web:1", "registry.example/web:2"] {
        apply(admin, ns, deployment(ns, "web", image)).await?;
        apply(admin, ns, stateful_set(ns, "db", image)).await?;
    }
    apply(admin, ns, configmap(ns, "existing")).await?;
    let mut doomed = configmap(ns, "doomed");
    doomed["metadata"]["labels"] = json!({"doomed": "yes"});
    apply(admin, ns, doomed).await?;
    apply(admin, ns, secret(ns, "creds", "zero")).await?;
    apply(admin, ns, secret(ns, "by-ssa-seed", "zero")).await?;
    let replica_sets: Api<ReplicaSet> = Api::namespaced(admin.clone(), ns);
    let revisions: Api<kube::api::DynamicObject> = Api::namespaced_with(
        admin.clone(),
        ns,
        &kube::api::ApiResource::from_gvk_with_plural(
            &kube::api::GroupVersionKind::gvk("apps", "v1", "ControllerRevision"),
            "controllerrevisions",
        ),
    );
    wait_for_within(
        "two revisions of the Deployment and the StatefulSet",
        TIMEOUT,
        EVERY,
        || {
            let (replica_sets, revisions) = (replica_sets.clone(), revisions.clone());
            async move {
                let web = ListParams::default().labels("app=web");
                let db = ListParams::default().labels("app=db");
                let sets = replica_sets.list(&web).await?.items.len();
                let revisions = revisions.list(&db).await?.items.len();
                Ok((sets >= 2 && revisions >= 2).then_some(()))
            }
        },
    )
    .await
}

/// The agent config the operator rendered for ScaleAgent `name`, with the account's
/// credentials pointed at `kubeconfig` (the pod would use the mounted token instead).
async fn rendered_accounts(
    admin: &Client,
    ns: &str,
    name: &str,
    kubeconfig: &Path,
) -> anyhow::Result<Value> {
    let configmap = Api::<ConfigMap>::namespaced(admin.clone(), ns)
        .get(&format!("{name}-agent"))
        .await?;
    let yaml = configmap
        .data
        .and_then(|d| d.get("scale-agent.yaml").cloned())
        .unwrap_or_default();
    let mut config = AgentConfig::from_yaml(&yaml)?;
    for account in &mut config.kubernetes.accounts {
        account.service_account = false;
        account.kubeconfig_file = Some(kubeconfig.display().to_string());
    }
    Ok(serde_json::to_value(&config.kubernetes.accounts)?)
}

async fn operation(hub: &TlsHub, account: &str, body: &Value) -> anyhow::Result<(u16, Value)> {
    let response = hub
        .api("POST", &format!("/api/v1/accounts/{account}/operations"))
        .json(body)
        .timeout(HTTP_TIMEOUT)
        .send()
        .await?;
    Ok((response.status, response.json_or_null()))
}

/// Whether the API server lets `user` do `verb` on `resource`/`subresource` in `ns`.
async fn allowed(
    admin: &Client,
    user: &str,
    ns: &str,
    verb: &str,
    resource: &str,
    subresource: &str,
) -> anyhow::Result<bool> {
    let review = SubjectAccessReview {
        spec: SubjectAccessReviewSpec {
            user: Some(user.into()),
            groups: Some(vec![
                "system:serviceaccounts".into(),
                "system:authenticated".into(),
            ]),
            resource_attributes: Some(ResourceAttributes {
                namespace: Some(ns.into()),
                verb: Some(verb.into()),
                resource: Some(resource.into()),
                subresource: Some(subresource.into()),
                ..Default::default()
            }),
            ..Default::default()
        },
        ..Default::default()
    };
    let answer = Api::<SubjectAccessReview>::all(admin.clone())
        .create(&PostParams::default(), &review)
        .await?;
    Ok(answer.status.is_some_and(|s| s.allowed))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_documented_operation_works_or_is_the_documented_403_for_each_access_level()
-> anyhow::Result<()> {
    scale_agent_e2e::fixtures::init_logs("warn");
    let control_plane = control_plane()?;
    let admin = control_plane.client().await?;
    crds::install(&admin, &crds::read_crds(&crds::manifests_dir())?).await?;
    let ns = control_plane.namespace(&admin, "rbac-ops").await?;
    let other = control_plane.namespace(&admin, "rbac-ops-other").await?;
    let dir = fixtures::temp_dir("scale-agent-e2e-rbac-ops")?;
    seed(&admin, &ns).await?;

    let operator = Operator::watching(admin.clone(), &ns);
    apply(&admin, &ns, scale_agent("ro", "ReadOnly", &[&ns])).await?;
    apply(&admin, &ns, scale_agent("deploy", "Deploy", &[&ns, &other])).await?;
    let ro_account = format!("{ns}-ro");
    let deploy_account = format!("{ns}-deploy");
    apply(
        &admin,
        &ns,
        agent_account(
            "ro",
            json!({"agentRef": "ro", "accountName": ro_account, "kinds": KINDS}),
        ),
    )
    .await?;
    let mut deploy_kinds = KINDS.to_vec();
    deploy_kinds.push("Job");
    apply(
        &admin,
        &ns,
        agent_account(
            "deploy",
            json!({
                "agentRef": "deploy", "accountName": deploy_account, "namespaces": [ns],
                "kinds": KINDS, "deployKinds": deploy_kinds,
                // kubectl apply of a Secret through the proxy reads and writes Secret data.
                "allowSecretData": true,
            }),
        ),
    )
    .await?;
    // A second account of the Deploy agent, in the other scope namespace only.
    apply(&admin, &ns, agent_account("services", json!({
        "agentRef": "deploy", "accountName": format!("{ns}-services"), "namespaces": [other],
        "kinds": ["Service"],
    }))).await?;
    // An account of the ReadOnly agent naming a namespace outside its scope.
    apply(
        &admin,
        &ns,
        agent_account(
            "stray",
            json!({
                "agentRef": "ro", "accountName": format!("{ns}-stray"), "namespaces": [other],
                "kinds": ["ConfigMap"],
            }),
        ),
    )
    .await?;

    // The stray account is refused, saying what to change.
    let accounts: Api<AgentAccount> = Api::namespaced(admin.clone(), &ns);
    let refused = wait_for_within(
        "the stray account's Accepted condition",
        TIMEOUT,
        EVERY,
        || {
            let accounts = accounts.clone();
            async move {
                let account = accounts.get("stray").await?;
                Ok(account
                    .status
                    .and_then(|s| find_condition(&s.conditions, ACCEPTED).cloned()))
            }
        },
    )
    .await?;
    assert_eq!(
        (refused.status.as_str(), refused.reason.as_str()),
        ("False", "NamespaceOutOfScope"),
        "{refused:?}"
    );
    assert!(
        refused.message.contains(&format!(
            "spec.namespaces names {other} outside ScaleAgent ro's spec.scope.namespaces [{ns}]"
        )) && refused
            .message
            .contains("remove them from spec.namespaces, or add them to the ScaleAgent's spec.scope.namespaces"),
        "{}",
        refused.message
    );

    // Each scope namespace's Role holds what its own accounts need there.
    let rbac_name = format!("scale-agent:{ns}:deploy");
    wait_for_within(
        "the Deploy agent's Roles in both namespaces",
        TIMEOUT,
        EVERY,
        || {
            let (admin, ns, other, rbac_name) =
                (admin.clone(), ns.clone(), other.clone(), rbac_name.clone());
            async move {
                let has = |role: Option<Role>, resource: &str| {
                    role.and_then(|r| r.rules)
                        .unwrap_or_default()
                        .iter()
                        .any(|rule| {
                            rule.resources
                                .as_ref()
                                .is_some_and(|r| r.iter().any(|r| r == resource))
                        })
                };
                let here = Api::<Role>::namespaced(admin.clone(), &ns)
                    .get_opt(&rbac_name)
                    .await?;
                let there = Api::<Role>::namespaced(admin.clone(), &other)
                    .get_opt(&rbac_name)
                    .await?;
                Ok((has(here, "jobs") && has(there, "services")).then_some(()))
            }
        },
    )
    .await?;
    let deploy_token = control_plane
        .service_account_token(&admin, &ns, "deploy-agent")
        .await?;
    let as_deploy = control_plane.client_for_token(&deploy_token).await?;
    let lp = ListParams::default();
    Api::<Service>::namespaced(as_deploy.clone(), &other)
        .list(&lp)
        .await?;
    Api::<ConfigMap>::namespaced(as_deploy.clone(), &ns)
        .list(&lp)
        .await?;
    let code = |result: Result<_, kube::Error>| match result {
        Err(kube::Error::Api(status)) => status.code,
        Err(_) => 0,
        Ok(_) => 200,
    };
    assert_eq!(
        code(
            Api::<Service>::namespaced(as_deploy.clone(), &ns)
                .list(&lp)
                .await
                .map(|_| ())
        ),
        403,
        "Services only where the account that watches them is"
    );
    assert_eq!(
        code(
            Api::<ConfigMap>::namespaced(as_deploy.clone(), &other)
                .list(&lp)
                .await
                .map(|_| ())
        ),
        403,
        "ConfigMaps only where the account that watches them is"
    );

    let hub = TlsHub::start(&dir, |_| {}).await?;
    let mut agents = Vec::new();
    for (name, account) in [("ro", &ro_account), ("deploy", &deploy_account)] {
        let token = control_plane
            .service_account_token(&admin, &ns, &format!("{name}-agent"))
            .await?;
        let kubeconfig = dir.join(format!("{name}.kubeconfig"));
        std::fs::write(&kubeconfig, control_plane.kubeconfig_for_token(&token))?;
        let accounts = wait_for_within("the rendered account", TIMEOUT, EVERY, || {
            let (admin, ns, kubeconfig) = (admin.clone(), ns.clone(), kubeconfig.clone());
            async move {
                let accounts = rendered_accounts(&admin, &ns, name, &kubeconfig).await?;
                let names: Vec<&str> = accounts
                    .as_array()
                    .map(|a| a.iter().filter_map(|a| a["name"].as_str()).collect())
                    .unwrap_or_default();
                Ok(names.contains(&account.as_str()).then_some(accounts))
            }
        })
        .await?;
        if name == "ro" {
            assert_eq!(
                accounts.as_array().map(Vec::len),
                Some(1),
                "the stray account is left out: {accounts}"
            );
        }
        let config = dir.join(format!("{name}.yaml"));
        fixtures::write_plaintext_agent_config(&config, hub.hub.grpc_addr, accounts, 2)?;
        agents.push(fixtures::start_agent_replica(&config, &format!("{name}-0")).await?);
        hub.wait_connected(account, 1).await?;
    }

    let mut failures = Vec::new();
    for (what, body, read_only, deploy) in operations(&ns) {
        for (agent, account, expect) in [
            ("ro", &ro_account, read_only),
            ("deploy", &deploy_account, deploy),
        ] {
            let (got, result) = operation(&hub, account, &body).await?;
            let message = result["status"]["message"].as_str().unwrap_or_default();
            let user = format!("system:serviceaccount:{ns}:{agent}-agent");
            let as_expected = match expect {
                Expect::Ok(code) => got == code && result["state"] == "succeeded",
                Expect::Forbidden => {
                    got == 403 && message.contains("forbidden") && message.contains(&user)
                }
            };
            if !as_expected {
                failures.push(format!(
                    "{agent}: {what}: expected {expect:?}, got {got}: {result}"
                ));
            }
        }
    }
    assert!(
        failures.is_empty(),
        "{} operations not as documented:\n{}",
        failures.len(),
        failures.join("\n")
    );

    // What the Deploy run wrote is there.
    let deployments: Api<Deployment> = Api::namespaced(admin.clone(), &ns);
    assert!(deployments.get("web").await?.spec.paused.is_none_or(|p| !p));
    assert!(
        Api::<StatefulSet>::namespaced(admin.clone(), &ns)
            .get_opt("db")
            .await?
            .is_some()
    );
    assert!(
        Api::<ConfigMap>::namespaced(admin.clone(), &ns)
            .get_opt("existing")
            .await?
            .is_none()
    );
    assert!(
        Api::<Secret>::namespaced(admin.clone(), &ns)
            .get_opt("by-ssa")
            .await?
            .is_some()
    );
    assert!(
        Api::<k8s_openapi::api::batch::v1::Job>::namespaced(admin.clone(), &ns)
            .get_opt("migrate")
            .await?
            .is_some()
    );

    // kubectl through the hub's proxy, as Clouddriver runs it: the same verbs, the agent's
    // identity.
    let kubectl = Kubectl::new(control_plane.binaries().kubectl(), dir.join("kubectl-home"));
    let pod = Api::<k8s_openapi::api::core::v1::Pod>::namespaced(admin.clone(), &ns)
        .list(&ListParams::default().labels("app=web"))
        .await?
        .items
        .into_iter()
        .find_map(|p| p.metadata.name)
        .ok_or_else(|| anyhow::anyhow!("no pod of Deployment web"))?;
    let secret_yaml = secret(&ns, "by-kubectl", "four").to_string();
    let commands: Vec<KubectlCommand> = vec![
        (
            "rollout history",
            args(&["rollout", "history", "deployment/web"]),
            None,
            true,
            true,
        ),
        (
            "events",
            args(&["events", "--for", "deployment/web"]),
            None,
            true,
            true,
        ),
        ("logs", args(&["logs", &pod, "--tail=1"]), None, true, true),
        (
            "client-side apply of a Secret",
            args(&["apply", "-f", "-"]),
            Some(secret_yaml.as_str()),
            false,
            true,
        ),
        (
            "client-side apply of a Secret again",
            args(&["apply", "-f", "-"]),
            Some(secret_yaml.as_str()),
            false,
            true,
        ),
        (
            "scale",
            args(&["scale", "deployment/web", "--replicas=1"]),
            None,
            false,
            true,
        ),
        (
            "rollout undo",
            args(&["rollout", "undo", "deployment/web"]),
            None,
            false,
            true,
        ),
    ];
    for (agent, account) in [("ro", &ro_account), ("deploy", &deploy_account)] {
        let kubeconfig = hub
            .kubeconfig(
                account,
                "kubectl",
                &dir.join(format!("{agent}-proxy.kubeconfig")),
            )
            .await?;
        let run = |args: Vec<String>, stdin: Option<String>| {
            let (kubectl, kubeconfig, ns) = (kubectl.clone(), kubeconfig.clone(), ns.clone());
            async move {
                let args: Vec<String> = ["-n".to_string(), ns].into_iter().chain(args).collect();
                kubectl
                    .run(&kubeconfig, &args, stdin.as_deref(), KUBECTL_TIMEOUT)
                    .await
            }
        };
        for (what, args, stdin, read_only, deploy) in &commands {
            let allowed = if agent == "ro" { *read_only } else { *deploy };
            let outcome = run(args.clone(), stdin.map(str::to_owned)).await?;
            let messages = outcome.messages();
            // The ReadOnly account does not opt in to Secret data through the proxy: the hub
            // refuses its Secret writes before RBAC would (issue 28, F3).
            let refused_by = if agent == "ro" && what.contains("Secret") {
                "allowSecretData".to_string()
            } else {
                format!("{agent}-agent")
            };
            let as_expected = if allowed {
                outcome.success()
            } else {
                !outcome.success()
                    && messages.to_lowercase().contains("forbidden")
                    && messages.contains(&refused_by)
            };
            if !as_expected {
                failures.push(format!(
                    "{agent}: kubectl {what}: expected {}, got {:?}: {messages}",
                    if allowed { "success" } else { "Forbidden" },
                    outcome.code
                ));
            }
        }
        // exec cannot run without a kubelet, but authorization comes first: the Deploy agent
        // gets past it (to "pod ... does not have a host assigned"), ReadOnly is refused.
        let exec = run(args(&["exec", &pod, "--", "true"]), None).await?;
        let messages = exec.messages();
        let as_expected = !exec.success()
            && if agent == "ro" {
                messages.contains("cannot create resource \"pods/exec\"")
                    && messages.contains("ro-agent")
            } else {
                messages.contains("does not have a host assigned")
            };
        if !as_expected {
            failures.push(format!(
                "{agent}: kubectl exec: exit {:?}: {messages}",
                exec.code
            ));
        }
    }
    assert!(
        failures.is_empty(),
        "{} kubectl commands not as documented:\n{}",
        failures.len(),
        failures.join("\n")
    );

    // The proxy's streaming subresources: with Deploy on Pods, exec, attach and port-forward
    // (create for SPDY, get for WebSocket); ReadOnly gets the 403.
    for subresource in ["exec", "attach", "portforward"] {
        for verb in ["create", "get"] {
            assert!(
                allowed(
                    &admin,
                    &format!("system:serviceaccount:{ns}:deploy-agent"),
                    &ns,
                    verb,
                    "pods",
                    subresource
                )
                .await?,
                "Deploy: {verb} pods/{subresource}"
            );
            assert!(
                !allowed(
                    &admin,
                    &format!("system:serviceaccount:{ns}:ro-agent"),
                    &ns,
                    verb,
                    "pods",
                    subresource
                )
                .await?,
                "ReadOnly: {verb} pods/{subresource}"
            );
        }
    }

    for agent in agents {
        agent.shutdown();
    }
    hub.hub.shutdown().await?;
    operator.stop().await?;
    let _ = std::fs::remove_dir_all(&dir);
    Ok(())
}
