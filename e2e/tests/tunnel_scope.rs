//! One account's token reaches one account (issue 28, F8), on a real control plane: an agent
//! whose ServiceAccount may do everything serves two accounts, `team-a` (namespace a) and
//! `team-b` (namespace b). Before, team-a's kubeconfig read and wrote namespace b and listed
//! every namespace (the agent replayed any path with its own credentials). Now the agent
//! refuses, with a message, what lies outside the account's namespaces, and kubectl shows
//! it; each account's own namespace works, for reads and writes. The same set-up checks
//! Secrets with the real kubectl (issue 28, F3): team-a, without `allowSecretData`, lists its
//! Secrets' names and gets a Secret without its data, with the hub's warning.

use std::time::Duration;

use k8s_openapi::api::core::v1::ConfigMap;
use kube::{Api, Client, api::PostParams};
use scale_agent_e2e::{
    ControlPlane, ControlPlaneOptions,
    fixtures::{self, TlsHub, temp_dir},
    kubectl::Kubectl,
};
use serde_json::json;

const KUBECTL_TIMEOUT: Duration = Duration::from_secs(90);

fn args(list: &[&str]) -> Vec<String> {
    list.iter().map(|s| s.to_string()).collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_accounts_kubeconfig_reaches_its_namespaces_and_not_its_siblings() -> anyhow::Result<()>
{
    scale_agent_e2e::fixtures::init_logs("warn");
    let control_plane = ControlPlane::shared_with(ControlPlaneOptions::default)?;
    let admin: Client = control_plane.client().await?;
    let a = control_plane.namespace(&admin, "scope-a").await?;
    let b = control_plane.namespace(&admin, "scope-b").await?;
    let dir = temp_dir("scale-agent-e2e-tunnel-scope")?;
    // The agent may do everything, everywhere: what stops team-a is the agent, not RBAC.
    let agent_kubeconfig = fixtures::service_account_identity(
        control_plane,
        &admin,
        &a,
        "agent",
        fixtures::Scope::Cluster,
        fixtures::admin_rules(),
        dir.join("agent.kubeconfig"),
    )
    .await?;
    let secret_cm: ConfigMap = serde_json::from_value(json!({
        "metadata": {"name": "team-b-only", "namespace": b},
        "data": {"owner": "team-b"},
    }))?;
    Api::<ConfigMap>::namespaced(admin.clone(), &b)
        .create(&PostParams::default(), &secret_cm)
        .await?;

    let secret: k8s_openapi::api::core::v1::Secret = serde_json::from_value(json!({
        "metadata": {"name": "db", "namespace": a},
        "stringData": {"password": "plain-marker-4711"},
    }))?;
    Api::<k8s_openapi::api::core::v1::Secret>::namespaced(admin.clone(), &a)
        .create(&PostParams::default(), &secret)
        .await?;
    let hub = TlsHub::start(&dir, |_| {}).await?;
    let suffix = format!("{:06x}", rand::random::<u32>() & 0xff_ffff);
    let (team_a, team_b) = (format!("team-a-{suffix}"), format!("team-b-{suffix}"));
    let config = dir.join("agent.yaml");
    fixtures::write_plaintext_agent_config(
        &config,
        hub.hub.grpc_addr,
        json!([
            fixtures::account(&team_a, &agent_kubeconfig, &a, &["configmaps", "secrets"]),
            fixtures::account(&team_b, &agent_kubeconfig, &b, &["configmaps"]),
        ]),
        2,
    )?;
    let agent = fixtures::start_agent_replica(&config, "scope-0").await?;
    hub.wait_connected(&team_a, 1).await?;
    hub.wait_connected(&team_b, 1).await?;
    let kubectl = Kubectl::new(control_plane.binaries().kubectl(), dir.join("home"));
    let a_kubeconfig = hub
        .kubeconfig(&team_a, "person", &dir.join("team-a.kubeconfig"))
        .await?;
    let b_kubeconfig = hub
        .kubeconfig(&team_b, "person", &dir.join("team-b.kubeconfig"))
        .await?;
    let run = |kubeconfig: std::path::PathBuf, list: Vec<String>, stdin: Option<String>| {
        let kubectl = &kubectl;
        async move {
            kubectl
                .run(&kubeconfig, &list, stdin.as_deref(), KUBECTL_TIMEOUT)
                .await
        }
    };

    // team-a in team-b's namespace: refused by the agent, with a message kubectl shows.
    // (Pods and a named ConfigMap: the hub's cache does not answer them for namespace b, so
    // they reach the agent.)
    for attempt in [
        args(&["get", "pods", "-n", &b]),
        args(&["get", "configmap", "team-b-only", "-n", &b, "-o", "json"]),
        args(&[
            "create",
            "configmap",
            "planted",
            "-n",
            &b,
            "--from-literal=x=y",
        ]),
    ] {
        let outcome = run(a_kubeconfig.clone(), attempt.clone(), None).await?;
        assert!(!outcome.success(), "{attempt:?}: {outcome:?}");
        let messages = outcome.messages();
        assert!(
            messages.contains(&format!(
                "account \"{team_a}\" serves namespaces [\"{a}\"] only"
            )) && messages.contains(&format!("namespace \"{b}\"")),
            "{attempt:?}: {messages}"
        );
        assert!(
            !outcome.stdout.contains("team-b"),
            "{attempt:?}: {outcome:?}"
        );
    }
    assert!(
        Api::<ConfigMap>::namespaced(admin.clone(), &b)
            .get_opt("planted")
            .await?
            .is_none(),
        "team-a wrote into namespace b"
    );
    // Listing every namespace, or every namespace's pods: refused too.
    for attempt in [
        args(&["get", "namespaces"]),
        args(&["get", "pods", "--all-namespaces"]),
    ] {
        let outcome = run(a_kubeconfig.clone(), attempt.clone(), None).await?;
        assert!(!outcome.success(), "{attempt:?}: {outcome:?}");
        let messages = outcome.messages();
        assert!(
            messages.contains("across all namespaces or on cluster-scoped objects"),
            "{attempt:?}: {messages}"
        );
    }

    // Each account in its own namespace: reads and writes work.
    let outcome = run(a_kubeconfig.clone(), args(&["get", "pods", "-n", &a]), None).await?;
    assert!(outcome.success(), "{}", outcome.messages());
    let outcome = run(
        a_kubeconfig.clone(),
        args(&["create", "configmap", "own", "-n", &a, "--from-literal=x=y"]),
        None,
    )
    .await?;
    assert!(outcome.success(), "{}", outcome.messages());
    assert!(
        Api::<ConfigMap>::namespaced(admin.clone(), &a)
            .get_opt("own")
            .await?
            .is_some()
    );
    let outcome = run(
        b_kubeconfig.clone(),
        args(&[
            "get",
            "configmap",
            "team-b-only",
            "-n",
            &b,
            "-o",
            "jsonpath={.data.owner}",
        ]),
        None,
    )
    .await?;
    assert!(outcome.success(), "{}", outcome.messages());
    assert_eq!(outcome.stdout.trim(), "team-b");

    // Issue 28, F3, with the real kubectl: team-a (no allowSecretData) lists its Secrets'
    // names (kubectl asks for a Table; the hub's cache answers with the JSON list) and gets
    // a Secret without its data, with the hub's warning on stderr.
    let deadline = tokio::time::Instant::now() + Duration::from_secs(60);
    let listed = loop {
        let outcome = run(
            a_kubeconfig.clone(),
            args(&["get", "secrets", "-n", &a]),
            None,
        )
        .await?;
        if outcome.success() || tokio::time::Instant::now() > deadline {
            break outcome;
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    };
    assert!(listed.success(), "{}", listed.messages());
    assert!(listed.stdout.contains("db"), "{listed:?}");
    let one = run(
        a_kubeconfig.clone(),
        args(&["get", "secret", "db", "-n", &a, "-o", "json"]),
        None,
    )
    .await?;
    assert!(one.success(), "{}", one.messages());
    assert!(!one.stdout.contains("\"data\""), "{}", one.stdout);
    assert!(
        !one.stdout.contains("cGxhaW4tbWFya2VyLTQ3MTE"),
        "{}",
        one.stdout
    );
    assert!(one.stderr.contains("allowSecretData"), "{}", one.stderr);

    drop(agent);
    hub.hub.shutdown().await?;
    let _ = std::fs::remove_dir_all(&dir);
    Ok(())
}
