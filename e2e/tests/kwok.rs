//! Pods run on the local control plane: kube-scheduler binds them to KWOK's fake nodes, kwok
//! makes them Running and Ready, so Deployments become Available, the real
//! `kubectl rollout status` finishes, a rolling update completes, and `kubectl logs -f`
//! streams lines a test appends. Also: the older kubectl clients Clouddriver ships work
//! against the control plane.

use std::{
    io::{BufRead, BufReader},
    path::Path,
    process::{Command, Output, Stdio},
    sync::mpsc,
    time::{Duration, Instant},
};

use k8s_openapi::api::{
    apps::v1::{Deployment, ReplicaSet},
    core::v1::Pod,
};
use kube::{
    Api, Client,
    api::{ListParams, PostParams},
};
use scale_agent_e2e::{
    ControlPlane, ControlPlaneOptions, KUBERNETES_VERSION, binaries::kubectl_client_versions, kwok,
    process, wait::wait_for,
};
use serde_json::json;

const TIMEOUT: Duration = Duration::from_secs(90);

fn control_plane() -> scale_agent_e2e::Result<&'static ControlPlane> {
    ControlPlane::shared_with(|| ControlPlaneOptions::default().with_kwok())
}

/// Runs `program` with the admin kubeconfig and `args`.
fn run(program: &Path, control_plane: &ControlPlane, args: &[&str]) -> std::io::Result<Output> {
    Command::new(program)
        .arg(format!(
            "--kubeconfig={}",
            control_plane.kubeconfig_path().display()
        ))
        .args(args)
        .output()
}

fn text(output: &Output) -> String {
    format!(
        "exit {}; stdout:\n{}\nstderr:\n{}",
        output.status,
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    )
}

fn deployment(name: &str, image: &str, replicas: i32) -> anyhow::Result<Deployment> {
    Ok(serde_json::from_value(json!({
        "metadata": { "name": name },
        "spec": {
            "replicas": replicas,
            "selector": { "matchLabels": { "app": name } },
            "strategy": { "rollingUpdate": { "maxUnavailable": 0, "maxSurge": 1 } },
            "template": {
                "metadata": { "labels": { "app": name } },
                "spec": { "containers": [{ "name": "app", "image": image }] },
            },
        },
    }))?)
}

fn is_running_and_ready(pod: &Pod) -> bool {
    let status = pod.status.as_ref();
    let running = status.and_then(|s| s.phase.as_deref()) == Some("Running");
    let ready = status
        .and_then(|s| s.conditions.as_ref())
        .is_some_and(|conditions| {
            conditions
                .iter()
                .any(|c| c.type_ == "Ready" && c.status == "True")
        });
    running && ready
}

fn image_of(pod: &Pod) -> Option<&str> {
    pod.spec
        .as_ref()
        .and_then(|spec| spec.containers.first())
        .and_then(|container| container.image.as_deref())
}

async fn pods_of(client: &Client, namespace: &str, app: &str) -> anyhow::Result<Vec<Pod>> {
    Ok(Api::<Pod>::namespaced(client.clone(), namespace)
        .list(&ListParams::default().labels(&format!("app={app}")))
        .await?
        .items)
}

#[tokio::test]
async fn deployment_becomes_available_with_running_ready_pods() -> anyhow::Result<()> {
    let control_plane = control_plane()?;
    let client = control_plane.client().await?;
    let namespace = control_plane.namespace(&client, "kwok-available").await?;
    let deployments = Api::<Deployment>::namespaced(client.clone(), &namespace);
    deployments
        .create(
            &PostParams::default(),
            &deployment("web", "registry.invalid/web:1", 2)?,
        )
        .await?;

    let available = wait_for("web to have 2 available replicas", || async {
        let status = deployments.get("web").await?.status.unwrap_or_default();
        anyhow::ensure!(status.available_replicas == Some(2), "{status:?}");
        Ok(Some(status))
    })
    .await?;
    assert_eq!(available.ready_replicas, Some(2), "{available:?}");
    assert!(
        available
            .conditions
            .unwrap_or_default()
            .iter()
            .any(|c| c.type_.as_deref() == Some("Available") && c.status.as_deref() == Some("True")),
        "no Available=True condition"
    );

    let pods = pods_of(&client, &namespace, "web").await?;
    assert_eq!(pods.len(), 2, "{pods:?}");
    for pod in &pods {
        assert!(is_running_and_ready(pod), "{:?}", pod.status);
        let node = pod.spec.as_ref().and_then(|s| s.node_name.as_deref());
        assert!(
            node.is_some_and(|n| kwok::NODES.contains(&n)),
            "bound to {node:?}"
        );
        let status = pod.status.as_ref();
        let pod_ip = status.and_then(|s| s.pod_ip.as_deref()).unwrap_or_default();
        assert!(pod_ip.starts_with("10.244."), "pod IP {pod_ip:?}");
        let container = status
            .and_then(|s| s.container_statuses.as_ref())
            .and_then(|statuses| statuses.first())
            .expect("a container status");
        assert!(container.ready, "{container:?}");
        assert!(
            container
                .state
                .as_ref()
                .is_some_and(|s| s.running.is_some()),
            "{container:?}"
        );
    }

    // The real kubectl's rollout status, as Spinnaker and people use it, is satisfied.
    let kubectl = control_plane.binaries().kubectl();
    let output = run(
        &kubectl,
        control_plane,
        &[
            "rollout",
            "status",
            "deployment/web",
            "-n",
            &namespace,
            "--timeout=60s",
        ],
    )?;
    assert!(output.status.success(), "{}", text(&output));
    assert!(
        String::from_utf8_lossy(&output.stdout).contains("successfully rolled out"),
        "{}",
        text(&output)
    );
    Ok(())
}

#[tokio::test]
async fn rolling_update_to_a_new_image_completes() -> anyhow::Result<()> {
    let control_plane = control_plane()?;
    let client = control_plane.client().await?;
    let namespace = control_plane.namespace(&client, "kwok-rollout").await?;
    let kubectl = control_plane.binaries().kubectl();
    let deployments = Api::<Deployment>::namespaced(client.clone(), &namespace);
    deployments
        .create(
            &PostParams::default(),
            &deployment("api", "registry.invalid/api:1", 2)?,
        )
        .await?;
    let rollout_status = [
        "rollout",
        "status",
        "deployment/api",
        "-n",
        &namespace,
        "--timeout=60s",
    ];
    let first = run(&kubectl, control_plane, &rollout_status)?;
    assert!(first.status.success(), "{}", text(&first));

    let set_image = run(
        &kubectl,
        control_plane,
        &[
            "set",
            "image",
            "deployment/api",
            "app=registry.invalid/api:2",
            "-n",
            &namespace,
        ],
    )?;
    assert!(set_image.status.success(), "{}", text(&set_image));
    let second = run(&kubectl, control_plane, &rollout_status)?;
    assert!(second.status.success(), "{}", text(&second));
    assert!(
        String::from_utf8_lossy(&second.stdout).contains("successfully rolled out"),
        "{}",
        text(&second)
    );

    let updated = deployments.get("api").await?;
    let status = updated.status.clone().unwrap_or_default();
    assert_eq!(
        status.observed_generation, updated.metadata.generation,
        "{status:?}"
    );
    assert_eq!(status.updated_replicas, Some(2), "{status:?}");
    assert_eq!(status.available_replicas, Some(2), "{status:?}");

    // Two ReplicaSets: the new one holds both replicas, the old one none.
    let replica_sets = Api::<ReplicaSet>::namespaced(client.clone(), &namespace)
        .list(&ListParams::default().labels("app=api"))
        .await?
        .items;
    assert_eq!(replica_sets.len(), 2, "{replica_sets:?}");
    for replica_set in &replica_sets {
        let image = replica_set
            .spec
            .template
            .as_ref()
            .and_then(|t| t.spec.as_ref())
            .and_then(|s| s.containers.first())
            .and_then(|c| c.image.clone());
        let replicas = replica_set.spec.replicas;
        let expected = if image.as_deref() == Some("registry.invalid/api:2") {
            2
        } else {
            0
        };
        assert_eq!(replicas, Some(expected), "{image:?}");
    }

    // kwok finishes deleting the old pods (a kubelet's job): only new ones remain.
    let pods = wait_for("only the new pods to remain", || async {
        let pods = pods_of(&client, &namespace, "api").await?;
        let images: Vec<_> = pods
            .iter()
            .map(|p| image_of(p).map(str::to_owned))
            .collect();
        anyhow::ensure!(
            pods.len() == 2
                && pods.iter().all(|p| {
                    image_of(p) == Some("registry.invalid/api:2") && is_running_and_ready(p)
                }),
            "{images:?}"
        );
        Ok(Some(pods))
    })
    .await?;
    assert_eq!(pods.len(), 2);
    Ok(())
}

/// Reads `kubectl logs -f`'s output lines on a thread, so the test can wait for each with
/// a timeout.
fn lines_of(stdout: impl std::io::Read + Send + 'static) -> mpsc::Receiver<String> {
    let (sender, receiver) = mpsc::channel();
    std::thread::spawn(move || {
        for line in BufReader::new(stdout).lines() {
            let Ok(line) = line else { break };
            if sender.send(line).is_err() {
                break;
            }
        }
    });
    receiver
}

#[tokio::test]
async fn kubectl_logs_follow_streams_lines_appended_later() -> anyhow::Result<()> {
    let control_plane = control_plane()?;
    let client = control_plane.client().await?;
    let namespace = control_plane.namespace(&client, "kwok-logs").await?;
    let pods = Api::<Pod>::namespaced(client.clone(), &namespace);
    for name in ["talker", "quiet"] {
        let pod: Pod = serde_json::from_value(json!({
            "metadata": { "name": name },
            "spec": { "containers": [{ "name": "app", "image": "registry.invalid/talker:1" }] },
        }))?;
        pods.create(&PostParams::default(), &pod).await?;
    }
    for name in ["talker", "quiet"] {
        wait_for("the pod to run", || async {
            let pod = pods.get(name).await?;
            anyhow::ensure!(is_running_and_ready(&pod), "{:?}", pod.status);
            Ok(Some(()))
        })
        .await?;
    }

    let log = control_plane.pod_log(&client, &namespace, "talker").await?;
    log.append("first line")?;
    let kubectl = control_plane.binaries().kubectl();
    let once = run(
        &kubectl,
        control_plane,
        &["logs", "talker", "-n", &namespace],
    )?;
    assert!(once.status.success(), "{}", text(&once));
    assert_eq!(String::from_utf8_lossy(&once.stdout), "first line\n");

    let mut follower = process::spawn_tied_to_this_process({
        let mut command = Command::new(&kubectl);
        command
            .arg(format!(
                "--kubeconfig={}",
                control_plane.kubeconfig_path().display()
            ))
            .args(["logs", "-f", "talker", "-n", &namespace])
            .stdout(Stdio::piped())
            .stderr(Stdio::null());
        command
    })?;
    let stdout = follower.stdout.take().expect("stdout is piped");
    let lines = lines_of(stdout);
    let first = lines.recv_timeout(Duration::from_secs(30));
    // Only appended once `kubectl logs -f` has printed what was there: it must stream.
    log.append("second line, after -f started")?;
    let second = lines.recv_timeout(Duration::from_secs(30));
    let still_running = follower.try_wait()?.is_none();
    follower.kill()?;
    follower.wait()?;
    assert_eq!(first.as_deref(), Ok("first line"));
    assert_eq!(second.as_deref(), Ok("second line, after -f started"));
    assert!(still_running, "kubectl logs -f stopped following");

    // A pod nobody gave a log of its own has an empty one, as a quiet container does.
    let quiet = run(
        &kubectl,
        control_plane,
        &["logs", "quiet", "-n", &namespace],
    )?;
    assert!(quiet.status.success(), "{}", text(&quiet));
    assert_eq!(
        String::from_utf8_lossy(&quiet.stdout),
        "",
        "{}",
        text(&quiet)
    );
    let mut quiet_follower = process::spawn_tied_to_this_process({
        let mut command = Command::new(&kubectl);
        command
            .arg(format!(
                "--kubeconfig={}",
                control_plane.kubeconfig_path().display()
            ))
            .args(["logs", "-f", "quiet", "-n", &namespace])
            .stdout(Stdio::piped())
            .stderr(Stdio::null());
        command
    })?;
    let quiet_lines = lines_of(quiet_follower.stdout.take().expect("stdout is piped"));
    let printed = quiet_lines.recv_timeout(Duration::from_secs(2));
    let still_waiting = quiet_follower.try_wait()?.is_none();
    quiet_follower.kill()?;
    quiet_follower.wait()?;
    assert_eq!(printed, Err(mpsc::RecvTimeoutError::Timeout));
    assert!(still_waiting, "kubectl logs -f of a quiet pod did not wait");
    Ok(())
}

#[tokio::test]
async fn older_kubectl_clients_report_their_versions_and_list_namespaces() -> anyhow::Result<()> {
    let control_plane = control_plane()?;
    let client = control_plane.client().await?;
    let namespace = control_plane.namespace(&client, "old-kubectl").await?;
    let versions = kubectl_client_versions();
    assert!(versions.len() >= 2, "{versions:?}");
    for version in versions {
        let minor: u32 = version
            .trim_start_matches("v1.")
            .split('.')
            .next()
            .unwrap_or_default()
            .parse()?;
        let kubectl = control_plane.binaries().kubectl_client(minor);
        let client_version = Command::new(&kubectl)
            .args(["version", "--client"])
            .output()?;
        assert!(
            client_version.status.success(),
            "{version}: {}",
            text(&client_version)
        );
        let printed = String::from_utf8_lossy(&client_version.stdout);
        // 1.22 prints a version.Info struct, 1.29 a plain line; both hold the release.
        assert!(
            printed.contains(version) && !printed.contains(KUBERNETES_VERSION),
            "{version}: {printed}"
        );

        let listed = run(
            &kubectl,
            control_plane,
            &["get", "namespaces", "-o", "name"],
        )?;
        assert!(listed.status.success(), "{version}: {}", text(&listed));
        let names = String::from_utf8_lossy(&listed.stdout);
        for expected in ["namespace/default", &format!("namespace/{namespace}")] {
            assert!(
                names.lines().any(|line| line == expected),
                "{version}: {expected} not in\n{names}"
            );
        }
    }
    Ok(())
}

/// Names the run directory of the owner process below; unset, that test does nothing.
const OWNER_RUN_DIR: &str = "SCALE_AGENT_E2E_KWOK_OWNER_RUN_DIR";

/// Not a test by itself: the process that owns a control plane with kwok in
/// `killing_the_owner_stops_the_scheduler_and_kwok`, which runs this test binary again with
/// only this test selected, and kills it.
#[test]
#[ignore = "run as a child process by killing_the_owner_stops_the_scheduler_and_kwok"]
fn kwok_owner_process() -> anyhow::Result<()> {
    let Some(run_dir) = std::env::var_os(OWNER_RUN_DIR) else {
        return Ok(());
    };
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    let control_plane = runtime.block_on(ControlPlane::start(ControlPlaneOptions {
        run_dir: Some(run_dir.into()),
        ..ControlPlaneOptions::default().with_kwok()
    }))?;
    for (name, pid) in control_plane.pids() {
        println!("owner: {name} pid {pid}");
    }
    println!("owner: ready");
    std::thread::sleep(Duration::from_secs(600));
    Ok(())
}

/// Kills (SIGKILL, no clean-up) a process that started a control plane with kwok, and checks
/// that kube-scheduler and kwok die with it like the other components.
#[test]
fn killing_the_owner_stops_the_scheduler_and_kwok() -> anyhow::Result<()> {
    let run_dir = std::env::temp_dir().join(format!("kwok-owner-{}", std::process::id()));
    let mut owner = process::spawn_tied_to_this_process({
        let mut command = Command::new(std::env::current_exe()?);
        command
            .args(["kwok_owner_process", "--exact", "--ignored", "--nocapture"])
            .env(OWNER_RUN_DIR, &run_dir)
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit());
        command
    })?;
    let lines = lines_of(owner.stdout.take().expect("stdout is piped"));
    let mut pids = Vec::new();
    let deadline = Instant::now() + TIMEOUT;
    loop {
        let line = lines.recv_timeout(deadline.saturating_duration_since(Instant::now()));
        let Ok(line) = line else {
            let _ = owner.kill();
            anyhow::bail!("the owner process did not get ready; pids so far {pids:?}");
        };
        if line == "owner: ready" {
            break;
        }
        if let ["owner:", name, "pid", pid] = line.split_whitespace().collect::<Vec<_>>()[..] {
            pids.push((name.to_string(), pid.parse::<u32>()?));
        }
    }
    let names: Vec<&str> = pids.iter().map(|(name, _)| name.as_str()).collect();
    assert_eq!(
        names,
        [
            "etcd",
            "kube-apiserver",
            "kube-controller-manager",
            "kube-scheduler",
            "kwok"
        ]
    );
    assert!(pids.iter().all(|(_, pid)| process::is_alive(*pid)));

    owner.kill()?;
    owner.wait()?;
    let deadline = Instant::now() + Duration::from_secs(10);
    let alive = loop {
        let alive: Vec<_> = pids
            .iter()
            .filter(|(_, pid)| process::is_alive(*pid))
            .collect();
        if alive.is_empty() || Instant::now() > deadline {
            break alive;
        }
        std::thread::sleep(Duration::from_millis(50));
    };
    let _ = std::fs::remove_dir_all(&run_dir);
    assert!(
        alive.is_empty(),
        "still running after the owner died: {alive:?}"
    );
    Ok(())
}
