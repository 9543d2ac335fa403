//! Operations and proxied writes are audited.

use super::*;

/// The hub's audit lines (`--log-format json`, target `audit`) in its log.
fn audit_lines(log: &str) -> Vec<Value> {
    log.lines()
        .filter_map(|l| serde_json::from_str::<Value>(l).ok())
        .filter(|v| v["target"] == "audit")
        .collect()
}

/// Audit: an operation submitted with an API token and a write through the Kubernetes API
/// proxy with a proxy token are each one JSON line with target `audit` naming who (token and
/// kind), the account, the verb, the object, the API server's code and the duration; with
/// `--proxy-audit-reads writes-only` a read through the proxy is not audited (reads are by
/// default: e2e/tests/proxy_callers.rs). With `--audit-log-path` the binary writes the same
/// lines (their fields) to the audit file.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn operations_and_proxied_writes_are_audited() -> anyhow::Result<()> {
    let (control_plane, admin, ns) = cluster("audit").await?;
    let audit_dir = fixtures::temp_dir("scale-agent-e2e-audit-file")?;
    let audit_file = audit_dir.join("audit.log");
    let audit_flag = format!("--audit-log-path={}", audit_file.display());
    let s = setup(
        "audit",
        &[
            "--log-format=json",
            "--proxy-audit-reads=writes-only",
            &audit_flag,
        ],
    )
    .await?;
    let writer = k8s_openapi::api::rbac::v1::PolicyRule {
        api_groups: Some(vec![String::new()]),
        resources: Some(vec!["configmaps".into()]),
        verbs: vec!["*".into()],
        ..Default::default()
    };
    let kubeconfig = fixtures::service_account_identity(
        control_plane,
        &admin,
        &ns,
        "agent",
        Scope::Namespace,
        vec![writer],
        s.dir.path().join("kubeconfig-audit"),
    )
    .await?;
    let account = unique("audit");
    let config = s.dir.path().join("agent.yaml");
    write_agent_config(
        &config,
        &s.hub,
        json!([{
            "name": account,
            "kubeconfigFile": kubeconfig.display().to_string(),
            "namespaces": [ns],
            "kinds": ["configmaps"],
        }]),
    )?;
    let agent = Agent::start(s.dir.path(), &config, "audit-0", &s.tls).await?;
    eventually("the agent ready", || agent.ready()).await?;
    let hub = &s.hub;

    // An operation, with the tests' API token (name "e2e", role operator).
    let manifest = json!({
        "apiVersion": "v1", "kind": "ConfigMap",
        "metadata": { "name": "audited-op", "namespace": ns },
        "data": { "a": "1" },
    });
    let submitted = fixtures::hub_call(
        "POST",
        hub.http,
        &format!("/api/v1/accounts/{account}/operations"),
    )
    .json(&json!({ "type": "apply", "manifest": manifest }))
    .timeout(WAIT)
    .send()
    .await?;
    assert_eq!(submitted.status, 200, "{}", submitted.body);

    // A proxy token from the admin API, with the admin token the hub wrote at start.
    let admin_token = std::fs::read_to_string(hub.data_dir.join("admin-token"))?;
    let issued = http::Call::new(
        "POST",
        format!(
            "http://{}/api/v1/accounts/{account}/kubeconfig?tokenName=auditor",
            hub.http
        ),
    )
    .bearer(admin_token.trim())
    .send()
    .await?;
    assert_eq!(issued.status, 200, "{}", issued.body);
    let proxy_token = issued
        .body
        .lines()
        .find_map(|l| l.trim().strip_prefix("token: "))
        .ok_or_else(|| anyhow::anyhow!("no token in {}", issued.body))?
        .to_string();
    let collection = format!("/clusters/{account}/api/v1/namespaces/{ns}/configmaps");
    let created = http::Call::new("POST", format!("http://{}{collection}", hub.http))
        .bearer(&proxy_token)
        .json(&json!({
            "apiVersion": "v1", "kind": "ConfigMap",
            "metadata": { "name": "audited-proxy" },
        }))
        .timeout(WAIT)
        .send()
        .await?;
    assert_eq!(created.status, 201, "{}", created.body);
    let read = http::Call::new(
        "GET",
        format!("http://{}{collection}/audited-proxy", hub.http),
    )
    .bearer(&proxy_token)
    .timeout(WAIT)
    .send()
    .await?;
    assert_eq!(read.status, 200, "{}", read.body);
    // A write the API server refuses is audited with its code too.
    let forbidden = http::Call::new(
        "DELETE",
        format!(
            "http://{}/clusters/{account}/api/v1/namespaces/{ns}/secrets/x",
            hub.http
        ),
    )
    .bearer(&proxy_token)
    .timeout(WAIT)
    .send()
    .await?;
    assert_eq!(forbidden.status, 403, "{}", forbidden.body);

    let mut lines = Vec::new();
    eventually("three audit lines in the hub's log", || {
        // The account's first binding has its own line (issue 28, F15); this test is about
        // operations and proxied requests.
        lines = audit_lines(&hub.log())
            .into_iter()
            .filter(|l| l["fields"]["message"] != "account bound")
            .collect();
        let count = lines.len();
        async move { Ok(count >= 3) }
    })
    .await?;
    assert_eq!(lines.len(), 3, "the GET is not audited: {lines:#?}");
    let fields: Vec<&Value> = lines.iter().map(|l| &l["fields"]).collect();
    let operation = fields[0];
    assert_eq!(operation["message"], "operation", "{operation}");
    assert_eq!(operation["who"], fixtures::API_TOKEN_NAME, "{operation}");
    assert_eq!(operation["token_kind"], "api", "{operation}");
    assert_eq!(operation["account"], account.as_str(), "{operation}");
    assert_eq!(operation["verb"], "apply", "{operation}");
    assert_eq!(
        operation["object"],
        format!("ConfigMap/{ns}/audited-op"),
        "{operation}"
    );
    assert_eq!(operation["code"], 200, "{operation}");
    assert!(operation["duration_ms"].is_u64(), "{operation}");
    let write = fields[1];
    assert_eq!(write["message"], "proxied write", "{write}");
    assert_eq!(write["who"], "auditor", "{write}");
    assert_eq!(write["token_kind"], "proxy", "{write}");
    assert_eq!(write["account"], account.as_str(), "{write}");
    assert_eq!(write["verb"], "create", "{write}");
    assert_eq!(write["object"], format!("configmaps/{ns}"), "{write}");
    assert_eq!(write["code"], 201, "{write}");
    assert!(write["duration_ms"].is_u64(), "{write}");
    let refused = fields[2];
    assert_eq!(
        (&refused["verb"], &refused["object"], &refused["code"]),
        (
            &json!("delete"),
            &json!(format!("secrets/{ns}/x")),
            &json!(403)
        ),
        "{refused}"
    );
    assert!(
        !hub.log().contains(fixtures::API_TOKEN) && !hub.log().contains(&proxy_token),
        "a token in the hub's log"
    );
    // The audit file holds the same lines, field for field (the request ids included).
    let in_file: Vec<Value> = std::fs::read_to_string(&audit_file)?
        .lines()
        .map(serde_json::from_str::<Value>)
        .collect::<Result<_, _>>()?;
    let file_fields: Vec<&Value> = in_file
        .iter()
        .inspect(|l| assert_eq!(l["target"], "audit", "{l}"))
        .map(|l| &l["fields"])
        .filter(|f| f["message"] != "account bound")
        .collect();
    assert_eq!(file_fields, fields, "the audit file and the log disagree");
    assert!(
        write["request_id"]
            .as_str()
            .is_some_and(|id| id.len() == 36),
        "{write}"
    );
    drop(agent);
    let _ = std::fs::remove_dir_all(&audit_dir);
    Ok(())
}
