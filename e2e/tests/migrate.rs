//! `scale-agent migrate` against the real API server: for each Armory fixture
//! (`agent/tests/fixtures/armory/`), the command's output applies cleanly with a server-side
//! dry run (schemas, CEL rules and defaults of the installed CRDs), and the operator renders
//! the resources back into an agent config that does what the Armory config did.

use std::{
    path::{Path, PathBuf},
    time::Duration,
};

use scale_agent::migrate;
use scale_agent_crds::{AgentAccount, ScaleAgent, agent_config::AgentConfig};
use scale_agent_e2e::{ControlPlane, ControlPlaneOptions, crds, kubectl::Kubectl};
use serde_json::Value;

fn fixture(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../agent/tests/fixtures/armory")
        .join(name)
}

/// Runs the agent binary's `migrate` on `files`.
fn run_migrate(files: &[PathBuf], namespace: &str, hub: &str) -> anyhow::Result<String> {
    let output = std::process::Command::new(env!("CARGO_BIN_EXE_e2e-agent"))
        .arg("migrate")
        .args(files)
        .args(["--name", "armory", "--namespace", namespace])
        .args(["--hub-address", hub])
        .env_remove("SCALE_AGENT_MIGRATE_NAME")
        .env_remove("SCALE_AGENT_MIGRATE_NAMESPACE")
        .env_remove("SCALE_AGENT_MIGRATE_HUB_ADDRESS")
        .output()?;
    anyhow::ensure!(
        output.status.success(),
        "migrate {files:?} failed: {}",
        String::from_utf8_lossy(&output.stderr)
    );
    Ok(String::from_utf8(output.stdout)?)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn migrated_armory_configs_apply_and_render_back_to_the_same_agent_config()
-> anyhow::Result<()> {
    let control_plane = ControlPlane::shared_with(ControlPlaneOptions::default)?;
    let admin = control_plane.client().await?;
    crds::install(&admin, &crds::read_crds(&crds::manifests_dir())?).await?;
    let namespace = control_plane.namespace(&admin, "migrate").await?;
    let home = std::env::temp_dir().join(format!("scale-agent-e2e-migrate-{}", std::process::id()));
    let kubectl = Kubectl::new(control_plane.binaries().kubectl(), home.clone());
    let hub = "scale-agent-hub.spinnaker.example.com:9091";

    let cases: [(&str, Vec<PathBuf>, usize); 4] = [
        (
            "complete manifest",
            vec![fixture("complete-manifest.armory-agent.yml")],
            1,
        ),
        ("mTLS", vec![fixture("mtls.armory-agent.yml")], 0),
        (
            "permissions",
            vec![fixture("permissions.armory-agent.yml")],
            1,
        ),
        (
            "kubectl manifests",
            vec![fixture("kubectl/manifests.yaml")],
            2,
        ),
    ];
    for (case, files, account_count) in cases {
        let output = run_migrate(&files, &namespace, hub)?;

        let applied = kubectl
            .run(
                control_plane.kubeconfig_path(),
                &[
                    "apply".into(),
                    "--server-side".into(),
                    "--dry-run=server".into(),
                    "--field-manager=scale-agent-e2e".into(),
                    "-o".into(),
                    "name".into(),
                    "-f".into(),
                    "-".into(),
                ],
                Some(&output),
                Duration::from_secs(120),
            )
            .await?;
        assert!(
            applied.success(),
            "{case}: the dry run refused the output: {}\n{output}",
            applied.messages()
        );
        let created: Vec<&str> = applied.stdout.lines().collect();
        assert_eq!(
            created.len(),
            1 + account_count,
            "{case}: {created:?}\n{output}"
        );
        assert!(
            created[0].starts_with("scaleagent.scaleagent.dev/armory"),
            "{case}: {created:?}"
        );

        // Render back: the operator's config for these resources against the Armory config.
        let documents: Vec<Value> = serde_saphyr::from_multiple(&output)?;
        let mut scale_agent: Option<ScaleAgent> = None;
        let mut accounts: Vec<AgentAccount> = Vec::new();
        for document in documents {
            match document["kind"].as_str() {
                Some("ScaleAgent") => scale_agent = Some(serde_json::from_value(document)?),
                Some("AgentAccount") => accounts.push(serde_json::from_value(document)?),
                other => anyhow::bail!("{case}: unexpected document {other:?}"),
            }
        }
        let scale_agent = scale_agent.ok_or_else(|| anyhow::anyhow!("{case}: no ScaleAgent"))?;
        assert_eq!(accounts.len(), account_count, "{case}");
        let refs: Vec<&AgentAccount> = accounts.iter().collect();
        let rendered = scale_agent_operator::desired::agent_config(&scale_agent, &refs);

        let input = migrate::read_input(&files)?;
        let (mut armory, _) = AgentConfig::from_value_reporting_unknown(input.config)?;
        // The one deliberate change: the hub's address instead of Clouddriver's.
        armory.clouddriver.grpc = hub.into();
        let differences = migrate::differences(&armory, &rendered);
        assert!(differences.is_empty(), "{case}: {differences:#?}\n{output}");
        // What the agent reads from the rendered config parses as its own config.
        AgentConfig::from_yaml(&rendered.to_yaml()?)?;
    }
    let _ = std::fs::remove_dir_all(&home);
    Ok(())
}
