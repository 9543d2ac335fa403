//! The operator command (`run`, the real binary) at start-up against a real control plane
//! (issue 11, operator defects 1 and 3): without the rights to watch what its controllers
//! watch it exits non-zero with an error that names the kind and what to grant, and `/readyz`
//! says ok only once the controllers run; a `ScaleAgent` the Rust type cannot read does not
//! stop the others from being reconciled.

use std::{
    net::SocketAddr,
    process::Command,
    sync::Arc,
    time::{Duration, Instant},
};

use k8s_openapi::api::{
    core::v1::ServiceAccount,
    rbac::v1::{PolicyRule, Role, RoleBinding, RoleRef, Subject},
};
use kube::{
    Api, Client,
    api::{ApiResource, DynamicObject, ObjectMeta, Patch, PatchParams, PostParams},
};
use scale_agent_crds::{
    ScaleAgent,
    conditions::{DEGRADED, find_condition},
};
use scale_agent_e2e::{
    ControlPlane, crds, fixtures,
    http::Call,
    local_agent::free_port,
    operator::{Operator, wait_for_event},
    process::ManagedProcess,
    wait::wait_for,
};
use scale_agent_operator::{Config, Metrics, policy::WatchNamespaces};

const TIMEOUT: Duration = Duration::from_secs(60);

/// An admin client, the CRDs installed, and a fresh namespace.
async fn setup(prefix: &str) -> anyhow::Result<(&'static ControlPlane, Client, String)> {
    let control_plane = ControlPlane::shared()?;
    let client = control_plane.client().await?;
    crds::install(&client, &crds::read_crds(&crds::manifests_dir())?).await?;
    let namespace = control_plane.namespace(&client, prefix).await?;
    Ok((control_plane, client, namespace))
}

/// The operator binary watching `namespace`, as the user of `kubeconfig`, with its log in
/// `dir`; and the address of its health listener.
fn start_operator(
    kubeconfig: &std::path::Path,
    namespace: &str,
    dir: &std::path::Path,
) -> anyhow::Result<(ManagedProcess, SocketAddr)> {
    start_operator_with(kubeconfig, namespace, &dir.join("operator.log"), |_| {})
}

/// [`start_operator`] with more arguments or environment set by `extra`, logging to `log`.
fn start_operator_with(
    kubeconfig: &std::path::Path,
    namespace: &str,
    log: &std::path::Path,
    extra: impl FnOnce(&mut Command),
) -> anyhow::Result<(ManagedProcess, SocketAddr)> {
    let health = SocketAddr::from(([127, 0, 0, 1], free_port()?));
    let mut command = Command::new(env!("CARGO_BIN_EXE_e2e-operator"));
    command
        .arg(format!("--metrics-address={health}"))
        .arg(format!("--watch-namespaces={namespace}"))
        .env("KUBECONFIG", kubeconfig)
        .env("RUST_LOG", "info");
    extra(&mut command);
    let operator =
        ManagedProcess::spawn_command("scale-agent-operator", command, log.to_path_buf())?;
    Ok((operator, health))
}

/// `/readyz`'s answer, or `None` while nothing listens.
async fn readyz(health: SocketAddr) -> Option<(u16, String)> {
    Call::new("GET", format!("http://{health}/readyz"))
        .timeout(Duration::from_secs(2))
        .send()
        .await
        .ok()
        .map(|response| (response.status, response.body))
}

/// A ServiceAccount in `namespace` that may read ScaleAgents and AgentAccounts there and
/// nothing else (not the Deployments, ConfigMaps, Secrets and RBAC the controllers watch).
async fn account_that_reads_only_the_custom_resources(
    control_plane: &ControlPlane,
    client: &Client,
    namespace: &str,
) -> anyhow::Result<String> {
    let name = "operator-without-rights";
    let meta = ObjectMeta {
        name: Some(name.into()),
        ..Default::default()
    };
    let post = PostParams::default();
    Api::<ServiceAccount>::namespaced(client.clone(), namespace)
        .create(
            &post,
            &ServiceAccount {
                metadata: meta.clone(),
                ..Default::default()
            },
        )
        .await?;
    Api::<Role>::namespaced(client.clone(), namespace)
        .create(
            &post,
            &Role {
                metadata: meta.clone(),
                rules: Some(vec![PolicyRule {
                    api_groups: Some(vec![scale_agent_crds::GROUP.into()]),
                    resources: Some(vec!["scaleagents".into(), "agentaccounts".into()]),
                    verbs: vec!["get".into(), "list".into(), "watch".into()],
                    ..Default::default()
                }]),
            },
        )
        .await?;
    Api::<RoleBinding>::namespaced(client.clone(), namespace)
        .create(
            &post,
            &RoleBinding {
                metadata: meta,
                role_ref: RoleRef {
                    api_group: Some("rbac.authorization.k8s.io".into()),
                    kind: "Role".into(),
                    name: name.into(),
                },
                subjects: Some(vec![Subject {
                    kind: "ServiceAccount".into(),
                    name: name.into(),
                    namespace: Some(namespace.into()),
                    ..Default::default()
                }]),
            },
        )
        .await?;
    Ok(control_plane
        .service_account_token(client, namespace, name)
        .await?)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_operator_that_may_not_watch_its_objects_exits_with_the_error_and_is_never_ready()
-> anyhow::Result<()> {
    let (control_plane, client, namespace) = setup("operator-forbidden").await?;
    let token =
        account_that_reads_only_the_custom_resources(control_plane, &client, &namespace).await?;
    let dir = fixtures::temp_dir("operator-forbidden")?;
    let kubeconfig = dir.join("kubeconfig");
    std::fs::write(&kubeconfig, control_plane.kubeconfig_for_token(&token))?;
    let (mut operator, health) = start_operator(&kubeconfig, &namespace, &dir)?;

    // Until it exits, /readyz must never say ok: its controllers cannot run.
    let deadline = Instant::now() + TIMEOUT;
    let status = loop {
        if let Err(scale_agent_e2e::Error::Exited { status, .. }) = operator.ensure_running() {
            break status;
        }
        if let Some((200, body)) = readyz(health).await {
            anyhow::bail!(
                "/readyz answered 200 {body:?} although the operator may not watch Deployments"
            );
        }
        anyhow::ensure!(
            Instant::now() < deadline,
            "the operator still runs after {TIMEOUT:?} without the rights to watch Deployments; log:\n{}",
            std::fs::read_to_string(operator.log())?
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    let log = std::fs::read_to_string(operator.log())?;
    assert!(!status.success(), "exit status {status}; log:\n{log}");
    for expected in [
        format!("failed to list Deployments in namespace {namespace}"),
        "forbidden".to_owned(),
        // What to change.
        "give the operator's ServiceAccount the rules of manifests/operator/rbac.yaml".to_owned(),
    ] {
        assert!(
            log.contains(&expected),
            "no {expected:?} in the log:\n{log}"
        );
    }
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn readyz_says_ok_only_once_the_controllers_run() -> anyhow::Result<()> {
    let (control_plane, _client, namespace) = setup("operator-ready").await?;
    let dir = fixtures::temp_dir("operator-ready")?;
    let (mut operator, health) = start_operator(control_plane.kubeconfig_path(), &namespace, &dir)?;
    let deadline = Instant::now() + TIMEOUT;
    let mut answers = Vec::new();
    loop {
        operator.ensure_running()?;
        let answer = readyz(health).await;
        if let Some((status, body)) = &answer {
            if *status == 200 {
                assert_eq!(body, "ok");
                break;
            }
            assert_eq!(*status, 503, "{body}");
            assert!(body.contains("controllers not running"), "{body}");
        }
        answers.push(answer);
        anyhow::ensure!(
            Instant::now() < deadline,
            "/readyz not ok after {TIMEOUT:?}: {answers:?}; log:\n{}",
            std::fs::read_to_string(operator.log())?
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    // Ready was said after the controllers' caches were filled, not before.
    let log = std::fs::read_to_string(operator.log())?;
    assert!(
        log.contains("controllers running: caches filled"),
        "/readyz said ok before the controllers ran; log:\n{log}"
    );
    operator.stop(Duration::from_secs(10));
    Ok(())
}

fn scale_agent_json(name: &str) -> serde_json::Value {
    serde_json::json!({
        "apiVersion": "scaleagent.dev/v1alpha1",
        "kind": "ScaleAgent",
        "metadata": { "name": name },
        "spec": {
            "hub": { "address": "hub.spinnaker.example.com:9091" },
            "clientCertificate": { "issuerSecretRef": { "name": "agent-ca" } },
        },
    })
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unreadable_scale_agent_gets_an_event_and_the_others_are_still_reconciled()
-> anyhow::Result<()> {
    let (_, client, namespace) = setup("operator-unreadable").await?;
    // A condition's `lastTransitionTime` has `format: date-time` in the CRD's schema; the API
    // server accepts a time with ten fractional digits, but the Rust type (a jiff timestamp,
    // at most nanoseconds) cannot read it. Nothing in the schema is loosened.
    let raw = Api::<DynamicObject>::namespaced_with(
        client.clone(),
        &namespace,
        &ApiResource::erase::<ScaleAgent>(&()),
    );
    raw.create(
        &PostParams::default(),
        &serde_json::from_value(scale_agent_json("broken"))?,
    )
    .await?;
    let condition = serde_json::json!({
        "type": "Ready", "status": "False", "reason": "Set", "message": "by hand",
        "lastTransitionTime": "2024-01-01T00:00:00.1234567891Z",
    });
    raw.patch_status(
        "broken",
        &PatchParams::default(),
        &Patch::Merge(serde_json::json!({ "status": { "conditions": [condition] } })),
    )
    .await?;
    let agents = Api::<ScaleAgent>::namespaced(client.clone(), &namespace);
    let unreadable = agents.get("broken").await;
    assert!(
        matches!(unreadable, Err(kube::Error::SerdeError(_))),
        "the premise: the Rust type must refuse the stored object, got {unreadable:?}"
    );

    let operator = Operator::watching(client.clone(), &namespace);
    raw.create(
        &PostParams::default(),
        &serde_json::from_value(scale_agent_json("good"))?,
    )
    .await?;

    // The readable one is reconciled: without operator-signed certificates allowed, it is
    // Degraded, saying so.
    let reason = wait_for("the readable ScaleAgent's Degraded condition", || async {
        let agent = agents.get("good").await?;
        Ok(agent
            .status
            .as_ref()
            .and_then(|s| find_condition(&s.conditions, DEGRADED))
            .map(|c| c.reason.clone()))
    })
    .await?;
    assert_eq!(reason, "OperatorSignedCertificatesNotAllowed");

    // The unreadable one gets a Warning Event saying why and what to do.
    let event =
        wait_for_event(&client, &namespace, "InvalidObject", "ScaleAgent", "broken").await?;
    assert_eq!(event.type_.as_deref(), Some("Warning"));
    let note = event.note.unwrap_or_default();
    for part in ["cannot read this ScaleAgent", "kubectl edit scaleagent -n"] {
        assert!(
            note.contains(part),
            "no {part:?} in the Event's note: {note}"
        );
    }

    operator.stop().await
}

/// The operator binary with leader election on a short Lease, as instance `instance`.
fn start_electing_operator(
    control_plane: &ControlPlane,
    namespace: &str,
    instance: &str,
    dir: &std::path::Path,
) -> anyhow::Result<(ManagedProcess, SocketAddr)> {
    let log = dir.join(format!("{instance}.log"));
    start_operator_with(
        control_plane.kubeconfig_path(),
        namespace,
        &log,
        |command| {
            command
                .arg("--leader-election")
                .arg(format!("--leader-election-namespace={namespace}"))
                .arg(format!(
                    "--leader-election-duration-seconds={}",
                    LEASE_DURATION.as_secs()
                ))
                .arg("--leader-election-grace-seconds=2")
                .env("POD_NAME", instance);
        },
    )
}

const LEASE_DURATION: Duration = Duration::from_secs(6);

/// Issue 12, item 4: two operators elect a leader through a Lease; only the leader
/// reconciles, the standby is ready; when the leader is killed (SIGKILL, no release) the
/// standby takes the Lease once it expires and reconciles a change made meanwhile.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_standby_operator_takes_over_when_the_leader_is_killed() -> anyhow::Result<()> {
    use k8s_openapi::api::coordination::v1::Lease;
    let (control_plane, client, namespace) = setup("operator-leader").await?;
    let dir = fixtures::temp_dir("operator-leader")?;
    let leases = Api::<Lease>::namespaced(client.clone(), &namespace);
    let holder = || async {
        Ok::<_, anyhow::Error>(
            leases
                .get_opt(scale_agent_operator::leader::DEFAULT_LEASE)
                .await?
                .and_then(|l| l.spec)
                .and_then(|s| s.holder_identity),
        )
    };
    let (leader, _) = start_electing_operator(control_plane, &namespace, "op-a", &dir)?;
    wait_for("op-a to hold the Lease", || async {
        Ok((holder().await?.as_deref() == Some("op-a")).then_some(()))
    })
    .await?;
    let (mut standby, standby_health) =
        start_electing_operator(control_plane, &namespace, "op-b", &dir)?;
    // Until it has first tried the Lease the standby answers 503 "starting"; then 200.
    let (code, body) = wait_for("the standby's /readyz to leave \"starting\"", || async {
        Ok(readyz(standby_health)
            .await
            .filter(|(code, body)| !(*code == 503 && body.contains("starting"))))
    })
    .await?;
    assert_eq!(code, 200, "{body}");
    assert!(body.contains("standing by"), "{body}");

    let agents = Api::<ScaleAgent>::namespaced(client.clone(), &namespace);
    let mut manifest = scale_agent_json("prod");
    manifest["spec"]["hub"]["tls"] = serde_json::json!({ "insecurePlaintext": true });
    let apply = PatchParams::apply("e2e").force();
    let applied = agents
        .patch("prod", &apply, &Patch::Apply(&manifest))
        .await?;
    let observed = |generation: Option<i64>| {
        let agents = agents.clone();
        async move {
            let agent = agents.get("prod").await?;
            Ok::<_, anyhow::Error>(
                agent
                    .status
                    .and_then(|s| s.observed_generation)
                    .is_some_and(|g| Some(g) == generation),
            )
        }
    };
    wait_for("the leader to reconcile prod", || async {
        Ok(observed(applied.metadata.generation).await?.then_some(()))
    })
    .await?;
    // One writer: the standby never started its controllers.
    let standby_log = std::fs::read_to_string(standby.log())?;
    assert!(
        !standby_log.contains("controllers started"),
        "the standby reconciles while the leader holds the Lease:\n{standby_log}"
    );
    assert_eq!(holder().await?.as_deref(), Some("op-a"));

    // Killed: no release, the Lease must expire.
    scale_agent_e2e::process::send_signal(leader.pid(), libc::SIGKILL);
    let killed = Instant::now();
    manifest["spec"]["replicas"] = serde_json::json!(3);
    let changed = agents
        .patch("prod", &apply, &Patch::Apply(&manifest))
        .await?;
    assert_ne!(changed.metadata.generation, applied.metadata.generation);
    wait_for("the standby to reconcile the change", || async {
        Ok(observed(changed.metadata.generation).await?.then_some(()))
    })
    .await?;
    let took = killed.elapsed();
    assert_eq!(holder().await?.as_deref(), Some("op-b"));
    // The Lease's duration, plus the standby's retry period and the controllers' start
    // (generous: two shared cores).
    assert!(
        took < LEASE_DURATION * 4,
        "the standby took {took:?} to take over a Lease of {LEASE_DURATION:?}"
    );
    let standby_log = std::fs::read_to_string(standby.log())?;
    assert!(standby_log.contains("holds the Lease"), "{standby_log}");
    eprintln!("the standby reconciled {took:?} after the leader was killed");

    standby.stop(Duration::from_secs(10));
    // A clean stop releases the Lease.
    wait_for("the Lease to be released", || async {
        Ok(holder().await?.is_none().then_some(()))
    })
    .await?;
    drop(leader);
    let _ = std::fs::remove_dir_all(&dir);
    Ok(())
}

/// The release-blocking flake: an operator stopped before its controllers' caches hold their
/// first list (here: stopped before it starts, the extreme of a slow cluster-wide LIST under
/// load) must still stop. kube-runtime's graceful shutdown alone waits forever for a runner
/// that starts only once the cache is filled.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_operator_stopped_before_its_caches_fill_still_stops() -> anyhow::Result<()> {
    let (_, client, namespace) = setup("operator-early-stop").await?;
    let metrics = Arc::new(Metrics::new());
    let config = Config {
        // A namespace list: the controllers of the unwatched namespaces run as well.
        watch_namespaces: WatchNamespaces::Only([namespace.clone()].into()),
        instance: Some(format!("e2e-{namespace}")),
        ..Config::default()
    };
    // Generous: the start-up checks (a few LISTs) run first, on a loaded machine.
    let stopped = tokio::time::timeout(
        Duration::from_secs(120),
        scale_agent_operator::run_controllers(client, config, metrics.clone(), async {}),
    )
    .await;
    let result = stopped.map_err(|_| {
        anyhow::anyhow!(
            "the operator did not stop within 120 s of a shutdown that came before its caches \
             were filled"
        )
    })?;
    result?;
    assert!(
        !metrics.controllers_running(),
        "stopped controllers must not be reported as running"
    );
    Ok(())
}
