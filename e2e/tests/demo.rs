//! `make demo` end to end: `scale-agent-demo` sets up the control plane (with KWOK), hub,
//! operator and agent processes, narrates the hub's view of the cluster, kubectl through the
//! hub's Kubernetes API proxy and deployments through its operations API, then waits. While
//! it waits, this test uses what it printed for real (the kubeconfig, the hub's HTTPS API,
//! the admin command, the cluster directly); then it sends SIGTERM, as Ctrl-C would, and
//! checks that everything stopped.
//!
//! The guide's pages that this test runs: `docs/src/getting-started/laptop.md` and step 2 of
//! `docs/src/getting-started/walk-through.md`.

use std::{
    io::{BufRead, BufReader, Read},
    path::{Path, PathBuf},
    process::{Child, Command, Stdio},
    sync::mpsc,
    thread::JoinHandle,
    time::{Duration, Instant},
};

use scale_agent_e2e::{Binaries, demo, http::Call, process};

/// How long the demo may take to set everything up (a contended 2-core machine is slow).
const SETUP_TIMEOUT: Duration = Duration::from_secs(480);
/// How long it may take to stop everything after SIGTERM.
const STOP_TIMEOUT: Duration = Duration::from_secs(60);
/// The line the demo prints once everything is set up.
const WAITING: &str = "==> Press Ctrl-C to stop everything.";

/// The demo as a child process, its narration read line by line. Dropping it stops the demo
/// (SIGTERM, then SIGKILL), so a failed assertion leaves nothing running.
struct RunningDemo {
    child: Child,
    lines: mpsc::Receiver<String>,
    stderr: Option<JoinHandle<String>>,
    narration: String,
}

impl RunningDemo {
    fn start(run_dir: &Path) -> anyhow::Result<Self> {
        let mut command = Command::new(env!("CARGO_BIN_EXE_scale-agent-demo"));
        command
            .arg(format!("--run-dir={}", run_dir.display()))
            .stdout(Stdio::piped())
            .stderr(Stdio::piped());
        let mut child = process::spawn_tied_to_this_process(command)?;
        let stdout = child
            .stdout
            .take()
            .ok_or_else(|| anyhow::anyhow!("no stdout"))?;
        let mut stderr = child
            .stderr
            .take()
            .ok_or_else(|| anyhow::anyhow!("no stderr"))?;
        let (send, lines) = mpsc::channel();
        std::thread::spawn(move || {
            for line in BufReader::new(stdout).lines().map_while(Result::ok) {
                if send.send(line).is_err() {
                    break;
                }
            }
        });
        // Read stderr as it comes, so a full pipe never blocks the demo.
        let stderr = std::thread::spawn(move || {
            let mut text = String::new();
            let _ = stderr.read_to_string(&mut text);
            text
        });
        Ok(RunningDemo {
            child,
            lines,
            stderr: Some(stderr),
            narration: String::new(),
        })
    }

    /// Reads the narration until a line equal to `marker` (`None`: until the demo closes
    /// its output); an error if that does not happen within `timeout`.
    fn read_until(&mut self, marker: Option<&str>, timeout: Duration) -> anyhow::Result<()> {
        let deadline = Instant::now() + timeout;
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            match self.lines.recv_timeout(left) {
                Ok(line) => {
                    self.narration.push_str(&line);
                    self.narration.push('\n');
                    if marker == Some(line.as_str()) {
                        return Ok(());
                    }
                }
                Err(mpsc::RecvTimeoutError::Disconnected) if marker.is_none() => return Ok(()),
                Err(e) => {
                    let stderr = self.take_stderr();
                    anyhow::bail!(
                        "the demo did not print {marker:?} ({e}):\n{}\nstderr:\n{stderr}",
                        self.narration
                    )
                }
            }
        }
    }

    /// The demo's stderr, once it has closed it (after it exited).
    fn take_stderr(&mut self) -> String {
        if self.child.try_wait().ok().flatten().is_none() {
            return "(still running)".into();
        }
        self.stderr
            .take()
            .and_then(|thread| thread.join().ok())
            .unwrap_or_default()
    }

    /// Sends SIGTERM (what Ctrl-C in its terminal amounts to) and waits for the demo to
    /// exit, reading the rest of its narration; whether it exited with success.
    fn stop(&mut self) -> anyhow::Result<bool> {
        process::send_signal(self.child.id(), libc::SIGTERM);
        self.read_until(None, STOP_TIMEOUT)?;
        let deadline = Instant::now() + STOP_TIMEOUT;
        loop {
            if let Some(status) = self.child.try_wait()? {
                return Ok(status.success());
            }
            anyhow::ensure!(Instant::now() < deadline, "the demo did not exit");
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// The first line (trimmed) that starts with `prefix`.
    fn line_starting(&self, prefix: &str) -> anyhow::Result<&str> {
        self.narration
            .lines()
            .map(str::trim_start)
            .find(|l| l.starts_with(prefix))
            .ok_or_else(|| anyhow::anyhow!("no line {prefix:?}:\n{}", self.narration))
    }
}

impl Drop for RunningDemo {
    fn drop(&mut self) {
        if self.child.try_wait().ok().flatten().is_none() {
            process::send_signal(self.child.id(), libc::SIGTERM);
            let deadline = Instant::now() + STOP_TIMEOUT;
            while self.child.try_wait().ok().flatten().is_none() && Instant::now() < deadline {
                std::thread::sleep(Duration::from_millis(50));
            }
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
    }
}

/// Runs `program args`; its stdout, or an error with everything it printed.
fn run(program: &Path, args: &[&str], home: &Path) -> anyhow::Result<String> {
    let output = Command::new(program)
        .args(args)
        .env("HOME", home)
        .env_remove("KUBECONFIG")
        .output()?;
    anyhow::ensure!(
        output.status.success(),
        "{} {} failed ({}):\n{}{}",
        program.display(),
        args.join(" "),
        output.status,
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    );
    Ok(String::from_utf8_lossy(&output.stdout).into_owned())
}

#[test]
fn demo_narrates_kubectl_through_the_hub_and_stops_everything_on_sigterm() -> anyhow::Result<()> {
    struct RemoveOnDrop(PathBuf);
    impl Drop for RemoveOnDrop {
        fn drop(&mut self) {
            let _ = std::fs::remove_dir_all(&self.0);
        }
    }
    let run_dir = std::env::temp_dir().join(format!("demo-test-{}", std::process::id()));
    let _cleanup = RemoveOnDrop(run_dir.clone());
    let mut demo = RunningDemo::start(&run_dir)?;
    demo.read_until(Some(WAITING), SETUP_TIMEOUT)?;

    check_the_system_started(&demo.narration);
    check_kubectl_through_the_hub(&demo, &run_dir)?;
    check_deploying_through_the_hub(&demo.narration);

    // Every process it started, by the `<name> pid <n>` lines.
    let pids: Vec<(String, u32)> = demo
        .narration
        .lines()
        .filter_map(|line| {
            let words: Vec<&str> = line.split_whitespace().collect();
            let at = words.iter().position(|w| *w == "pid")?;
            Some((words.first()?.to_string(), words.get(at + 1)?.parse().ok()?))
        })
        .collect();
    let names: Vec<&str> = pids.iter().map(|(name, _)| name.as_str()).collect();
    for expected in [
        "etcd",
        "kube-apiserver",
        "kube-controller-manager",
        "kube-scheduler",
        "kwok",
        "scale-agent-hub",
        "scale-agent-operator",
        "demo-agent-local-0",
        "demo-agent-local-1",
    ] {
        assert!(
            names.contains(&expected),
            "no pid for {expected}:\n{}",
            demo.narration
        );
    }

    let succeeded = demo.stop()?;
    let narration = demo.narration.clone();
    assert!(
        succeeded,
        "the demo failed after SIGTERM:\n{narration}\n{}",
        demo.take_stderr()
    );
    assert!(narration.contains("nothing left running"), "{narration}");
    let alive = process::still_alive_after(&pids, Duration::from_secs(10));
    assert!(
        alive.is_empty(),
        "still running after the demo exited: {alive:?}"
    );
    Ok(())
}

/// The operator's objects, the account in the hub with objects streamed, and the scripted
/// change seen through it.
fn check_the_system_started(narration: &str) {
    for expected in [
        "scaleagent.scaleagent.dev/demo",
        "agentaccount.scaleagent.dev/demo-cluster",
        "deployment.apps/demo-agent   2/2",
        "secret/demo-agent-tls",
        "configmap/demo-agent",
        "serviceaccount/demo-agent",
    ] {
        assert!(narration.contains(expected), "no {expected}:\n{narration}");
    }
    let account_line = narration
        .lines()
        .find(|line| {
            line.trim_start()
                .starts_with(&format!("account {}: connected", demo::ACCOUNT))
        })
        .unwrap_or_else(|| panic!("the hub's view shows no account:\n{narration}"));
    let objects: u64 = account_line
        .split_whitespace()
        .skip_while(|w| !w.ends_with("),"))
        .nth(1)
        .and_then(|n| n.parse().ok())
        .unwrap_or(0);
    assert!(
        objects > 0,
        "no objects in the hub: {account_line}\n{narration}"
    );
    assert!(
        narration
            .lines()
            .any(|l| l.contains("hub: ") && l.contains("ConfigMap ")),
        "the scripted ConfigMaps never reached the hub:\n{narration}"
    );
    assert!(
        narration
            .lines()
            .any(|l| l.contains("hub: ") && l.contains("apps/Deployment")),
        "the scripted Deployment never reached the hub:\n{narration}"
    );
}

/// The new section, for real: the kubeconfig the admin command wrote works with kubectl
/// through the hub, its token was never printed, the object kubectl applied is in the
/// cluster, the hub's REST API answers over HTTPS with the printed CA, and the printed
/// `token list` command lists the kubeconfig's token.
fn check_kubectl_through_the_hub(demo: &RunningDemo, run_dir: &Path) -> anyhow::Result<()> {
    let narration = &demo.narration;
    let kubectl = Binaries::locate()?.kubectl();
    let home = run_dir.join("test-home");
    std::fs::create_dir_all(&home)?;

    // The admin command was run as printed, and wrote the kubeconfig (private).
    let issued = demo.line_starting("$ scale-agent-hub kubeconfig --account demo-cluster -o ")?;
    let kubeconfig = run_dir.join(demo::PROXY_KUBECONFIG);
    assert!(
        issued.contains(&format!("-o {} ", kubeconfig.display())),
        "{issued}"
    );
    let hub_url = issued
        .split_whitespace()
        .skip_while(|w| *w != "--hub-url")
        .nth(1)
        .ok_or_else(|| anyhow::anyhow!("no --hub-url in {issued}"))?
        .to_string();
    assert!(hub_url.starts_with("https://127.0.0.1:"), "{hub_url}");
    let text = std::fs::read_to_string(&kubeconfig)?;
    {
        use std::os::unix::fs::PermissionsExt as _;
        let mode = std::fs::metadata(&kubeconfig)?.permissions().mode() & 0o777;
        assert_eq!(mode, 0o600, "{}", kubeconfig.display());
    }
    let config: serde_json::Value = serde_saphyr::from_str(&text)?;
    assert_eq!(
        config["clusters"][0]["cluster"]["server"],
        format!("{hub_url}/clusters/{}", demo::ACCOUNT),
        "{text}"
    );
    let token = config["users"][0]["user"]["token"]
        .as_str()
        .ok_or_else(|| anyhow::anyhow!("no token in {text}"))?;
    assert!(
        !narration.contains(token),
        "the narration shows the whole token"
    );
    assert!(
        narration.contains(&format!("token: {}…", &token[..8])),
        "the narration does not show the token's start:\n{narration}"
    );

    // kubectl through the hub, in the narration and now.
    let listed = narration
        .split_once(&format!(
            "$ kubectl --kubeconfig {} get deploy -A\n",
            kubeconfig.display()
        ))
        .map(|(_, rest)| rest.lines().take_while(|l| !l.contains("$ ")).collect())
        .unwrap_or_else(Vec::<&str>::new);
    for (namespace, name) in [
        (demo::NAMESPACE, "demo-agent"),
        (demo::APPS_NAMESPACE, "web"),
    ] {
        assert!(
            listed.iter().any(|l| {
                let words: Vec<&str> = l.split_whitespace().collect();
                words.starts_with(&[namespace, name])
            }),
            "kubectl get deploy -A through the hub did not list {namespace}/{name}:\n{narration}"
        );
    }
    let kubeconfig_arg = format!("--kubeconfig={}", kubeconfig.display());
    let now = run(
        &kubectl,
        &[
            &kubeconfig_arg,
            "get",
            "deploy",
            "-A",
            "--no-headers",
            "-o",
            "custom-columns=NS:.metadata.namespace,NAME:.metadata.name",
        ],
        &home,
    )?;
    for expected in [
        format!("{} demo-agent", demo::NAMESPACE),
        format!("{} {}", demo::APPS_NAMESPACE, demo::SCRIPTED_DEPLOYMENT),
        format!("{} {}", demo::APPS_NAMESPACE, demo::PROXY_APP),
    ] {
        assert!(
            now.lines()
                .any(|l| l.split_whitespace().collect::<Vec<_>>().join(" ") == expected),
            "kubectl through the hub does not list {expected}:\n{now}"
        );
    }

    // What kubectl applied through the hub is in the cluster: read directly, as the admin,
    // written by kubectl's apply and rolled out to KWOK's pods.
    assert!(
        narration.contains(&format!("deployment.apps/{} created", demo::PROXY_APP))
            && narration.contains(&format!(
                "deployment \"{}\" successfully rolled out",
                demo::PROXY_APP
            )),
        "{narration}"
    );
    let admin = format!(
        "--kubeconfig={}",
        run_dir.join("admin.kubeconfig").display()
    );
    let direct = run(
        &kubectl,
        &[
            &admin,
            "get",
            "deployment",
            demo::PROXY_APP,
            "-n",
            demo::APPS_NAMESPACE,
            "-o",
            "jsonpath={.metadata.managedFields[*].manager} {.status.readyReplicas}",
        ],
        &home,
    )?;
    assert!(
        direct.contains("kubectl-client-side-apply") && direct.ends_with(" 2"),
        "{direct}"
    );
    assert!(
        narration.contains(&format!(
            "the API server (read directly with the admin client): deployment.apps/{} in {}",
            demo::PROXY_APP,
            demo::APPS_NAMESPACE
        )),
        "{narration}"
    );

    // The REST API over HTTPS, trusting the CA the curl commands name.
    let curl = demo.line_starting("curl --cacert ")?;
    let ca_file = curl
        .split_whitespace()
        .nth(2)
        .ok_or_else(|| anyhow::anyhow!("no CA in {curl}"))?;
    let ca_pem = std::fs::read_to_string(ca_file)?;
    // With the token from the file the curl command reads it from (role operator).
    let token_file = curl
        .split_once("Bearer $(cat ")
        .and_then(|(_, rest)| rest.split_once(')'))
        .map(|(file, _)| file)
        .ok_or_else(|| anyhow::anyhow!("no token file in {curl}"))?;
    let token = std::fs::read_to_string(token_file)?;
    let unauthenticated = tokio::runtime::Runtime::new()?.block_on(
        Call::new("GET", format!("{hub_url}/api/v1/agents"))
            .ca(ca_pem.clone())
            .send(),
    )?;
    assert_eq!(unauthenticated.status, 401, "{}", unauthenticated.body);
    let account = tokio::runtime::Runtime::new()?.block_on(
        Call::new(
            "GET",
            format!("{hub_url}/api/v1/accounts/{}", demo::ACCOUNT),
        )
        .ca(ca_pem)
        .bearer(token.trim())
        .fetch_json(),
    )?;
    assert_eq!(
        account.map(|a| a["state"].clone()),
        Some(serde_json::json!("connected"))
    );
    let hub_host = hub_url.trim_start_matches("https://");
    for curl in narration
        .lines()
        .map(str::trim_start)
        .filter(|l| l.starts_with("curl ") && l.contains(hub_host))
    {
        assert!(
            curl.contains(&format!("--cacert {ca_file} ")) && curl.contains(&hub_url),
            "a curl command to the hub without HTTPS and its CA: {curl}"
        );
        assert!(
            curl.contains(&format!("Bearer $(cat {token_file})")),
            "a curl command to the hub without its token: {curl}"
        );
    }

    // The printed `token list` command, run as printed (with the printed alias).
    let alias = demo.line_starting("alias scale-agent-hub=")?;
    let binary = Path::new(alias.trim_start_matches("alias scale-agent-hub="));
    assert!(binary.is_file(), "{alias}");
    let list = demo.line_starting("scale-agent-hub token list ")?;
    let args: Vec<&str> = list.split_whitespace().skip(1).collect();
    let tokens = run(binary, &args, &home)?;
    assert!(
        tokens
            .lines()
            .any(|l| l.contains(demo::ACCOUNT) && l.contains("kubeconfig")),
        "token list does not show the kubeconfig's token:\n{tokens}"
    );
    Ok(())
}

/// Deploying through the hub: each operation's line says it succeeded, with real values.
fn check_deploying_through_the_hub(narration: &str) {
    assert!(
        narration.contains("access Deploy"),
        "the ScaleAgent is not narrated as Deploy:\n{narration}"
    );
    let operation = |prefix: &str| -> String {
        narration
            .lines()
            .map(str::trim_start)
            .find(|l| l.starts_with(prefix))
            .unwrap_or_else(|| panic!("no operation line {prefix:?}:\n{narration}"))
            .to_owned()
    };
    let succeeded = |line: &str| {
        assert!(
            line.contains(": HTTP 20") && line.contains(" succeeded "),
            "the operation did not succeed: {line}\n{narration}"
        );
    };
    let image = |tag: &str| format!("{}:{tag}", demo::APP_IMAGE);
    let deployment = format!("Deployment {}", demo::APP);

    let apply = operation(&format!(
        "apply (server-side) {deployment} ({}",
        image("1.0")
    ));
    succeeded(&apply);
    let versions: Vec<u64> = apply
        .split("resourceVersion ")
        .nth(1)
        .unwrap_or_default()
        .split(|c: char| !c.is_ascii_digit())
        .filter_map(|n| n.parse().ok())
        .collect();
    assert_eq!(
        versions.len(),
        2,
        "no resourceVersions for the Deployment and Service: {apply}"
    );
    let change = operation(&format!(
        "apply (server-side) {deployment} with image {}",
        image("1.1")
    ));
    succeeded(&change);
    assert!(
        change.ends_with(&format!("image {}", image("1.1"))),
        "{change}"
    );
    assert!(
        narration.contains(&format!("revision 2: ReplicaSet {}-", demo::APP)),
        "no second revision:\n{narration}"
    );

    let scale = operation(&format!("scale {deployment} to 3"));
    succeeded(&scale);
    assert!(scale.ends_with("; replicas 3"), "{scale}");
    assert!(
        narration
            .lines()
            .any(|l| l.contains("follows: replicas 3, 3 Pods created")),
        "the ReplicaSet did not follow the scale:\n{narration}"
    );

    let history = operation(&format!("rollout history {deployment}"));
    succeeded(&history);
    assert!(history.ends_with("; revisions 1, 2"), "{history}");
    let undo = operation(&format!("rollout undo {deployment} to revision 1"));
    succeeded(&undo);
    assert!(
        undo.contains("rolled back") && undo.ends_with(&format!("image {}", image("1.0"))),
        "{undo}"
    );
    assert!(
        narration.contains(&format!(
            "the API server: {deployment} image {}, revision 3",
            image("1.0")
        )),
        "the API server does not show the image back at 1.0:\n{narration}"
    );

    let delete = operation(&format!(
        "delete {deployment} (propagation Foreground, wait)"
    ));
    succeeded(&delete);
    assert!(
        delete.ends_with(&format!(
            "deleted Deployment.apps/{}/{}",
            demo::APPS_NAMESPACE,
            demo::APP
        )),
        "{delete}"
    );
    let delete_service = operation(&format!("delete Service {}", demo::APP));
    succeeded(&delete_service);
    assert!(
        delete_service.ends_with(&format!(
            "deleted Service/{}/{}",
            demo::APPS_NAMESPACE,
            demo::APP
        )),
        "{delete_service}"
    );
    assert!(
        narration.contains("no Deployment, ReplicaSet, Pod or Service"),
        "the sample application was not gone:\n{narration}"
    );
    // The curl commands to repeat them, once per operation type, over HTTPS with the CA.
    let curls: Vec<&str> = narration
        .lines()
        .map(str::trim_start)
        .filter(|l| {
            l.starts_with("curl -sS --cacert ")
                && l.contains(" -X POST https://")
                && l.contains(&format!("/api/v1/accounts/{}/operations", demo::ACCOUNT))
        })
        .collect();
    assert_eq!(curls.len(), 5, "{curls:#?}");
    assert!(
        narration.contains("/api/v1/operations/op-"),
        "no operation to look up:\n{narration}"
    );
}
