//! Helm installs, upgrades, rolls back and uninstalls through the proxy.

use super::*;

/// A small chart: a Deployment and a Service whose image tag is a value.
fn write_chart(dir: &Path) -> anyhow::Result<PathBuf> {
    let chart = dir.join("web-chart");
    std::fs::create_dir_all(chart.join("templates"))?;
    std::fs::write(
        chart.join("Chart.yaml"),
        "apiVersion: v2\nname: web\nversion: 0.1.0\n",
    )?;
    std::fs::write(chart.join("values.yaml"), "tag: \"1.0\"\nreplicas: 2\n")?;
    std::fs::write(
        chart.join("templates/deployment.yaml"),
        "apiVersion: apps/v1\nkind: Deployment\nmetadata:\n  name: {{ .Release.Name }}-web\n\
         spec:\n  replicas: {{ .Values.replicas }}\n  selector:\n    matchLabels: {app: {{ .Release.Name }}}\n\
         \x20 template:\n    metadata:\n      labels: {app: {{ .Release.Name }}}\n    spec:\n\
         \x20     containers:\n      - name: web\n        image: registry.example/web:{{ .Values.tag }}\n",
    )?;
    std::fs::write(
        chart.join("templates/service.yaml"),
        "apiVersion: v1\nkind: Service\nmetadata:\n  name: {{ .Release.Name }}-web\nspec:\n\
         \x20 selector: {app: {{ .Release.Name }}}\n  ports:\n  - port: 80\n",
    )?;
    Ok(chart)
}

async fn helm(dir: &Path, kubeconfig: &Path, list: &[&str]) -> anyhow::Result<Outcome> {
    let binary = control_plane()?.binaries().helm();
    let output = tokio::process::Command::new(binary)
        .args(list)
        .arg(format!("--kubeconfig={}", kubeconfig.display()))
        .env("HELM_CACHE_HOME", dir.join("helm-cache"))
        .env("HELM_CONFIG_HOME", dir.join("helm-config"))
        .env("HELM_DATA_HOME", dir.join("helm-data"))
        .env("HOME", dir)
        .kill_on_drop(true)
        .output();
    let output = tokio::time::timeout(Duration::from_secs(180), output).await??;
    Ok(Outcome {
        code: output.status.code(),
        stdout: String::from_utf8_lossy(&output.stdout).into_owned(),
        stderr: String::from_utf8_lossy(&output.stderr).into_owned(),
    })
}

#[tokio::test]
async fn helm_installs_upgrades_rolls_back_and_uninstalls_through_the_proxy() -> anyhow::Result<()>
{
    let account = account_name("helm");
    let plain = account_name("nohelm");
    let setup = Setup::new("helm", &[&account, &plain]).await?;
    let kubeconfig = setup.kubeconfig(&account, "helm").await?;
    let namespace = control_plane()?.namespace(&setup.admin, "helm").await?;
    let chart = write_chart(&setup.dir)?;
    let chart = chart.display().to_string();
    let ns = format!("--namespace={namespace}");

    // Without allowSecretData on its account, Helm cannot read or write its release
    // Secrets through the proxy, and says why.
    let refused = helm(
        &setup.dir,
        &setup.kubeconfig(&plain, "helm").await?,
        &["install", "rel", &chart, &ns, "--wait", "--timeout=1m"],
    )
    .await?;
    anyhow::ensure!(
        !refused.success() && refused.stderr.contains("allowSecretData"),
        "helm install without the opt-in: {refused:?}"
    );
    ensure_ok(
        "helm install --wait",
        &helm(
            &setup.dir,
            &kubeconfig,
            &["install", "rel", &chart, &ns, "--wait", "--timeout=2m"],
        )
        .await?,
    )?;
    let deployments: Api<Deployment> = Api::namespaced(setup.admin.clone(), &namespace);
    let web = deployments.get("rel-web").await?;
    assert_eq!(
        web.status.and_then(|s| s.available_replicas),
        Some(2),
        "--wait returned before the Deployment was available"
    );
    ensure_ok(
        "helm upgrade --wait",
        &helm(
            &setup.dir,
            &kubeconfig,
            &[
                "upgrade",
                "rel",
                &chart,
                &ns,
                "--set",
                "tag=1.1",
                "--wait",
                "--timeout=2m",
            ],
        )
        .await?,
    )?;
    let image = |d: &Deployment| {
        d.spec
            .template
            .spec
            .as_ref()
            .map(|s| s.containers[0].image.clone().unwrap_or_default())
            .unwrap_or_default()
    };
    assert_eq!(
        image(&deployments.get("rel-web").await?),
        "registry.example/web:1.1"
    );
    ensure_ok(
        "helm rollback --wait",
        &helm(
            &setup.dir,
            &kubeconfig,
            &["rollback", "rel", "1", &ns, "--wait", "--timeout=2m"],
        )
        .await?,
    )?;
    assert_eq!(
        image(&deployments.get("rel-web").await?),
        "registry.example/web:1.0"
    );
    // The release records are where Helm keeps them: Secrets of type helm.sh/release.v1 in
    // the release's namespace, one per revision.
    let secrets: Api<Secret> = Api::namespaced(setup.admin.clone(), &namespace);
    let releases = secrets
        .list(&ListParams::default().labels("owner=helm,name=rel"))
        .await?;
    let mut names: Vec<String> = releases
        .items
        .iter()
        .map(|s| s.metadata.name.clone().unwrap_or_default())
        .collect();
    names.sort();
    assert_eq!(
        names,
        [
            "sh.helm.release.v1.rel.v1",
            "sh.helm.release.v1.rel.v2",
            "sh.helm.release.v1.rel.v3"
        ]
    );
    assert!(
        releases
            .items
            .iter()
            .all(|s| s.type_.as_deref() == Some("helm.sh/release.v1"))
    );
    let history = helm(&setup.dir, &kubeconfig, &["history", "rel", &ns]).await?;
    ensure_ok("helm history", &history)?;
    assert!(
        history.stdout.contains("Rollback to 1"),
        "{}",
        history.stdout
    );
    ensure_ok(
        "helm uninstall --wait",
        &helm(
            &setup.dir,
            &kubeconfig,
            &["uninstall", "rel", &ns, "--wait"],
        )
        .await?,
    )?;
    assert!(deployments.get_opt("rel-web").await?.is_none());
    let left = secrets
        .list(&ListParams::default().labels("owner=helm,name=rel"))
        .await?;
    assert!(
        left.items.is_empty(),
        "release records left after uninstall"
    );
    setup.stop().await
}
