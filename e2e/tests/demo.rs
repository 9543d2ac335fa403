//! `make demo` end to end: `scale-agent-demo --once` sets up the control plane, hub, operator
//! and agent processes, narrates the hub's view of the cluster, and stops everything.

use std::{
    process::{Command, Stdio},
    time::{Duration, Instant},
};

use scale_agent_e2e::{demo, process};

#[test]
fn demo_once_shows_the_account_in_the_hub_and_leaves_nothing_running() -> anyhow::Result<()> {
    struct RemoveOnDrop(std::path::PathBuf);
    impl Drop for RemoveOnDrop {
        fn drop(&mut self) {
            let _ = std::fs::remove_dir_all(&self.0);
        }
    }
    let run_dir = std::env::temp_dir().join(format!("demo-once-test-{}", std::process::id()));
    let _cleanup = RemoveOnDrop(run_dir.clone());
    let demo = process::spawn_tied_to_this_process({
        let mut command = Command::new(env!("CARGO_BIN_EXE_scale-agent-demo"));
        command
            .arg(format!("--run-dir={}", run_dir.display()))
            .arg("--once")
            .stdout(Stdio::piped())
            .stderr(Stdio::piped());
        command
    })?;
    let output = demo.wait_with_output()?;
    let narration = String::from_utf8_lossy(&output.stdout);
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(
        output.status.success(),
        "the demo failed ({}):\n{narration}\n{stderr}",
        output.status
    );

    // Every process it started, by the `<name> pid <n>` lines.
    let pids: Vec<(String, u32)> = narration
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
        "scale-agent-hub",
        "scale-agent-operator",
        "demo-agent-local-0",
        "demo-agent-local-1",
    ] {
        assert!(
            names.contains(&expected),
            "no pid for {expected}:\n{narration}"
        );
    }

    // The operator's objects, and the account in the hub with objects streamed.
    for expected in [
        "scaleagent.scaleagent.dev/demo",
        "agentaccount.scaleagent.dev/demo-cluster",
        "deployment.apps/demo-agent",
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

    // Deploying through the hub: each operation's line says it succeeded, with real values.
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
    // The curl commands to repeat them, once per operation type.
    let curls: Vec<&str> = narration
        .lines()
        .map(str::trim_start)
        .filter(|l| {
            l.starts_with("curl -sS -X POST http://")
                && l.contains(&format!("/api/v1/accounts/{}/operations", demo::ACCOUNT))
        })
        .collect();
    assert_eq!(curls.len(), 5, "{curls:#?}");
    assert!(
        narration.contains("/api/v1/operations/op-"),
        "no operation to look up:\n{narration}"
    );

    assert!(narration.contains("nothing left running"), "{narration}");

    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let alive: Vec<_> = pids
            .iter()
            .filter(|(_, pid)| process::is_alive(*pid))
            .collect();
        if alive.is_empty() {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "still running after the demo exited: {alive:?}"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    Ok(())
}
