//! The caller's identity in the target cluster (issue 31), on a real control plane with real
//! RBAC and its audit log, kubectl through the hub's TLS proxy, a real agent:
//!
//! - an account with `callers: impersonate` replays a person's requests as
//!   `scale-agent:<person>`: Alice lists and deploys in the namespace a RoleBinding gives
//!   her, is refused in another by the cluster's own RBAC (its 403, naming her), and
//!   `kubectl auth can-i --list` answers for her; the API server's audit log names her as
//!   the impersonated user under the same audit id as the hub's audit line;
//! - Clouddriver's token on that account keeps acting as the agent; a person the account
//!   does not admit is refused by the agent;
//! - an account with `callers: agent` (the default) is unchanged: Alice acts as the agent;
//! - the impersonation the agent holds is the ClusterRole the operator renders for the
//!   account (`scale_agent_operator::desired::callers`), and it is enough.

mod common;

use common::{capture_audit_lines, deployment, grant_edit, hub_line, kubectl, target_event};
use k8s_openapi::api::{
    core::v1::ConfigMap,
    rbac::v1::{ClusterRole, ClusterRoleBinding},
};
use kube::{Api, Client, api::PostParams};
use scale_agent_e2e::{
    ControlPlane, ControlPlaneOptions,
    fixtures::{self, TlsHub, temp_dir},
    kubectl::Kubectl,
};
use serde_json::json;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_person_acts_as_themselves_in_the_target_cluster() -> anyhow::Result<()> {
    let lines = capture_audit_lines();
    let control_plane = ControlPlane::shared_with(|| ControlPlaneOptions::default().with_audit())?;
    let admin: Client = control_plane.client().await?;
    let team_a = control_plane.namespace(&admin, "callers-a").await?;
    let team_b = control_plane.namespace(&admin, "callers-b").await?;
    let dir = temp_dir("scale-agent-e2e-callers")?;

    // The agent (ScaleAgent `callers` in team-a: ServiceAccount `callers-agent`) reads
    // ConfigMaps and Deployments everywhere and writes nothing.
    let agent_kubeconfig = fixtures::service_account_identity(
        control_plane,
        &admin,
        &team_a,
        "callers-agent",
        fixtures::Scope::Cluster,
        fixtures::read_rules(&["configmaps", "deployments.apps"]),
        dir.join("agent.kubeconfig"),
    )
    .await?;
    let scale_agent: scale_agent_crds::ScaleAgent = serde_json::from_value(json!({
        "apiVersion": "scaleagent.dev/v1alpha1", "kind": "ScaleAgent",
        "metadata": { "name": "callers", "namespace": team_a, "uid": "u" },
        "spec": {
            "hub": { "address": "hub:9091", "tls": { "caSecretRef": { "name": "hub-ca" } } },
            "clientCertificate": { "issuerSecretRef": { "name": "agent-ca" } },
        },
    }))?;
    let mut impersonating: scale_agent_crds::AgentAccount = serde_json::from_value(json!({
        "apiVersion": "scaleagent.dev/v1alpha1", "kind": "AgentAccount",
        "metadata": { "name": "people", "namespace": team_a },
        "spec": { "agentRef": "callers", "callers": "impersonate", "callerUsers": ["alice"] },
    }))?;
    impersonating.metadata.uid = Some("u2".into());
    // The operator's grant for this account, applied as the operator would.
    let admitted = scale_agent_operator::desired::callers::admitted(&[&impersonating]);
    let (role, binding) =
        scale_agent_operator::desired::callers::callers_rbac(&scale_agent, &admitted)
            .ok_or_else(|| anyhow::anyhow!("the account admits alice: a grant"))?;
    let rules = role.rules.clone().unwrap_or_default();
    assert_eq!(rules.len(), 1, "users only, no groups listed: {rules:?}");
    assert_eq!(
        rules[0].resource_names.as_deref(),
        Some(&["scale-agent:alice".to_string()][..])
    );
    let pp = PostParams::default();
    Api::<ClusterRole>::all(admin.clone())
        .create(&pp, &role)
        .await?;
    Api::<ClusterRoleBinding>::all(admin.clone())
        .create(&pp, &binding)
        .await?;
    // Alice may edit team-a, nothing else.
    let alice_user = "scale-agent:alice";
    grant_edit(
        &admin,
        &team_a,
        "edits",
        "alice-edits",
        ("User", alice_user),
    )
    .await?;
    Api::<ConfigMap>::namespaced(admin.clone(), &team_b)
        .create(
            &pp,
            &serde_json::from_value(json!({ "metadata": { "name": "team-b-only" } }))?,
        )
        .await?;

    let hub = TlsHub::start(&dir, |_| {}).await?;
    let suffix = format!("{:06x}", rand::random::<u32>() & 0xff_ffff);
    let people = format!("people-{suffix}");
    let as_agent = format!("agent-{suffix}");
    let entry = |name: &str| {
        json!({
            "name": name,
            "kubeconfigFile": agent_kubeconfig.display().to_string(),
            "namespaces": [team_a, team_b],
            "kinds": ["configmaps", "deployments.apps"],
        })
    };
    let mut people_entry = entry(&people);
    people_entry["callers"] = json!("impersonate");
    people_entry["callerUsers"] = json!(["alice"]);
    let config = dir.join("agent.yaml");
    fixtures::write_plaintext_agent_config(
        &config,
        hub.hub.grpc_addr,
        json!([people_entry, entry(&as_agent)]),
        2,
    )?;
    let agent = fixtures::start_agent_replica(&config, "callers-0").await?;
    hub.wait_connected(&people, 1).await?;
    hub.wait_connected(&as_agent, 1).await?;

    let kubectl_bin = Kubectl::new(control_plane.binaries().kubectl(), dir.join("home"));
    let alice = hub
        .kubeconfig(&people, "alice", &dir.join("alice.kubeconfig"))
        .await?;

    // Alice lists and deploys in team-a.
    let listed = kubectl(
        &kubectl_bin,
        &alice,
        &["get", "configmaps", "-n", &team_a, "-o", "name"],
        None,
    )
    .await?;
    assert!(listed.success(), "{}", listed.messages());
    let deployed = kubectl(
        &kubectl_bin,
        &alice,
        &["apply", "-f", "-"],
        Some(&deployment(&team_a, "by-alice").to_string()),
    )
    .await?;
    assert!(deployed.success(), "{}", deployed.messages());

    // Refused in team-b by the cluster's own RBAC, which names her.
    let refused = kubectl(
        &kubectl_bin,
        &alice,
        &["get", "configmaps", "-n", &team_b],
        None,
    )
    .await?;
    assert!(!refused.success(), "{refused:?}");
    let message = refused.messages();
    assert!(
        message.contains("(Forbidden)")
            && message.contains(&format!(
                "User \"{alice_user}\" cannot list resource \"configmaps\""
            ))
            && message.contains(&team_b),
        "not the API server's 403 for alice: {message}"
    );

    // `kubectl auth can-i --list` answers for her: she may do anything to Deployments in
    // team-a (her Role's `*`), the agent only get, list and watch.
    let rules = kubectl(
        &kubectl_bin,
        &alice,
        &["auth", "can-i", "--list", "-n", &team_a],
        None,
    )
    .await?;
    assert!(rules.success(), "{}", rules.messages());
    let deployments_line = rules
        .stdout
        .lines()
        .find(|l| l.starts_with("deployments.apps "))
        .unwrap_or_default();
    assert!(
        deployments_line.ends_with("[*]"),
        "alice's rules, not the agent's: {}",
        rules.stdout
    );
    let can_i = kubectl(
        &kubectl_bin,
        &alice,
        &["auth", "can-i", "create", "deployments", "-n", &team_b],
        None,
    )
    .await?;
    assert_eq!(can_i.stdout.trim(), "no", "{can_i:?}");

    // The hub's line and the API server's event name the same request, and Alice.
    let create = hub_line(&lines, "alice's create", |l| {
        l["who"] == "alice"
            && l["verb"] == "create"
            && l["object"] == format!("deployments/{team_a}")
    })
    .await?;
    assert_eq!(create["message"], "proxied write", "{create}");
    assert_eq!(create["person"], true, "{create}");
    assert_eq!(create["account"], people.as_str(), "{create}");
    assert_eq!(create["code"], 201, "{create}");
    assert_eq!(create["served"], "tunnel", "{create}");
    assert!(create["bytes"].as_u64().is_some_and(|b| b > 0), "{create}");
    let request_id = create["request_id"]
        .as_str()
        .unwrap_or_default()
        .to_string();
    let event = target_event(control_plane, &request_id).await?;
    assert_eq!(
        event
            .impersonated_user
            .as_ref()
            .map(|u| u.username.as_str()),
        Some(alice_user),
        "{event:?}"
    );
    assert_eq!(
        event.user.username,
        format!("system:serviceaccount:{team_a}:callers-agent"),
        "{event:?}"
    );
    assert_eq!(event.verb, "create", "{event:?}");
    assert_eq!(event.response_status.map(|s| s.code), Some(201));
    // Reads are audited too (the default `--proxy-audit-reads all`), with their bytes.
    let read = hub_line(&lines, "alice's list in team-b", |l| {
        l["who"] == "alice" && l["verb"] == "list" && l["object"] == format!("configmaps/{team_b}")
    })
    .await?;
    assert_eq!(read["message"], "proxied read", "{read}");
    assert_eq!(read["code"], 403, "{read}");
    let denied = target_event(
        control_plane,
        read["request_id"].as_str().unwrap_or_default(),
    )
    .await?;
    assert_eq!(
        denied.impersonated_user.map(|u| u.username),
        Some(alice_user.to_string())
    );
    assert_eq!(denied.response_status.map(|s| s.code), Some(403));

    // Clouddriver's token keeps acting as the agent: it reads team-b.
    let clouddriver = hub
        .kubeconfig(&people, "clouddriver", &dir.join("clouddriver.kubeconfig"))
        .await?;
    let machine = kubectl(
        &kubectl_bin,
        &clouddriver,
        &[
            "get",
            "configmap",
            "team-b-only",
            "-n",
            &team_b,
            "-o",
            "name",
        ],
        None,
    )
    .await?;
    assert!(machine.success(), "{}", machine.messages());
    let machine_line = hub_line(&lines, "clouddriver's get", |l| {
        l["who"] == "clouddriver" && l["object"] == format!("configmaps/{team_b}/team-b-only")
    })
    .await?;
    assert_eq!(machine_line["person"], false, "{machine_line}");
    // The machine's reads may come from the cache (they are the agent's anyway); its rules,
    // asked of the API server, are the agent's and nobody is impersonated.
    assert_eq!(machine_line["served"], "cache", "{machine_line}");
    let machine_rules = kubectl(
        &kubectl_bin,
        &clouddriver,
        &["auth", "can-i", "--list", "-n", &team_a],
        None,
    )
    .await?;
    assert!(machine_rules.success(), "{}", machine_rules.messages());
    assert!(
        machine_rules
            .stdout
            .lines()
            .any(|l| l.starts_with("deployments.apps ") && l.ends_with("[get list watch]")),
        "the agent's rules: {}",
        machine_rules.stdout
    );
    let review = hub_line(&lines, "clouddriver's rules review", |l| {
        l["who"] == "clouddriver" && l["object"] == "selfsubjectrulesreviews"
    })
    .await?;
    let machine_event = target_event(
        control_plane,
        review["request_id"].as_str().unwrap_or_default(),
    )
    .await?;
    assert_eq!(machine_event.impersonated_user, None, "{machine_event:?}");
    assert_eq!(
        machine_event.user.username,
        format!("system:serviceaccount:{team_a}:callers-agent")
    );

    // A person the account does not admit: the agent refuses, naming callerUsers.
    let bob = hub
        .kubeconfig(&people, "bob", &dir.join("bob.kubeconfig"))
        .await?;
    let not_admitted = kubectl(
        &kubectl_bin,
        &bob,
        &["get", "configmaps", "-n", &team_a],
        None,
    )
    .await?;
    assert!(!not_admitted.success(), "{not_admitted:?}");
    assert!(
        not_admitted.messages().contains("callerUsers"),
        "{}",
        not_admitted.messages()
    );

    // `callers: agent`: unchanged, Alice's token acts as the agent and reads team-b.
    let alice_as_agent = hub
        .kubeconfig(&as_agent, "alice", &dir.join("alice-agent.kubeconfig"))
        .await?;
    let unchanged = kubectl(
        &kubectl_bin,
        &alice_as_agent,
        &[
            "get",
            "configmap",
            "team-b-only",
            "-n",
            &team_b,
            "-o",
            "name",
        ],
        None,
    )
    .await?;
    assert!(unchanged.success(), "{}", unchanged.messages());
    let written = kubectl(
        &kubectl_bin,
        &alice_as_agent,
        &["apply", "-f", "-"],
        Some(&deployment(&team_a, "by-agent").to_string()),
    )
    .await?;
    assert!(!written.success(), "the agent writes nothing: {written:?}");
    assert!(
        written.messages().contains(&format!(
            "User \"system:serviceaccount:{team_a}:callers-agent\" cannot"
        )),
        "{}",
        written.messages()
    );

    agent.stop().await?;
    hub.hub.shutdown().await?;
    Api::<ClusterRoleBinding>::all(admin.clone())
        .delete(
            binding.metadata.name.as_deref().unwrap_or_default(),
            &Default::default(),
        )
        .await?;
    Api::<ClusterRole>::all(admin.clone())
        .delete(
            role.metadata.name.as_deref().unwrap_or_default(),
            &Default::default(),
        )
        .await?;
    let _ = std::fs::remove_dir_all(&dir);
    Ok(())
}
