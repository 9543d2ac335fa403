//! Snapshot then deltas, Secrets whose data never leaves, resume points without a LIST, and
//! 410 Gone falling back to a snapshot.

use super::*;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn snapshot_then_deltas_and_secret_data_never_leaves() -> anyhow::Result<()> {
    let s = setup("deltas", &["configmaps", "secrets"]).await?;
    let Setup {
        admin,
        namespace,
        dir,
        ..
    } = &s;
    let configmaps = Api::<ConfigMap>::namespaced(admin.clone(), namespace);
    create(
        &configmaps,
        json!({ "metadata": { "name": "before" }, "data": { "colour": "blue" } }),
    )
    .await?;
    let marker = format!("marker-{:016x}", rand::random::<u64>());
    let secret_data = json!({ "password": marker });
    let last_applied =
        json!({ "apiVersion": "v1", "kind": "Secret", "stringData": secret_data }).to_string();
    create(
        &Api::<Secret>::namespaced(admin.clone(), namespace),
        json!({
            "metadata": {
                "name": "db",
                // Every annotation known to carry an applied manifest, each holding the
                // data (review F16): none may reach the hub.
                "annotations": {
                    "kubectl.kubernetes.io/last-applied-configuration": last_applied,
                    "kapp.k14s.io/original": last_applied,
                    "kapp.k14s.io/original-diff": last_applied,
                    "objectset.rio.cattle.io/applied": last_applied,
                },
            },
            "stringData": secret_data,
        }),
    )
    .await?;

    let hub = Arc::new(HubState::default());
    let hub_addr = start_hub(hub.clone()).await?;
    let account = account_name("deltas");
    let config = s.write_config(hub_addr, &account, &["ConfigMap", "secrets"])?;
    let agent = start_agent(&config).await?;

    eventually("the ConfigMap snapshot", || {
        hub.snapshot_ends(&account, "configmaps") >= 1
            && hub.has_object(
                &account,
                "configmaps",
                "before",
                object_event::Type::Applied,
            )
    })
    .await?;
    eventually("the Secret's metadata", || {
        hub.has_object(&account, "secrets", "db", object_event::Type::Applied)
    })
    .await?;
    let before = hub
        .objects(&account, "configmaps")
        .into_iter()
        .find(|o| o.name == "before")
        .ok_or_else(|| anyhow::anyhow!("no event for 'before'"))?;
    let body: serde_json::Value = serde_json::from_slice(&before.object_json)?;
    assert_eq!(body["data"]["colour"], "blue");
    assert_eq!(body["kind"], "ConfigMap");
    assert!(
        body["metadata"]["managedFields"]
            .as_array()
            .is_some_and(|m| !m.is_empty()),
        "{body}"
    );
    assert_eq!(&before.watch_namespace, namespace);
    assert!(!before.uid.is_empty() && !before.resource_version.is_empty());

    // Deltas: create, update, delete.
    create(&configmaps, json!({ "metadata": { "name": "after" } })).await?;
    configmaps
        .patch(
            "before",
            &PatchParams::default(),
            &Patch::Merge(json!({ "data": { "colour": "green" } })),
        )
        .await?;
    configmaps.delete("after", &DeleteParams::default()).await?;
    eventually("create, update and delete deltas", || {
        let objects = hub.objects(&account, "configmaps");
        let updated = objects.iter().any(|o| {
            o.name == "before"
                && serde_json::from_slice::<serde_json::Value>(&o.object_json)
                    .is_ok_and(|v| v["data"]["colour"] == "green")
        });
        updated
            && hub.has_object(&account, "configmaps", "after", object_event::Type::Applied)
            && hub.has_object(&account, "configmaps", "after", object_event::Type::Deleted)
    })
    .await?;
    // One snapshot only: deltas are not relists.
    assert_eq!(hub.snapshot_ends(&account, "configmaps"), 1);
    assert_eq!(agent.metrics().lists_total(&account, "configmaps"), 1);

    // The Secret's data, in any form, is in nothing the agent sent.
    let secret_event = hub
        .objects(&account, "secrets")
        .into_iter()
        .find(|o| o.name == "db")
        .ok_or_else(|| anyhow::anyhow!("no event for the Secret"))?;
    let secret_body: serde_json::Value = serde_json::from_slice(&secret_event.object_json)?;
    assert_eq!(secret_body["kind"], "Secret");
    assert!(secret_body.get("data").is_none(), "{secret_body}");
    let annotations = secret_body["metadata"]["annotations"].to_string();
    for manifest in ["last-applied-configuration", "kapp.k14s.io", "cattle.io"] {
        assert!(!annotations.contains(manifest), "{annotations}");
    }
    // Every message as text: payloads decoded, everything else by its Debug form.
    let sent_text: String = hub
        .messages()
        .iter()
        .map(|m| match &m.kind {
            Some(agent_message::Kind::Object(o)) => {
                format!("{o:?} {}", String::from_utf8_lossy(&o.object_json))
            }
            Some(agent_message::Kind::RegisterAccount(r)) => {
                format!("{r:?} {}", String::from_utf8_lossy(&r.properties_json))
            }
            other => format!("{other:?}"),
        })
        .collect();
    use scale_agent_e2e::fixtures::base64 as b64;
    for needle in [marker.clone(), b64(marker.as_bytes())] {
        assert!(
            !sent_text.contains(&needle),
            "the Secret's data ({needle}) reached the hub"
        );
    }
    assert!(!sent_text.contains(
        "last-applied-configuration\":\"{\\\"apiVersion\\\":\\\"v1\\\",\\\"kind\\\":\\\"Secret"
    ));

    // Admin port: ready, metrics and the accounts view.
    eventually("readiness", || agent.view().synced()).await?;
    let ready = http_get(agent.admin_addr(), "/readyz").await?;
    assert_eq!(ready.status, 200, "{ready:?}");
    let metrics = http_get(agent.admin_addr(), "/metrics").await?.body;
    assert!(
        metrics.contains(&format!(
            "scale_agent_agent_lists_total{{account=\"{account}\",kind=\"configmaps\"}} 1"
        )),
        "{metrics}"
    );
    assert!(
        metrics.contains("scale_agent_agent_bytes_sent_total"),
        "{metrics}"
    );
    let accounts = http_get(agent.admin_addr(), "/accounts").await?.body;
    let view: serde_json::Value = serde_json::from_str(&accounts)?;
    let view_account = &view["accounts"][0];
    assert_eq!(view_account["name"], account);
    assert_eq!(view_account["role"], "streaming");
    let kinds = view_account["kinds"]
        .as_array()
        .cloned()
        .unwrap_or_default();
    assert!(
        kinds.iter().any(|k| k["plural"] == "configmaps"
            && k["state"] == "watching"
            && k["watchNamespace"] == namespace.as_str()
            && k["objectsSent"].as_u64() >= Some(4)),
        "{view}"
    );

    agent.stop().await?;
    let _ = std::fs::remove_dir_all(dir);
    Ok(())
}

/// Base64 as the apiserver stores Secret data, without a dependency for it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn resume_point_means_no_list_and_changes_still_arrive() -> anyhow::Result<()> {
    let s = setup("resume", &["configmaps"]).await?;
    let Setup {
        admin,
        namespace,
        dir,
        ..
    } = &s;
    let configmaps = Api::<ConfigMap>::namespaced(admin.clone(), namespace);
    create(&configmaps, json!({ "metadata": { "name": "old" } })).await?;
    let list = configmaps.list(&ListParams::default()).await?;
    let resume_from = list.metadata.resource_version.unwrap_or_default();
    assert!(!resume_from.is_empty());

    let hub = Arc::new(HubState::default());
    if let Ok(mut points) = hub.resume_points.lock() {
        points.push(resume_point(
            "ConfigMap",
            "configmaps",
            &resume_from,
            namespace,
        ));
        // A watch the account no longer has (its kinds changed): the agent says STOPPED.
        points.push(resume_point("Secret", "secrets", &resume_from, namespace));
    }
    let hub_addr = start_hub(hub.clone()).await?;
    let account = account_name("resume");
    let config = s.write_config(hub_addr, &account, &["configmaps"])?;
    let agent = start_agent(&config).await?;
    eventually("the resumed watch", || {
        hub.kind_status(&account, "configmaps", kind_status::State::Watching)
            .is_some()
    })
    .await?;
    create(&configmaps, json!({ "metadata": { "name": "new" } })).await?;
    eventually("the change made after the resume point", || {
        hub.has_object(&account, "configmaps", "new", object_event::Type::Applied)
    })
    .await?;
    assert_eq!(
        agent.metrics().lists_total(&account, "configmaps"),
        0,
        "resumed kinds must not LIST"
    );
    assert_eq!(
        agent.metrics().watch_resumes_total(&account, "configmaps"),
        1
    );
    assert_eq!(hub.snapshot_begins(&account, "configmaps"), 0);
    assert!(
        hub.kind_status(&account, "secrets", kind_status::State::Stopped)
            .is_some(),
        "a resume point for a kind no longer watched gets STOPPED"
    );
    assert_eq!(agent.metrics().lists_total(&account, "secrets"), 0);
    assert!(
        !hub.has_object(&account, "configmaps", "old", object_event::Type::Applied),
        "'old' predates the resume point and must not be resent"
    );
    agent.stop().await?;
    let _ = std::fs::remove_dir_all(dir);
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn compacted_resume_point_gets_410_and_falls_back_to_a_snapshot() -> anyhow::Result<()> {
    let s = setup("gone", &["podtemplates"]).await?;
    let Setup {
        control_plane,
        admin,
        namespace,
        dir,
        ..
    } = &s;
    let templates = Api::<PodTemplate>::namespaced(admin.clone(), namespace);
    let created = create(
        &templates,
        json!({
            "metadata": { "name": "web" },
            "template": { "spec": { "containers": [{ "name": "web", "image": "nginx" }] } },
        }),
    )
    .await?;
    let old_version = created.metadata.resource_version.unwrap_or_default();
    for revision in 0..3 {
        templates
            .patch(
                "web",
                &PatchParams::default(),
                &Patch::Merge(
                    json!({ "metadata": { "labels": { "revision": revision.to_string() } } }),
                ),
            )
            .await?;
    }
    control_plane.compact_etcd().await?;

    let hub = Arc::new(HubState::default());
    if let Ok(mut points) = hub.resume_points.lock() {
        points.push(resume_point(
            "PodTemplate",
            "podtemplates",
            &old_version,
            namespace,
        ));
    }
    let hub_addr = start_hub(hub.clone()).await?;
    let account = account_name("gone");
    let config = s.write_config(hub_addr, &account, &["PodTemplate"])?;
    let agent = start_agent(&config).await?;
    eventually("a snapshot after 410 Gone", || {
        hub.snapshot_ends(&account, "podtemplates") >= 1
    })
    .await?;
    assert!(hub.has_object(&account, "podtemplates", "web", object_event::Type::Applied));
    assert_eq!(
        agent
            .metrics()
            .watch_resumes_total(&account, "podtemplates"),
        1
    );
    assert!(agent.metrics().watch_gone_total(&account, "podtemplates") >= 1);
    assert_eq!(agent.metrics().lists_total(&account, "podtemplates"), 1);
    let web = hub
        .objects(&account, "podtemplates")
        .into_iter()
        .rfind(|o| o.name == "web")
        .ok_or_else(|| anyhow::anyhow!("no event for 'web'"))?;
    let body: serde_json::Value = serde_json::from_slice(&web.object_json)?;
    assert_eq!(body["metadata"]["labels"]["revision"], "2");
    agent.stop().await?;
    let _ = std::fs::remove_dir_all(dir);
    Ok(())
}

/// Secrets have a WATCH of their own (decoded without the last-applied annotation): it
/// resumes from the hub's resume point without a LIST, and after an event that carried
/// Secret data (the watch then closes its connection and re-opens from that event) later
/// changes still arrive, still without a LIST, and nothing sent holds the data.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn secrets_resume_and_reopen_after_data_without_listing() -> anyhow::Result<()> {
    let s = setup("secret-watch", &["secrets"]).await?;
    let Setup {
        admin,
        namespace,
        dir,
        ..
    } = &s;
    let secrets = Api::<Secret>::namespaced(admin.clone(), namespace);
    create(
        &secrets,
        json!({ "metadata": { "name": "web" }, "stringData": { "password": "first" } }),
    )
    .await?;
    let resume_from = secrets
        .list_metadata(&ListParams::default())
        .await?
        .metadata
        .resource_version
        .unwrap_or_default();

    let hub = Arc::new(HubState::default());
    if let Ok(mut points) = hub.resume_points.lock() {
        points.push(resume_point("Secret", "secrets", &resume_from, namespace));
    }
    let hub_addr = start_hub(hub.clone()).await?;
    let account = account_name("secret-watch");
    let config = s.write_config(hub_addr, &account, &["secrets"])?;
    let agent = start_agent(&config).await?;
    eventually("the resumed watch", || {
        hub.kind_status(&account, "secrets", kind_status::State::Watching)
            .is_some()
    })
    .await?;
    let labels_of = |name: &str| {
        hub.objects(&account, "secrets")
            .into_iter()
            .rfind(|o| o.name == name)
            .and_then(|o| serde_json::from_slice::<serde_json::Value>(&o.object_json).ok())
            .map(|body| body["metadata"]["labels"].clone())
    };

    // What client-side `kubectl apply` writes: the data, in clear, in the annotation.
    let marker = format!("applied-marker-{:032x}", rand::random::<u128>());
    let label = |key: &str| Patch::Merge(json!({ "metadata": { "labels": { key: "yes" } } }));
    secrets
        .patch(
            "web",
            &PatchParams::default(),
            &Patch::Merge(json!({ "metadata": {
                "labels": { "applied": "yes" },
                "annotations": { LAST_APPLIED: json!({ "stringData": { "password": marker } }).to_string() },
            } })),
        )
        .await?;
    eventually("the applied Secret", || {
        labels_of("web").is_some_and(|l| l["applied"] == "yes")
    })
    .await?;
    // The watch re-opened from that event: later changes arrive.
    secrets
        .patch("web", &PatchParams::default(), &label("after"))
        .await?;
    create(&secrets, json!({ "metadata": { "name": "later" } })).await?;
    eventually("the changes after the applied Secret", || {
        labels_of("web").is_some_and(|l| l["after"] == "yes")
            && hub.has_object(&account, "secrets", "later", object_event::Type::Applied)
    })
    .await?;
    let metrics = agent.metrics();
    assert_eq!(metrics.watch_resumes_total(&account, "secrets"), 1);
    assert_eq!(metrics.lists_total(&account, "secrets"), 0, "no LIST");
    assert_eq!(hub.snapshot_begins(&account, "secrets"), 0);
    assert!(
        !hub.has_object(&account, "secrets", "web", object_event::Type::Deleted),
        "re-opening must not make objects look deleted"
    );
    let events = hub.objects(&account, "secrets");
    assert!(events.len() >= 3, "{events:?}");
    for event in events {
        let body = String::from_utf8_lossy(&event.object_json);
        assert!(!body.contains(&marker), "{body}");
        assert!(!body.contains(LAST_APPLIED), "{body}");
    }
    agent.stop().await?;
    let _ = std::fs::remove_dir_all(dir);
    Ok(())
}
