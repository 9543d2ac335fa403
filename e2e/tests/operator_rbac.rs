//! The operator's own RBAC, narrowed (issue 28, review R9 "escalate/bind"), on a real control
//! plane: the shipped manifests/operator applied with kubectl, bound as rbac.yaml says, and
//! the operator's controllers authenticated with a real token of its ServiceAccount.
//! - It still reconciles every grant shape: a Cluster-scope ScaleAgent listed in the cluster
//!   grants (ClusterRole, and the callers ClusterRole of an account with
//!   `callers: impersonate`), a Namespaces-scope one with Roles in its own and in a bound
//!   grantable namespace and an impersonation Role, and the finalizer cleans all of it up.
//! - Where its RBAC does not reach, the ScaleAgent says so instead of failing blindly: a
//!   Cluster-scope ScaleAgent nobody listed (`ClusterGrantNotAllowed`), a namespace its allow
//!   list admits but nobody bound it in (`NamespaceGrantNotAllowed`).
//! - SubjectAccessReviews, and real attempts with its token, show it can no longer escalate
//!   or bind outside that set: no RoleBinding to cluster-admin in kube-system, no
//!   ClusterRoleBinding to cluster-admin, no rule written into cluster-admin or a kube-system
//!   Role.

use k8s_openapi::api::{
    authorization::v1::ResourceAttributes,
    rbac::v1::{ClusterRole, ClusterRoleBinding, Role, RoleBinding},
};
use kube::{
    Api, Client,
    api::{DeleteParams, ListParams, PostParams},
};
use scale_agent_crds::{
    AgentAccount, ScaleAgent,
    conditions::{DEGRADED, find_condition},
};
use scale_agent_e2e::{
    ControlPlane, ControlPlaneOptions, crds,
    operator::{
        Operator, apply_in, bind_operator, list_in_cluster_grants, service_account_may,
        shipped_operator,
    },
    wait::wait_for,
};
use scale_agent_operator::policy::Grants;
use serde_json::{Value, json};

const OPERATOR: (&str, &str) = ("scale-agent-system", "scale-agent-operator");

fn control_plane() -> anyhow::Result<&'static ControlPlane> {
    Ok(ControlPlane::shared_with(ControlPlaneOptions::default)?)
}

fn scale_agent(name: &str, spec: Value) -> Value {
    let mut full = json!({
        "hub": { "address": "hub.spinnaker.example.com:9091", "tls": { "insecurePlaintext": true } },
        "replicas": 1,
    });
    for (key, value) in spec.as_object().into_iter().flatten() {
        full[key] = value.clone();
    }
    json!({
        "apiVersion": "scaleagent.dev/v1alpha1", "kind": "ScaleAgent",
        "metadata": { "name": name }, "spec": full,
    })
}

fn agent_account(name: &str, spec: Value) -> Value {
    json!({
        "apiVersion": "scaleagent.dev/v1alpha1", "kind": "AgentAccount",
        "metadata": { "name": name }, "spec": spec,
    })
}

/// A `rbac.authorization.k8s.io` request of `verb` on `resource` named `name`, in
/// `namespace` (cluster-wide when None).
fn rbac_request(
    verb: &str,
    resource: &str,
    name: &str,
    namespace: Option<&str>,
) -> ResourceAttributes {
    ResourceAttributes {
        group: Some("rbac.authorization.k8s.io".into()),
        verb: Some(verb.into()),
        resource: Some(resource.into()),
        name: Some(name.into()),
        namespace: namespace.map(str::to_owned),
        ..Default::default()
    }
}

/// The `Degraded` reason and message of ScaleAgent `name`, once it has one of `reason`.
async fn degraded_with(
    client: &Client,
    ns: &str,
    name: &str,
    reason: &str,
) -> anyhow::Result<String> {
    let agents = Api::<ScaleAgent>::namespaced(client.clone(), ns);
    wait_for(
        &format!("ScaleAgent {name} Degraded with {reason}"),
        || async {
            let agent = agents.get(name).await?;
            let conditions = agent.status.map(|s| s.conditions).unwrap_or_default();
            Ok(find_condition(&conditions, DEGRADED)
                .filter(|c| c.status == "True" && c.reason == reason)
                .map(|c| c.message.clone()))
        },
    )
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_shipped_rbac_grants_every_shape_and_escalates_nothing_else() -> anyhow::Result<()> {
    scale_agent_e2e::fixtures::init_logs("error");
    let control_plane = control_plane()?;
    let admin = control_plane.client().await?;
    crds::install(&admin, &crds::read_crds(&crds::manifests_dir())?).await?;
    let ns = control_plane.namespace(&admin, "op-rbac").await?;
    let granted = control_plane.namespace(&admin, "op-rbac-granted").await?;
    let unbound = control_plane.namespace(&admin, "op-rbac-unbound").await?;

    // The shipped RBAC, as a user applies it, and the bindings rbac.yaml says to add: the
    // test namespace is watched (namespaced + grants), `granted` is grantable (grants only),
    // and ScaleAgent ns/wide is listed in the cluster grants with the documented patch.
    let as_operator = shipped_operator(control_plane, &admin).await?;
    for (namespace, binding, cluster_role) in [
        (
            &ns,
            "scale-agent-operator",
            "scale-agent-operator-namespaced",
        ),
        (
            &ns,
            "scale-agent-operator-grants",
            "scale-agent-operator-grants",
        ),
        (
            &granted,
            "scale-agent-operator-grants",
            "scale-agent-operator-grants",
        ),
    ] {
        bind_operator(control_plane, namespace, binding, cluster_role)?;
    }
    let wide = format!("scale-agent:{ns}:wide");
    let wide_callers = format!("{wide}:callers");
    list_in_cluster_grants(control_plane, &ns, "wide")?;

    // What the operator's RBAC no longer lets it do, asked of the API server.
    let may = |attributes: ResourceAttributes| service_account_may(&admin, OPERATOR, attributes);
    for (what, request) in [
        (
            "bind cluster-admin in a RoleBinding in kube-system",
            rbac_request("bind", "clusterroles", "cluster-admin", Some("kube-system")),
        ),
        (
            "bind cluster-admin in a ClusterRoleBinding",
            rbac_request("bind", "clusterroles", "cluster-admin", None),
        ),
        (
            "escalate cluster-admin",
            rbac_request("escalate", "clusterroles", "cluster-admin", None),
        ),
        (
            "patch cluster-admin",
            rbac_request("patch", "clusterroles", "cluster-admin", None),
        ),
        (
            "delete ClusterRoleBinding cluster-admin",
            rbac_request("delete", "clusterrolebindings", "cluster-admin", None),
        ),
        (
            "escalate a Role in kube-system",
            rbac_request("escalate", "roles", "anything", Some("kube-system")),
        ),
        (
            "bind a Role in kube-system",
            rbac_request("bind", "roles", "anything", Some("kube-system")),
        ),
        (
            "create a RoleBinding in kube-system",
            rbac_request("create", "rolebindings", "anything", Some("kube-system")),
        ),
        (
            "escalate a Role in a namespace nobody bound it in",
            rbac_request("escalate", "roles", "anything", Some(&unbound)),
        ),
        (
            "escalate the ClusterRole of a ScaleAgent nobody listed",
            rbac_request(
                "escalate",
                "clusterroles",
                &format!("scale-agent:{ns}:unlisted"),
                None,
            ),
        ),
    ] {
        assert!(!may(request).await?, "the operator may still {what}");
    }
    // ... and what it needs, so the refusals above are not an API server saying no to all.
    for (what, request) in [
        (
            "escalate the listed ClusterRole",
            rbac_request("escalate", "clusterroles", &wide, None),
        ),
        (
            "bind the listed callers ClusterRole",
            rbac_request("bind", "clusterroles", &wide_callers, None),
        ),
        (
            "escalate a Role in the grantable namespace",
            rbac_request("escalate", "roles", "anything", Some(&granted)),
        ),
        (
            "bind a Role in the watched namespace",
            rbac_request("bind", "roles", "anything", Some(&ns)),
        ),
    ] {
        assert!(may(request).await?, "the operator may not {what}");
    }
    // Real attempts with its token: `create` on RBAC objects is not narrowed by name, so the
    // API server's escalation check is what must stop these.
    let post = PostParams::default();
    let to_cluster_admin = json!({
        "roleRef": { "apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": "cluster-admin" },
        "subjects": [{ "kind": "ServiceAccount", "name": OPERATOR.1, "namespace": OPERATOR.0 }],
    });
    let mut binding = to_cluster_admin.clone();
    binding["metadata"] = json!({ "name": "operator-takes-over" });
    let in_kube_system = Api::<RoleBinding>::namespaced(as_operator.clone(), "kube-system")
        .create(&post, &serde_json::from_value(binding.clone())?)
        .await;
    assert!(
        matches!(&in_kube_system, Err(kube::Error::Api(s)) if s.code == 403),
        "{in_kube_system:?}"
    );
    let cluster_wide = Api::<ClusterRoleBinding>::all(as_operator.clone())
        .create(&post, &serde_json::from_value(binding)?)
        .await;
    assert!(
        matches!(&cluster_wide, Err(kube::Error::Api(s)) if s.code == 403),
        "{cluster_wide:?}"
    );

    // Every shape the tests cover, reconciled by the operator under that RBAC. Its own allow
    // list admits every namespace here: what stops `unbound` is the RBAC alone.
    let config = scale_agent_operator::Config {
        grants: Grants::every_namespace(),
        ..Operator::config(&ns)
    };
    let operator = Operator::start(as_operator, config);
    apply_in::<ScaleAgent>(
        &admin,
        &ns,
        &scale_agent("wide", json!({ "access": "Deploy" })),
    )
    .await?;
    apply_in::<AgentAccount>(
        &admin,
        &ns,
        &agent_account(
            "wide-people",
            json!({ "agentRef": "wide", "accountName": format!("{ns}-wide"), "kinds": ["ConfigMap"],
                    "callers": "impersonate", "callerUsers": ["alice"] }),
        ),
    )
    .await?;
    // Review F26: an account without `kinds` deploys every kind but the privileges.
    apply_in::<AgentAccount>(
        &admin,
        &ns,
        &agent_account(
            "wide-everything",
            json!({ "agentRef": "wide", "accountName": format!("{ns}-wide-everything") }),
        ),
    )
    .await?;
    apply_in::<ScaleAgent>(
        &admin,
        &ns,
        &scale_agent(
            "narrow",
            json!({ "scope": { "type": "Namespaces", "namespaces": [ns, granted] } }),
        ),
    )
    .await?;
    apply_in::<AgentAccount>(
        &admin,
        &ns,
        &agent_account(
            "narrow-deployer",
            json!({ "agentRef": "narrow", "accountName": format!("{ns}-narrow"), "kinds": ["ConfigMap"],
                    "impersonateServiceAccount": { "namespace": ns, "name": "spinnaker" } }),
        ),
    )
    .await?;
    apply_in::<ScaleAgent>(&admin, &ns, &scale_agent("unlisted", json!({}))).await?;
    apply_in::<ScaleAgent>(
        &admin,
        &ns,
        &scale_agent(
            "elsewhere",
            json!({ "scope": { "type": "Namespaces", "namespaces": [unbound] } }),
        ),
    )
    .await?;

    let cluster_roles = Api::<ClusterRole>::all(admin.clone());
    let cluster_role_bindings = Api::<ClusterRoleBinding>::all(admin.clone());
    for name in [&wide, &wide_callers] {
        // The operator applies the ClusterRole, then its binding: wait for both (reading the
        // binding as soon as the role appeared failed once in make test with NotFound).
        wait_for(
            &format!("ClusterRole and ClusterRoleBinding {name}"),
            || async {
                let role = cluster_roles.get_opt(name).await?;
                let binding = cluster_role_bindings.get_opt(name).await?;
                Ok((role.is_some() && binding.is_some()).then_some(()))
            },
        )
        .await?;
    }
    let narrow = format!("scale-agent:{ns}:narrow");
    for (namespace, name) in [
        (&ns, narrow.clone()),
        (&granted, narrow.clone()),
        (&ns, format!("{narrow}:impersonate")),
        (&ns, format!("{narrow}:status")),
        (&ns, format!("{wide}:status")),
    ] {
        wait_for(&format!("Role {namespace}/{name}"), || async {
            let role = Api::<Role>::namespaced(admin.clone(), namespace)
                .get_opt(&name)
                .await?;
            let binding = Api::<RoleBinding>::namespaced(admin.clone(), namespace)
                .get_opt(&name)
                .await?;
            Ok((role.is_some() && binding.is_some()).then_some(()))
        })
        .await?;
    }
    let agents = Api::<ScaleAgent>::namespaced(admin.clone(), &ns);
    for (name, accounts) in [("wide", 2), ("narrow", 1)] {
        wait_for(
            &format!("ScaleAgent {name} reconciled, not degraded"),
            || async {
                let agent = agents.get(name).await?;
                let status = agent.status.unwrap_or_default();
                let degraded = find_condition(&status.conditions, DEGRADED);
                Ok(
                    (status.accounts == accounts && degraded.is_some_and(|c| c.status == "False"))
                        .then_some(()),
                )
            },
        )
        .await?;
    }
    // The agents really got the rights: asked of the API server for their ServiceAccounts.
    let configmaps = |namespace: &str| ResourceAttributes {
        verb: Some("list".into()),
        resource: Some("configmaps".into()),
        namespace: Some(namespace.into()),
        ..Default::default()
    };
    assert!(service_account_may(&admin, (&ns, "wide-agent"), configmaps(&unbound)).await?);
    assert!(service_account_may(&admin, (&ns, "narrow-agent"), configmaps(&granted)).await?);
    assert!(!service_account_may(&admin, (&ns, "narrow-agent"), configmaps(&unbound)).await?);
    // Review F26, asked of the API server: `wide-everything` (Deploy, no `kinds`) lets the
    // agent create any kind anywhere except RBAC objects, admission webhooks, APIServices
    // and CRDs, which an account must name in its kinds.
    let create = |group: &str, resource: &str, namespace: Option<&str>| ResourceAttributes {
        group: Some(group.into()),
        verb: Some("create".into()),
        resource: Some(resource.into()),
        namespace: namespace.map(str::to_owned),
        ..Default::default()
    };
    let wide_agent = (ns.as_str(), "wide-agent");
    for (group, resource) in [
        ("apps", "deployments"),
        ("", "configmaps"),
        ("batch", "jobs"),
    ] {
        assert!(
            service_account_may(&admin, wide_agent, create(group, resource, Some(&unbound)))
                .await?,
            "an account without kinds cannot create {group}/{resource}"
        );
    }
    for (group, resource, namespace) in [
        ("rbac.authorization.k8s.io", "clusterroles", None),
        ("rbac.authorization.k8s.io", "clusterrolebindings", None),
        ("rbac.authorization.k8s.io", "roles", Some(unbound.as_str())),
        (
            "rbac.authorization.k8s.io",
            "rolebindings",
            Some(unbound.as_str()),
        ),
        (
            "admissionregistration.k8s.io",
            "validatingwebhookconfigurations",
            None,
        ),
        (
            "admissionregistration.k8s.io",
            "mutatingwebhookconfigurations",
            None,
        ),
        ("apiregistration.k8s.io", "apiservices", None),
        ("apiextensions.k8s.io", "customresourcedefinitions", None),
    ] {
        assert!(
            !service_account_may(&admin, wide_agent, create(group, resource, namespace)).await?,
            "an account without kinds may create {group}/{resource}: cluster-admin in effect"
        );
    }

    let message = degraded_with(&admin, &ns, "unlisted", "ClusterGrantNotAllowed").await?;
    assert!(
        message.contains(&format!(
            "add {ns}/unlisted to the operator's cluster grants"
        )) && message.contains("operator.clusterGrants"),
        "{message}"
    );
    let message = degraded_with(&admin, &ns, "elsewhere", "NamespaceGrantNotAllowed").await?;
    assert!(
        message.contains(&format!("in namespace {unbound}"))
            && message.contains("scale-agent-operator-grants"),
        "{message}"
    );
    assert!(
        cluster_roles
            .get_opt(&format!("scale-agent:{ns}:unlisted"))
            .await?
            .is_none()
    );
    let in_unbound = Api::<Role>::namespaced(admin.clone(), &unbound)
        .list(&ListParams::default())
        .await?;
    assert!(in_unbound.items.is_empty(), "{:?}", in_unbound.items);

    // The finalizer cleans up under the same RBAC, the refused ScaleAgents included (a
    // DELETE of a ClusterRole name it may not touch would be a 403, not a 404).
    for name in ["wide", "narrow", "unlisted", "elsewhere"] {
        agents.delete(name, &DeleteParams::default()).await?;
    }
    wait_for(
        "the finalizers to clean up under the operator's RBAC",
        || async {
            let left = agents.list(&ListParams::default()).await?.items.len();
            let wide_role = cluster_roles.get_opt(&wide).await?;
            let callers_role = cluster_roles.get_opt(&wide_callers).await?;
            let granted_roles = Api::<Role>::namespaced(admin.clone(), &granted)
                .list(&ListParams::default())
                .await?;
            Ok((left == 0
                && wide_role.is_none()
                && callers_role.is_none()
                && granted_roles.items.is_empty())
            .then_some(()))
        },
    )
    .await?;
    operator.stop().await
}
