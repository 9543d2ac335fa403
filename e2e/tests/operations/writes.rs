//! Writes: server-side and client-side apply, create, replace, patches, get and list, each
//! write visible in the hub right after it returns.

use super::*;

/// Server-side apply (idempotent, changes, several documents, invalid manifests, unknown
/// kinds, same-name kinds across groups), client-side apply, create, replace, patch of
/// every type, get and list; every write visible in the hub right after it returns.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn apply_create_replace_patch_get_list_and_read_your_writes() -> anyhow::Result<()> {
    let s = Setup::new("apply", 1).await?;
    let (hub, account, ns) = (s.hub(), s.account.clone(), s.namespace.clone());

    // Apply twice: the second is a no-op with the same resourceVersion.
    let first = expect(hub, &account, 200, json!({"type": "apply", "manifest": configmap(&ns, "app", json!({"a": "1"})), "fieldManager": "spinnaker"})).await?;
    assert_eq!(first["state"], "succeeded");
    assert_eq!(first["executed"], true);
    let rv1 = rv(&first["objects"][0]);
    let again = expect(hub, &account, 200, json!({"type": "apply", "manifest": configmap(&ns, "app", json!({"a": "1"})), "fieldManager": "spinnaker"})).await?;
    assert_eq!(
        rv(&again["objects"][0]),
        rv1,
        "applying the same manifest changes nothing"
    );
    let live = s.configmaps().get("app").await?;
    assert_eq!(
        live.metadata.resource_version.as_deref(),
        Some(rv1.as_str())
    );
    let managers: Vec<String> = live
        .metadata
        .managed_fields
        .clone()
        .unwrap_or_default()
        .into_iter()
        .filter_map(|m| m.manager)
        .collect();
    assert!(managers.contains(&"spinnaker".to_string()), "{managers:?}");
    // The result carries the object as the API server answered it, field owners included.
    assert_eq!(
        first["objects"][0]["metadata"]["managedFields"],
        serde_json::to_value(live.metadata.managed_fields.unwrap_or_default())?
    );

    // A change: the hub's cache shows it at once (read-your-writes).
    let changed = expect(hub, &account, 200, json!({"type": "apply", "manifest": configmap(&ns, "app", json!({"a": "2"})), "fieldManager": "spinnaker"})).await?;
    let rv2 = rv(&changed["objects"][0]);
    assert_ne!(rv2, rv1);
    let seen = cached(hub, &account, &ns, "configmaps", "app")
        .await?
        .ok_or_else(|| anyhow::anyhow!("not cached"))?;
    assert_eq!(
        rv(&seen),
        rv2,
        "the hub cache reflects the write immediately"
    );
    assert_eq!(seen["data"]["a"], "2");
    assert_eq!(
        s.configmaps().get("app").await?.data.unwrap_or_default()["a"],
        "2"
    );

    // The result is kept for lookups.
    let id = changed["id"].as_str().unwrap_or_default().to_string();
    let (code, looked) = http(hub, "GET", &format!("/api/v1/operations/{id}"), None).await?;
    assert_eq!(code, 200);
    assert_eq!(looked["state"], "succeeded");
    let (code, _) = http(hub, "GET", "/api/v1/operations/nope", None).await?;
    assert_eq!(code, 404);

    // Several documents in one apply, namespace defaulted.
    let both = expect(hub, &account, 200, json!({"type": "apply", "namespace": ns, "manifests": [
        {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "one"}, "data": {"x": "1"}},
        {"apiVersion": "v1", "kind": "List", "items": [deployment(&ns, "web", "nginx:1", 1)]},
    ]})).await?;
    assert_eq!(both["objects"].as_array().map(Vec::len), Some(2));
    s.configmaps().get("one").await?;
    s.deployments().get("web").await?;

    // An invalid manifest: 422 with the API server's causes; nothing created.
    let mut invalid = deployment(&ns, "broken", "nginx:1", 1);
    invalid["spec"]["template"]["metadata"]["labels"] = json!({"app": "other"});
    let bad = expect(
        hub,
        &account,
        422,
        json!({"type": "apply", "manifest": invalid}),
    )
    .await?;
    assert_eq!(bad["state"], "failed");
    assert_eq!(bad["status"]["reason"], "Invalid");
    let causes = bad["status"]["causes"]
        .as_array()
        .cloned()
        .unwrap_or_default();
    assert!(
        causes.iter().any(|c| c["field"]
            .as_str()
            .is_some_and(|f| f.contains("selector") || f.contains("labels"))),
        "{bad:#}"
    );
    assert!(s.deployments().get_opt("broken").await?.is_none());

    // Unknown kind: 404, as kubectl says it.
    let unknown = expect(hub, &account, 404, json!({"type": "apply", "manifest": {"apiVersion": "nope.example/v1", "kind": "Gadget", "metadata": {"name": "g", "namespace": ns}}})).await?;
    assert!(
        unknown["status"]["message"]
            .as_str()
            .unwrap_or_default()
            .contains("doesn't have a resource type"),
        "{unknown:#}"
    );
    assert_eq!(unknown["executed"], true);

    // Same-name kinds across groups: a custom resource "ConfigMap" in example.com.
    let crds = Api::<CustomResourceDefinition>::all(s.admin.clone());
    let crd_name = "configmaps.example.com";
    if crds.get_opt(crd_name).await?.is_none() {
        let crd: CustomResourceDefinition = serde_json::from_value(json!({
            "metadata": {"name": crd_name},
            "spec": {"group": "example.com", "scope": "Namespaced",
                "names": {"plural": "configmaps", "singular": "configmap", "kind": "ConfigMap", "listKind": "ConfigMapList"},
                "versions": [{"name": "v1", "served": true, "storage": true,
                    "schema": {"openAPIV3Schema": {"type": "object", "x-kubernetes-preserve-unknown-fields": true}}}]}
        }))?;
        match crds.create(&PostParams::default(), &crd).await {
            Ok(_) => {}
            Err(kube::Error::Api(e)) if e.code == 409 => {}
            Err(e) => return Err(e.into()),
        }
    }
    let custom_api: Api<DynamicObject> = Api::namespaced_with(
        s.admin.clone(),
        &ns,
        &ApiResource {
            group: "example.com".into(),
            version: "v1".into(),
            api_version: "example.com/v1".into(),
            kind: "ConfigMap".into(),
            plural: "configmaps".into(),
        },
    );
    until("the custom ConfigMap kind to be served", || {
        let api = custom_api.clone();
        async move { Ok(api.list(&ListParams::default()).await.is_ok()) }
    })
    .await?;
    let custom = expect(hub, &account, 200, json!({"type": "apply", "manifest": {"apiVersion": "example.com/v1", "kind": "ConfigMap", "metadata": {"name": "twin", "namespace": ns}, "spec": {"custom": true}}})).await?;
    assert_eq!(custom["objects"][0]["apiVersion"], "example.com/v1");
    custom_api.get("twin").await?;
    assert!(
        s.configmaps().get_opt("twin").await?.is_none(),
        "the core ConfigMap is another kind"
    );
    let got = expect(
        hub,
        &account,
        200,
        json!({"type": "get", "kind": "configmaps.example.com", "namespace": ns, "name": "twin"}),
    )
    .await?;
    assert_eq!(got["objects"][0]["spec"]["custom"], true);

    // Client-side apply: kubectl's last-applied annotation, and removed keys go away.
    let csa = expect(hub, &account, 200, json!({"type": "apply", "serverSide": false, "manifest": configmap(&ns, "csa", json!({"k": "1", "gone": "x"}))})).await?;
    assert!(csa["objects"][0]["metadata"]["annotations"]["kubectl.kubernetes.io/last-applied-configuration"].is_string());
    expect(hub, &account, 200, json!({"type": "apply", "serverSide": false, "manifest": configmap(&ns, "csa", json!({"k": "2"}))})).await?;
    let data = s.configmaps().get("csa").await?.data.unwrap_or_default();
    assert_eq!(data.get("k").map(String::as_str), Some("2"));
    assert!(!data.contains_key("gone"), "{data:?}");

    // Create: 201, then 409 AlreadyExists.
    let created = expect(
        hub,
        &account,
        201,
        json!({"type": "create", "manifest": configmap(&ns, "fresh", json!({"v": "1"}))}),
    )
    .await?;
    assert_eq!(created["state"], "succeeded");
    let dup = expect(
        hub,
        &account,
        409,
        json!({"type": "create", "manifest": configmap(&ns, "fresh", json!({"v": "1"}))}),
    )
    .await?;
    assert_eq!(dup["status"]["reason"], "AlreadyExists");

    // Replace.
    expect(
        hub,
        &account,
        200,
        json!({"type": "replace", "manifest": configmap(&ns, "fresh", json!({"v": "2"}))}),
    )
    .await?;
    assert_eq!(
        s.configmaps().get("fresh").await?.data.unwrap_or_default()["v"],
        "2"
    );

    // Patches of every type.
    expect(hub, &account, 200, json!({"type": "patch", "kind": "configmap", "namespace": ns, "name": "fresh", "patchType": "merge", "patch": {"data": {"m": "1"}}})).await?;
    expect(hub, &account, 200, json!({"type": "patch", "kind": "cm", "namespace": ns, "name": "fresh", "patchType": "json", "patch": [{"op": "add", "path": "/data/j", "value": "1"}]})).await?;
    expect(hub, &account, 200, json!({"type": "patch", "kind": "ConfigMap", "namespace": ns, "name": "fresh", "patchType": "strategic", "patch": {"data": {"s": "1"}}})).await?;
    let applied = expect(hub, &account, 200, json!({"type": "patch", "kind": "ConfigMap", "namespace": ns, "name": "fresh", "patchType": "apply", "fieldManager": "other", "patch": {"apiVersion": "v1", "kind": "ConfigMap", "data": {"a": "1"}}})).await?;
    let data = s.configmaps().get("fresh").await?.data.unwrap_or_default();
    for k in ["v", "m", "j", "s", "a"] {
        assert!(data.contains_key(k), "{k} missing in {data:?}");
    }
    let seen = cached(hub, &account, &ns, "configmaps", "fresh")
        .await?
        .ok_or_else(|| anyhow::anyhow!("not cached"))?;
    assert_eq!(rv(&seen), rv(&applied["objects"][0]));
    // A json patch that does not apply: the API server's error passed through.
    let (code, failed) = op(hub, &account, json!({"type": "patch", "kind": "ConfigMap", "namespace": ns, "name": "fresh", "patchType": "json", "patch": [{"op": "test", "path": "/data/v", "value": "nope"}]})).await?;
    assert!((400..500).contains(&code), "{code} {failed:#}");

    // Get and list (label and field selectors); 404 for a missing object.
    let got = expect(
        hub,
        &account,
        200,
        json!({"type": "get", "kind": "ConfigMap", "namespace": ns, "name": "app"}),
    )
    .await?;
    assert_eq!(got["objects"][0]["data"]["a"], "2");
    expect(
        hub,
        &account,
        404,
        json!({"type": "get", "kind": "ConfigMap", "namespace": ns, "name": "missing"}),
    )
    .await?;
    let listed = expect(hub, &account, 200, json!({"type": "list", "kind": "configmaps", "namespace": ns, "fieldSelector": "metadata.name=fresh"})).await?;
    assert_eq!(listed["objects"].as_array().map(Vec::len), Some(1));
    let listed = expect(hub, &account, 200, json!({"type": "list", "kind": "deployments.apps", "namespace": ns, "labelSelector": "app=web"})).await?;
    assert_eq!(listed["objects"][0]["metadata"]["name"], "web");

    // A bad request never reaches an agent.
    let bad = expect(
        hub,
        &account,
        400,
        json!({"type": "scale", "kind": "Deployment", "name": "web"}),
    )
    .await?;
    assert!(
        bad["status"]["message"]
            .as_str()
            .unwrap_or_default()
            .contains("replicas")
    );
    // An unknown account.
    expect(
        hub,
        "no-such-account",
        404,
        json!({"type": "get", "kind": "ConfigMap", "name": "x"}),
    )
    .await?;
    let (_, metrics) = http(hub, "GET", "/metrics", None).await?;
    let metrics = metrics.as_str().unwrap_or_default().to_string();
    assert!(
        metrics.contains("scale_agent_hub_operations_total{type=\"apply\",state=\"succeeded\"}"),
        "{metrics}"
    );
    s.stop().await
}
