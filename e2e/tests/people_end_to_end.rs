//! Issue 31 end to end: a person signs in with OIDC at the hub and acts as herself in the
//! target cluster. A local OIDC issuer (`scale_agent_testkit::oidc`, HTTPS, ES256 keys made
//! here), a real hub on TLS started with `--authentication-config` naming it and
//! `--oidc-access` admitting group `oidc:team-a` to the accounts `prod-*`, a real agent
//! serving `prod-<n>` with `callers: impersonate` and `callerGroups: [oidc:team-a]`, a real
//! control plane with RBAC and its audit log, and real kubectl whose credentials come from
//! an exec plugin printing Alice's ID token (as kubelogin does after sign-in):
//!
//! 1. Alice (`alice@example.com`, group `team-a`) lists and deploys in the namespace where
//!    a RoleBinding gives her group (as the agent sends it, `scale-agent:oidc:team-a`) edit;
//! 2. she is refused in another namespace by the target cluster's own RBAC, whose 403 names
//!    her prefixed user;
//! 3. the target's audit log names her (impersonated user and group) under the audit id of
//!    the hub's audit line for the same request;
//! 4. `kubectl auth can-i --list` through the proxy answers for her;
//! 5. an expired ID token is refused with a message kubectl prints, and her token on an
//!    account the access rule does not name (`staging-<n>`) is refused by the hub;
//! 6. Clouddriver's hub-issued token keeps acting as the agent (no impersonation in the
//!    target's audit event);
//! 7. Carol (`carol@example.com`, group `team-a`), whom `callerUsers` does not list, is
//!    admitted by her group alone: she lists in team-a as herself, and the target's audit log
//!    names her.
//!
//! How the names compose: the hub's `AuthenticationConfiguration` prefixes the username and
//! groups `oidc:` (`oidc:alice@example.com`, `oidc:team-a`); `--oidc-access`,
//! `callerUsers` and `callerGroups` name them so; the agent adds `callerPrefix`
//! (`scale-agent:`), and the target's RBAC binds `scale-agent:oidc:team-a`.

mod common;

use std::path::{Path, PathBuf};

use common::{capture_audit_lines, deployment, grant_edit, hub_line, kubectl, target_event};
use k8s_openapi::api::{
    apps::v1::Deployment,
    core::v1::ConfigMap,
    rbac::v1::{ClusterRole, ClusterRoleBinding},
};
use kube::{Api, Client, api::PostParams};
use scale_agent_e2e::{
    ControlPlane, ControlPlaneOptions,
    fixtures::{self, TlsHub, temp_dir},
    kubectl::Kubectl,
};
use scale_agent_testkit::oidc::{Issuer, now};
use serde_json::json;

/// The `aud` the hub's AuthenticationConfiguration accepts.
const AUDIENCE: &str = "scale-agent-hub";
/// Alice as the hub names her (the configuration's `oidc:` username prefix on `email`).
const ALICE: &str = "oidc:alice@example.com";
/// Carol, in Alice's group but not in `callerUsers`.
const CAROL: &str = "oidc:carol@example.com";
const CAROL_IN_TARGET: &str = "scale-agent:oidc:carol@example.com";
/// Her group as the hub names it (the `oidc:` groups prefix).
const TEAM_A: &str = "oidc:team-a";
/// What the agent sends for them: `callerPrefix` (the default `scale-agent:`) on each.
const ALICE_IN_TARGET: &str = "scale-agent:oidc:alice@example.com";
const TEAM_A_IN_TARGET: &str = "scale-agent:oidc:team-a";

/// A kubeconfig for `account` on the hub whose user is an exec credential plugin: a script
/// printing an ExecCredential holding `id_token`.
fn exec_kubeconfig(
    dir: &Path,
    name: &str,
    hub: &TlsHub,
    account: &str,
    id_token: &str,
) -> anyhow::Result<PathBuf> {
    let plugin = dir.join(format!("{name}-credential.sh"));
    std::fs::write(
        &plugin,
        format!(
            "#!/bin/sh\ncat <<'EOF'\n{}\nEOF\n",
            json!({
                "apiVersion": "client.authentication.k8s.io/v1",
                "kind": "ExecCredential",
                "status": { "token": id_token },
            })
        ),
    )?;
    let mut permissions = std::fs::metadata(&plugin)?.permissions();
    std::os::unix::fs::PermissionsExt::set_mode(&mut permissions, 0o755);
    std::fs::set_permissions(&plugin, permissions)?;
    let kubeconfig = json!({
        "apiVersion": "v1", "kind": "Config",
        "clusters": [{ "name": account, "cluster": {
            "server": format!("{}/clusters/{account}", hub.url),
            "certificate-authority": hub.ca_file.display().to_string(),
        }}],
        "users": [{ "name": name, "user": { "exec": {
            "apiVersion": "client.authentication.k8s.io/v1",
            "command": plugin.display().to_string(),
            "interactiveMode": "Never",
        }}}],
        "contexts": [{ "name": name, "context": { "cluster": account, "user": name } }],
        "current-context": name,
    });
    let path = dir.join(format!("{name}.kubeconfig"));
    std::fs::write(&path, serde_json::to_vec_pretty(&kubeconfig)?)?;
    Ok(path)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn alice_signs_in_with_oidc_and_acts_as_herself_in_the_target_cluster() -> anyhow::Result<()>
{
    let lines = capture_audit_lines();
    let control_plane = ControlPlane::shared_with(|| ControlPlaneOptions::default().with_audit())?;
    let admin: Client = control_plane.client().await?;
    let team_a = control_plane.namespace(&admin, "team-a").await?;
    let team_b = control_plane.namespace(&admin, "team-b").await?;
    let dir = temp_dir("scale-agent-e2e-people")?;
    let suffix = format!("{:06x}", rand::random::<u32>() & 0xff_ffff);
    let prod = format!("prod-{suffix}");
    let staging = format!("staging-{suffix}");

    // The agent (ScaleAgent `people` in team-a: ServiceAccount `people-agent`) reads
    // ConfigMaps and Deployments everywhere and writes nothing.
    let agent_kubeconfig = fixtures::service_account_identity(
        control_plane,
        &admin,
        &team_a,
        "people-agent",
        fixtures::Scope::Cluster,
        fixtures::read_rules(&["configmaps", "deployments.apps"]),
        dir.join("agent.kubeconfig"),
    )
    .await?;
    let scale_agent: scale_agent_crds::ScaleAgent = serde_json::from_value(json!({
        "apiVersion": "scaleagent.dev/v1alpha1", "kind": "ScaleAgent",
        "metadata": { "name": "people", "namespace": team_a, "uid": "u" },
        "spec": {
            "hub": { "address": "hub:9091", "tls": { "caSecretRef": { "name": "hub-ca" } } },
            "clientCertificate": { "issuerSecretRef": { "name": "agent-ca" } },
        },
    }))?;
    let account_spec = json!({
        "agentRef": "people", "callers": "impersonate",
        "callerUsers": [ALICE], "callerGroups": [TEAM_A],
    });
    let mut account: scale_agent_crds::AgentAccount = serde_json::from_value(json!({
        "apiVersion": "scaleagent.dev/v1alpha1", "kind": "AgentAccount",
        "metadata": { "name": prod, "namespace": team_a },
        "spec": account_spec,
    }))?;
    account.metadata.uid = Some("u2".into());
    // The operator's impersonation grant for this account, applied as the operator would:
    // the prefixed group, and every user name (the group admits its members, whoever they
    // are; RBAC cannot grant a prefix).
    let admitted = scale_agent_operator::desired::callers::admitted(&[&account]);
    let (role, binding) =
        scale_agent_operator::desired::callers::callers_rbac(&scale_agent, &admitted)
            .ok_or_else(|| anyhow::anyhow!("the account admits alice: a grant"))?;
    let granted = |resource: &str| {
        role.rules
            .iter()
            .flatten()
            .find(|r| r.resources.as_deref() == Some(&[resource.to_string()][..]))
            .and_then(|r| r.resource_names.clone())
    };
    assert!(
        role.rules.iter().flatten().any(|r| r.resources.as_deref()
            == Some(&["users".to_string()][..])
            && r.resource_names.is_none()),
        "{role:?}"
    );
    assert_eq!(
        granted("groups"),
        Some(vec![TEAM_A_IN_TARGET.to_string()]),
        "{role:?}"
    );
    let pp = PostParams::default();
    Api::<ClusterRole>::all(admin.clone())
        .create(&pp, &role)
        .await?;
    Api::<ClusterRoleBinding>::all(admin.clone())
        .create(&pp, &binding)
        .await?;
    // Her group may edit team-a, nothing else.
    grant_edit(
        &admin,
        &team_a,
        "edit",
        "team-a-edit",
        ("Group", TEAM_A_IN_TARGET),
    )
    .await?;
    Api::<ConfigMap>::namespaced(admin.clone(), &team_b)
        .create(
            &pp,
            &serde_json::from_value(json!({ "metadata": { "name": "team-b-only" } }))?,
        )
        .await?;

    // The hub trusts the issuer and admits group oidc:team-a to prod-* (proxy only).
    let issuer = Issuer::start().await;
    let authentication_config = dir.join("authentication-config.yaml");
    std::fs::write(
        &authentication_config,
        issuer.authentication_config(AUDIENCE),
    )?;
    let oidc_access = dir.join("oidc-access.yaml");
    std::fs::write(
        &oidc_access,
        format!("- {{groups: [\"{TEAM_A}\"], accounts: [\"prod-*\"]}}\n"),
    )?;
    let hub = TlsHub::start(&dir, |config| {
        config.api.authentication_config = Some(authentication_config.clone());
        config.api.oidc_access = Some(oidc_access.clone());
    })
    .await?;
    let entry = |name: &str| {
        json!({
            "name": name,
            "kubeconfigFile": agent_kubeconfig.display().to_string(),
            "namespaces": [team_a, team_b],
            "kinds": ["configmaps", "deployments.apps"],
        })
    };
    let mut prod_entry = entry(&prod);
    prod_entry["callers"] = json!("impersonate");
    prod_entry["callerUsers"] = json!([ALICE]);
    prod_entry["callerGroups"] = json!([TEAM_A]);
    let config = dir.join("agent.yaml");
    fixtures::write_plaintext_agent_config(
        &config,
        hub.hub.grpc_addr,
        json!([prod_entry, entry(&staging)]),
        2,
    )?;
    let agent = fixtures::start_agent_replica(&config, "people-0").await?;
    hub.wait_connected(&prod, 1).await?;
    hub.wait_connected(&staging, 1).await?;

    let kubectl_bin = Kubectl::new(control_plane.binaries().kubectl(), dir.join("home"));
    let id_token = issuer.id_token("alice@example.com", &["team-a"], AUDIENCE);
    let alice = exec_kubeconfig(&dir, "alice", &hub, &prod, &id_token)?;

    // 1. Alice lists and deploys in team-a.
    let listed = kubectl(
        &kubectl_bin,
        &alice,
        &["get", "deployments", "-n", &team_a, "-o", "name"],
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
    let created = Api::<Deployment>::namespaced(admin.clone(), &team_a)
        .get("by-alice")
        .await?;
    assert_eq!(created.metadata.name.as_deref(), Some("by-alice"));

    // 2. Refused in team-b by the target cluster's own RBAC, which names her.
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
                "User \"{ALICE_IN_TARGET}\" cannot list resource \"configmaps\""
            ))
            && message.contains(&team_b),
        "not the API server's 403 for alice: {message}"
    );

    // 3. The hub's audit line and the target's audit event name the same request, and her.
    let create = hub_line(&lines, "alice's create", |l| {
        l["who"] == ALICE && l["verb"] == "create" && l["object"] == format!("deployments/{team_a}")
    })
    .await?;
    assert_eq!(create["message"], "proxied write", "{create}");
    assert_eq!(create["person"], true, "{create}");
    assert_eq!(create["account"], prod.as_str(), "{create}");
    assert_eq!(create["code"], 201, "{create}");
    let event = target_event(
        control_plane,
        create["request_id"].as_str().unwrap_or_default(),
    )
    .await?;
    let impersonated = event
        .impersonated_user
        .clone()
        .ok_or_else(|| anyhow::anyhow!("the create impersonated nobody: {event:?}"))?;
    assert_eq!(impersonated.username, ALICE_IN_TARGET, "{event:?}");
    assert!(
        impersonated.groups.iter().any(|g| g == TEAM_A_IN_TARGET),
        "her group, prefixed: {event:?}"
    );
    assert!(
        !impersonated.groups.iter().any(|g| g == TEAM_A),
        "only the prefixed group reaches the target: {event:?}"
    );
    assert_eq!(
        event.user.username,
        format!("system:serviceaccount:{team_a}:people-agent"),
        "{event:?}"
    );
    assert_eq!(event.verb, "create", "{event:?}");
    assert_eq!(event.response_status.map(|s| s.code), Some(201));
    // A person's reads on such an account go to the cluster, never the hub's cache (which
    // answers what the agent may see).
    let list = hub_line(&lines, "alice's list in team-a", |l| {
        l["who"] == ALICE && l["verb"] == "list" && l["object"] == format!("deployments/{team_a}")
    })
    .await?;
    assert_eq!(list["served"], "tunnel", "{list}");
    let listed_event = target_event(
        control_plane,
        list["request_id"].as_str().unwrap_or_default(),
    )
    .await?;
    assert_eq!(
        listed_event.impersonated_user.map(|u| u.username),
        Some(ALICE_IN_TARGET.to_string())
    );
    let read = hub_line(&lines, "alice's list in team-b", |l| {
        l["who"] == ALICE && l["verb"] == "list" && l["object"] == format!("configmaps/{team_b}")
    })
    .await?;
    assert_eq!(read["code"], 403, "{read}");
    let denied = target_event(
        control_plane,
        read["request_id"].as_str().unwrap_or_default(),
    )
    .await?;
    assert_eq!(
        denied.impersonated_user.map(|u| u.username),
        Some(ALICE_IN_TARGET.to_string())
    );
    assert_eq!(denied.response_status.map(|s| s.code), Some(403));

    // 4. `kubectl auth can-i --list` answers for her: anything on Deployments in team-a (her
    // group's Role), where the agent may only get, list and watch; nothing in team-b.
    let rules = kubectl(
        &kubectl_bin,
        &alice,
        &["auth", "can-i", "--list", "-n", &team_a],
        None,
    )
    .await?;
    assert!(rules.success(), "{}", rules.messages());
    assert!(
        rules
            .stdout
            .lines()
            .any(|l| l.starts_with("deployments.apps ") && l.ends_with("[*]")),
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

    // 5. An expired ID token: refused by the hub with the reason, which kubectl prints.
    let mut expired_claims = issuer.claims("alice@example.com", &["team-a"], AUDIENCE);
    expired_claims["iat"] = (now() - 7200).into();
    expired_claims["nbf"] = (now() - 7200).into();
    expired_claims["exp"] = (now() - 60).into();
    let expired_token = issuer.current_key().sign(&expired_claims);
    let expired = exec_kubeconfig(&dir, "alice-expired", &hub, &prod, &expired_token)?;
    let refused = kubectl(
        &kubectl_bin,
        &expired,
        &["get", "deployments", "-n", &team_a],
        None,
    )
    .await?;
    assert!(!refused.success(), "{refused:?}");
    let message = refused.messages();
    eprintln!("kubectl said for the expired token: {message}");
    assert!(
        message.contains("the OIDC ID token is refused") && message.contains("expired at"),
        "kubectl shows the hub's reason: {message}"
    );
    // Her valid token on an account the access rule (prod-*) does not name.
    let elsewhere = exec_kubeconfig(&dir, "alice-staging", &hub, &staging, &id_token)?;
    let refused = kubectl(
        &kubectl_bin,
        &elsewhere,
        &["get", "deployments", "-n", &team_a],
        None,
    )
    .await?;
    assert!(!refused.success(), "{refused:?}");
    let message = refused.messages();
    eprintln!("kubectl said on {staging}: {message}");
    assert!(
        message.contains("Error from server (Forbidden)")
            && message.contains(&format!("may not reach account \"{staging}\""))
            && message.contains("--oidc-access"),
        "kubectl shows the hub's reason: {message}"
    );

    // Both refusals are the hub's own: the requests reached no agent (lines are written just
    // after kubectl read the answer, so they are waited for).
    hub_line(&lines, "the expired token's refusal", |l| {
        l["served"] == "hub" && l["code"] == 401 && l["account"] == prod.as_str()
    })
    .await?;
    hub_line(&lines, "the refusal on staging", |l| {
        l["served"] == "hub" && l["code"] == 403 && l["account"] == staging.as_str()
    })
    .await?;

    // 6. Clouddriver's token on the same account keeps acting as the agent: it reads team-b,
    // its rules are the agent's, and the target sees nobody impersonated.
    let clouddriver = hub
        .kubeconfig(&prod, "clouddriver", &dir.join("clouddriver.kubeconfig"))
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
    assert_eq!(review["person"], false, "{review}");
    let machine_event = target_event(
        control_plane,
        review["request_id"].as_str().unwrap_or_default(),
    )
    .await?;
    assert_eq!(machine_event.impersonated_user, None, "{machine_event:?}");
    assert_eq!(
        machine_event.user.username,
        format!("system:serviceaccount:{team_a}:people-agent")
    );

    // 7. Carol, not in callerUsers, is admitted by her group: she lists in team-a as herself
    // (with the group), and the target's audit log names her.
    let carol_token = issuer.id_token("carol@example.com", &["team-a"], AUDIENCE);
    let carol = exec_kubeconfig(&dir, "carol", &hub, &prod, &carol_token)?;
    let listed = kubectl(
        &kubectl_bin,
        &carol,
        &["get", "deployments", "-n", &team_a, "-o", "name"],
        None,
    )
    .await?;
    assert!(listed.success(), "{}", listed.messages());
    assert!(
        listed.stdout.contains("deployment.apps/by-alice"),
        "{}",
        listed.stdout
    );
    let carol_list = hub_line(&lines, "carol's list in team-a", |l| {
        l["who"] == CAROL && l["verb"] == "list" && l["object"] == format!("deployments/{team_a}")
    })
    .await?;
    assert_eq!(carol_list["code"], 200, "{carol_list}");
    assert_eq!(carol_list["served"], "tunnel", "{carol_list}");
    let carol_event = target_event(
        control_plane,
        carol_list["request_id"].as_str().unwrap_or_default(),
    )
    .await?;
    let impersonated = carol_event
        .impersonated_user
        .clone()
        .ok_or_else(|| anyhow::anyhow!("carol's list impersonated nobody: {carol_event:?}"))?;
    assert_eq!(impersonated.username, CAROL_IN_TARGET, "{carol_event:?}");
    assert!(
        impersonated.groups.iter().any(|g| g == TEAM_A_IN_TARGET),
        "{carol_event:?}"
    );
    assert_eq!(carol_event.response_status.map(|s| s.code), Some(200));

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
