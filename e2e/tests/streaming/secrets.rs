//! Secrets stream as metadata only: their data never reaches the hub, nor the agent's memory
//! (a core dump of the live agent).

use super::*;

/// Test 2: a Secret's data never reaches the hub (HTTP API, redb file) nor the agent's
/// memory (core dump of the live process), while a ConfigMap's data, the control, is found
/// in all three. Secrets made by client-side `kubectl apply` carry their whole data in the
/// last-applied annotation, which is metadata the agent does watch: some are applied before
/// the agent starts (they reach it in its LIST), others are created, updated and deleted
/// while it watches; none of their markers may be found, raw or base64.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn secret_data_never_reaches_the_hub_nor_the_agent_memory() -> anyhow::Result<()> {
    let (control_plane, admin, ns) = cluster("secret").await?;
    let mut s = setup("secret", &[]).await?;
    let kubeconfig = agent_identity(
        control_plane,
        &admin,
        &ns,
        Scope::Cluster,
        &["configmaps", "secrets"],
        s.dir.path(),
    )
    .await?;
    let secret_marker = format!("secret-marker-{:032x}", rand::random::<u128>());
    let control_marker = format!("control-marker-{:032x}", rand::random::<u128>());
    // Created through the API (no last-applied annotation carrying the data).
    Api::<Secret>::namespaced(admin.clone(), &ns)
        .create(
            &PostParams::default(),
            &serde_json::from_value(json!({
                "metadata": { "name": "credentials", "labels": { "kept": "yes" } },
                "stringData": { "password": secret_marker },
            }))?,
        )
        .await?;
    create_configmap(&admin, &ns, "control", json!({ "value": control_marker })).await?;
    let marker = |what: &str| format!("{what}-marker-{:032x}", rand::random::<u128>());
    let listed = marker("listed");
    let listed_updated = marker("listed-updated");
    let deleted = marker("deleted");
    let watched = marker("watched");
    let watched_updated = marker("watched-updated");
    let kubectl = Kubectl::new(
        control_plane.binaries().kubectl(),
        s.dir.path().join("kubectl-home"),
    );
    let apply = |name: &'static str, marker: String, version: &'static str, in_data: bool| {
        kubectl_apply_secret(
            &kubectl,
            control_plane.kubeconfig_path(),
            &ns,
            name,
            marker,
            version,
            in_data,
        )
    };
    // Before the agent starts: these reach it in its LIST.
    apply("applied-listed", listed.clone(), "1", true).await?;
    apply("applied-deleted", deleted.clone(), "1", false).await?;
    // The premise: kubectl copied the data into the annotation (base64 from `data`, clear
    // from `stringData`).
    let secrets = Api::<Secret>::namespaced(admin.clone(), &ns);
    for (name, needle) in [
        ("applied-listed", fixtures::base64(listed.as_bytes())),
        ("applied-deleted", deleted.clone()),
    ] {
        let applied = secrets.get(name).await?;
        let annotation = applied
            .metadata
            .annotations
            .unwrap_or_default()
            .remove(LAST_APPLIED)
            .unwrap_or_default();
        assert!(
            annotation.contains(&needle),
            "{name}: kubectl apply put the data in {LAST_APPLIED}: {annotation}"
        );
    }
    let account = unique("secret");
    let config = s.dir.path().join("agent.yaml");
    write_agent_config(
        &config,
        &s.hub,
        json!([fixtures::account(
            &account,
            &kubeconfig,
            &ns,
            &["configmaps", "secrets"]
        )]),
    )?;
    let agent = Agent::start(s.dir.path(), &config, "secret-0", &s.tls).await?;
    let hub = &s.hub;
    let (acc, ns_) = (account.as_str(), ns.as_str());
    eventually("the Secrets and the ConfigMap in the hub", || async move {
        for name in ["credentials", "applied-listed", "applied-deleted"] {
            if hub.object(acc, "secrets", ns_, name).await?.is_none() {
                return Ok(false);
            }
        }
        Ok(hub
            .object(acc, "configmaps", ns_, "control")
            .await?
            .is_some())
    })
    .await?;

    // While the agent watches: a Secret created then updated, one listed before updated,
    // one deleted (its DELETE event carries its last state, annotation included).
    apply("applied-watched", watched.clone(), "1", false).await?;
    apply("applied-watched", watched_updated.clone(), "2", false).await?;
    apply("applied-listed", listed_updated.clone(), "2", true).await?;
    let deleted_by_kubectl = kubectl
        .run(
            control_plane.kubeconfig_path(),
            &[
                "delete".into(),
                "secret".into(),
                "applied-deleted".into(),
                format!("--namespace={ns}"),
            ],
            None,
            WAIT,
        )
        .await?;
    assert!(
        deleted_by_kubectl.success(),
        "kubectl delete: {}",
        deleted_by_kubectl.messages()
    );
    eventually("the watched changes in the hub", || async move {
        let version =
            |object: Option<Value>| object.map(|o| o["metadata"]["labels"]["version"].clone());
        Ok(
            version(hub.object(acc, "secrets", ns_, "applied-watched").await?) == Some(json!("2"))
                && version(hub.object(acc, "secrets", ns_, "applied-listed").await?)
                    == Some(json!("2"))
                && hub
                    .object(acc, "secrets", ns_, "applied-deleted")
                    .await?
                    .is_none(),
        )
    })
    .await?;
    // Every Secret value, raw and base64, with a name for the failure message.
    let mut needles = Vec::new();
    for (what, value) in [
        ("created through the API", &secret_marker),
        ("applied before the agent", &listed),
        (
            "applied before the agent, updated while watched",
            &listed_updated,
        ),
        ("applied before the agent, deleted while watched", &deleted),
        ("applied while watched", &watched),
        ("applied while watched, updated", &watched_updated),
    ] {
        needles.push((format!("{what} (raw)"), value.clone()));
        needles.push((
            format!("{what} (base64)"),
            fixtures::base64(value.as_bytes()),
        ));
    }

    // The hub's API: the Secret's metadata is there, its data is not.
    let secret = hub
        .object(acc, "secrets", ns_, "credentials")
        .await?
        .unwrap_or_default();
    assert_eq!(secret["metadata"]["labels"]["kept"], "yes", "{secret}");
    assert!(
        secret.get("data").is_none() && secret.get("stringData").is_none(),
        "{secret}"
    );
    let applied = hub
        .object(acc, "secrets", ns_, "applied-watched")
        .await?
        .unwrap_or_default();
    assert!(
        applied["metadata"]["annotations"]
            .get(LAST_APPLIED)
            .is_none(),
        "{applied}"
    );
    for path in [
        format!("/api/v1/accounts/{acc}/objects?kind=secrets"),
        format!("/api/v1/accounts/{acc}/objects?kind=configmaps"),
        format!("/api/v1/accounts/{acc}"),
        "/api/v1/accounts".to_string(),
        "/metrics".to_string(),
    ] {
        let (status, body) = hub_get(hub.http, &path).await?;
        assert_eq!(status, 200, "{path}: {body}");
        for (what, needle) in &needles {
            assert!(
                !body.contains(needle),
                "{path} holds a Secret's data: {what}"
            );
        }
    }
    let (_, configmaps) = hub_get(
        hub.http,
        &format!("/api/v1/accounts/{acc}/objects?kind=configmaps"),
    )
    .await?;
    assert!(
        configmaps.contains(&control_marker),
        "control: the ConfigMap's data is served"
    );

    // The agent's memory: dump the live process and search the core file.
    let core_prefix = s.dir.path().join("agent-core");
    let pid = agent.pid()?;
    let output = tokio::process::Command::new("gcore")
        .arg("-o")
        .arg(&core_prefix)
        .arg(pid.to_string())
        .output()
        .await?;
    let core = core_prefix.with_extension(pid.to_string());
    anyhow::ensure!(
        output.status.success() && core.is_file(),
        "gcore failed: {}",
        String::from_utf8_lossy(&output.stderr)
    );
    let core_size = std::fs::metadata(&core)?.len();
    let found_control = file_contains(&core, &control_marker)?;
    let found_secrets = found_in(&core, &needles)?;
    std::fs::remove_file(&core)?;
    eprintln!(
        "[streaming] core dump of the agent: {} MiB",
        core_size >> 20
    );
    assert!(
        found_control,
        "control: the ConfigMap's data is in the agent's memory"
    );
    assert!(
        found_secrets.is_empty(),
        "Secret data in the agent's memory: {found_secrets:?}"
    );
    assert!(process::is_alive(pid), "gcore must leave the agent running");
    assert!(
        agent.ready().await?,
        "the agent still serves after the dump"
    );

    // The hub's store: stop the hub (it flushes), then read the file's bytes.
    s.hub.stop();
    let store = s.hub.data_dir.join("hub.redb");
    let store_size = std::fs::metadata(&store)?.len();
    assert!(
        store_size > 16 * 1024,
        "the store is almost empty: {store_size} bytes"
    );
    // The file as it is, and the objects in it unpacked (they are kept compressed).
    let unpacked = s.hub.data_dir.join("store-objects-unpacked.json");
    let objects = unpack_store_objects(&s.hub.data_dir, &unpacked).await?;
    assert!(objects > 0, "the store holds no objects");
    assert!(
        file_contains(&unpacked, "credentials")?,
        "control: the Secret's metadata is stored"
    );
    assert!(
        file_contains(&unpacked, &control_marker)?,
        "control: the ConfigMap's data is stored"
    );
    for file in [&store, &unpacked] {
        let in_store = found_in(file, &needles)?;
        assert!(
            in_store.is_empty(),
            "Secret data in the hub's store ({}): {in_store:?}",
            file.display()
        );
    }
    // Nor do their logs.
    drop(agent);
    let mut logs = 0;
    for entry in std::fs::read_dir(s.dir.path())? {
        let path = entry?.path();
        if path.extension().is_some_and(|e| e == "log") {
            logs += 1;
            let in_log = found_in(&path, &needles)?;
            assert!(in_log.is_empty(), "{}: {in_log:?}", path.display());
        }
    }
    assert_eq!(logs, 2, "the hub's and the agent's logs");
    Ok(())
}
