//! The API server's audit log: the flags that write it (metadata of every completed request,
//! as JSON lines) and the events read back from it, so tests prove from the server's side
//! what it received.

use std::{
    fs,
    path::{Path, PathBuf},
};

use crate::error::{Result, io_err};

/// One request as the API server's audit log recorded it.
#[derive(Clone, Debug, PartialEq, Eq, serde::Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct AuditEvent {
    /// Path and query as the server received them.
    #[serde(rename = "requestURI")]
    pub request_uri: String,
    pub verb: String,
    #[serde(default)]
    pub user_agent: String,
    pub user: AuditUser,
    /// Who the request acted as when it impersonated (`Impersonate-User`, `-Group`).
    #[serde(default)]
    pub impersonated_user: Option<AuditUser>,
    /// The request's audit id: the `Audit-ID` header it came with, else the server's own.
    #[serde(default, rename = "auditID")]
    pub audit_id: String,
    #[serde(default)]
    pub response_status: Option<AuditStatus>,
}

/// Who made an audited request.
#[derive(Clone, Debug, PartialEq, Eq, serde::Deserialize)]
pub struct AuditUser {
    pub username: String,
    #[serde(default)]
    pub groups: Vec<String>,
}

/// How an audited request was answered.
#[derive(Clone, Debug, PartialEq, Eq, serde::Deserialize)]
pub struct AuditStatus {
    #[serde(default)]
    pub code: u16,
}

/// The flags that make kube-apiserver write its audit log to `log`, with its policy written
/// into `run_dir`.
pub(super) fn apiserver_args(run_dir: &Path, log: &Path) -> Result<Vec<String>> {
    let policy: PathBuf = run_dir.join("audit-policy.yaml");
    // Metadata of every request once it completed: enough to count requests by URI,
    // user and user agent, without bodies.
    fs::write(
        &policy,
        "apiVersion: audit.k8s.io/v1\nkind: Policy\nomitStages: [RequestReceived]\n\
         rules:\n- level: Metadata\n",
    )
    .map_err(io_err("write the audit policy"))?;
    Ok(vec![
        format!("--audit-policy-file={}", policy.display()),
        format!("--audit-log-path={}", log.display()),
        "--audit-log-format=json".into(),
        // Written before the response, so a test reads what was answered.
        "--audit-log-mode=blocking".into(),
    ])
}

/// Every event in the audit log at `log`; lines the server has not finished writing are
/// skipped.
pub(super) fn read_events(log: &Path) -> Result<Vec<AuditEvent>> {
    let text = fs::read_to_string(log).map_err(io_err(format!("read {}", log.display())))?;
    Ok(text
        .lines()
        .filter_map(|line| serde_json::from_str(line).ok())
        .collect())
}

#[cfg(test)]
mod audit_event_tests {
    /// An impersonated request's event: who impersonated, as whom, under which audit id.
    #[test]
    fn impersonated_events_name_both_users_and_the_audit_id() {
        let line = r#"{"kind":"Event","apiVersion":"audit.k8s.io/v1","level":"Metadata","auditID":"hub-id-1","stage":"ResponseComplete","requestURI":"/api/v1/namespaces/a/configmaps?limit=500","verb":"list","user":{"username":"system:serviceaccount:a:agent","groups":["system:authenticated"],"extra":{"k":["v"]}},"impersonatedUser":{"username":"scale-agent:alice","groups":["system:authenticated"]},"sourceIPs":["127.0.0.1"],"userAgent":"kubectl","responseStatus":{"metadata":{},"code":200}}"#;
        let event: super::AuditEvent = serde_json::from_str(line).unwrap();
        assert_eq!(event.audit_id, "hub-id-1");
        assert_eq!(event.user.username, "system:serviceaccount:a:agent");
        let as_whom = event.impersonated_user.unwrap();
        assert_eq!(as_whom.username, "scale-agent:alice");
        assert_eq!(as_whom.groups, ["system:authenticated"]);
    }
}
