//! Table watches with bookmarks, through the proxy and directly: a streaming list
//! (`sendInitialEvents=true&resourceVersionMatch=NotOlderThan&allowWatchBookmarks=true`)
//! in Table form of every kind the test prints, which the API server accepts and ends with
//! its initial-events-end BOOKMARK as a Table of one row printed from an empty object. The
//! hub answers from its cache (its header says so and the API server's audit log has no
//! such request) with the same events: the same types and counts, the same column
//! definitions in the first event and none after, and the same bookmark Table but for
//! resourceVersions (the API server's is its newest, the hub's the resume point of its
//! watch, equal or older; both are positions in the same etcd history).

use futures::{StreamExt as _, TryStreamExt as _};
use scale_agent_e2e::{
    ControlPlane,
    http::Call,
    proxy_stack::{audited_control_plane, proxy_token},
};
use serde_json::Value;

use super::{KUBECTL_TIMEOUT, Setup};

/// The User-Agent of the test's own watches, to find them in the audit log.
const USER_AGENT: &str = "scale-agent-e2e-table-bookmarks";
/// What kubectl sends, Table first.
const ACCEPT: &str = "application/json;as=Table;v=v1;g=meta.k8s.io,application/json";

/// The events of a watch that ends by its `timeoutSeconds`.
fn events(body: &str) -> anyhow::Result<Vec<Value>> {
    body.lines().map(|l| Ok(serde_json::from_str(l)?)).collect()
}

/// An event with its resourceVersions blanked (the Table's and its row's object's).
fn without_versions(mut event: Value) -> Value {
    if let Some(table) = event.get_mut("object") {
        if let Some(m) = table.pointer_mut("/metadata") {
            m["resourceVersion"] = Value::Null;
        }
        if let Some(rows) = table.get_mut("rows").and_then(Value::as_array_mut) {
            for row in rows {
                if let Some(m) = row.pointer_mut("/object/metadata") {
                    m["resourceVersion"] = Value::Null;
                }
            }
        }
    }
    event
}

/// What both sides must agree on: the events' types, the first event's column
/// definitions, every later event's (null), and the bookmark without versions.
fn shape(events: &[Value]) -> (Vec<String>, Vec<Value>, Option<Value>) {
    let types = events
        .iter()
        .map(|e| e["type"].as_str().unwrap_or_default().to_string())
        .collect();
    let columns = events
        .iter()
        .map(|e| e["object"]["columnDefinitions"].clone())
        .collect();
    let bookmark = events
        .iter()
        .rfind(|e| e["type"] == "BOOKMARK")
        .cloned()
        .map(without_versions);
    (types, columns, bookmark)
}

/// Every kind's streaming list in Table form, through the proxy and directly.
pub async fn table_streaming_lists_equal(setup: &Setup, paths: &[String]) -> anyhow::Result<()> {
    let stack = &setup.stack;
    let control_plane = audited_control_plane()?;
    let token = proxy_token(&stack.direct)?;
    let query = "watch=true&sendInitialEvents=true&resourceVersionMatch=NotOlderThan\
                 &allowWatchBookmarks=true&timeoutSeconds=2";
    let before = control_plane.audit_events()?.len();
    // Each watch lasts its 2 s timeout: eight kinds at a time.
    let compared: Vec<()> = futures::stream::iter(paths)
        .map(|path| compare_streaming_list(setup, control_plane, &token, query, path))
        .buffer_unordered(8)
        .try_collect()
        .await?;
    anyhow::ensure!(compared.len() == paths.len());
    // Served from the cache: none of the proxied watches reached the API server, while the
    // direct ones did (the control; the audit log is written as requests end).
    let deadline = tokio::time::Instant::now() + super::WAIT;
    let watches = loop {
        let watches: std::collections::BTreeSet<String> = control_plane
            .audit_events()?
            .into_iter()
            .skip(before)
            .filter(|e| e.user_agent == USER_AGENT && e.user.username == stack.user)
            .map(|e| e.audit_id)
            .collect();
        if watches.len() >= paths.len() || tokio::time::Instant::now() >= deadline {
            break watches;
        }
        tokio::time::sleep(std::time::Duration::from_millis(200)).await;
    };
    anyhow::ensure!(
        watches.len() == paths.len(),
        "the audit log has {} of the test's watches for {} direct ones: proxied ones \
         reached the API server, or the direct ones are not seen",
        watches.len(),
        paths.len()
    );
    Ok(())
}

/// One kind's streaming list in Table form through the proxy and directly: the same event
/// types, column definitions and closing bookmark.
async fn compare_streaming_list(
    setup: &Setup,
    control_plane: &ControlPlane,
    token: &str,
    query: &str,
    path: &str,
) -> anyhow::Result<()> {
    let stack = &setup.stack;
    let separator = if path.contains('?') { '&' } else { '?' };
    let proxied = stack
        .hub
        .call(
            "GET",
            &format!("/clusters/{}{path}{separator}{query}", stack.account),
        )
        .bearer(&stack.token)
        .header("accept", ACCEPT)
        .header("user-agent", USER_AGENT)
        .timeout(KUBECTL_TIMEOUT)
        .send()
        .await?;
    anyhow::ensure!(
        proxied.status == 200 && proxied.header("x-scale-agent-cache") == Some("hit"),
        "{path}: the proxy answered {} {:?} {}",
        proxied.status,
        proxied.header("x-scale-agent-cache"),
        proxied.body
    );
    let direct = Call::new(
        "GET",
        format!("{}{path}{separator}{query}", control_plane.server()),
    )
    .ca(control_plane.ca_pem())
    .bearer(token)
    .header("accept", ACCEPT)
    .header("user-agent", USER_AGENT)
    .timeout(KUBECTL_TIMEOUT)
    .send()
    .await?;
    anyhow::ensure!(direct.status == 200, "{path}: {}", direct.body);
    let (proxied_events, direct_events) = (events(&proxied.body)?, events(&direct.body)?);
    let (proxied_shape, direct_shape) = (shape(&proxied_events), shape(&direct_events));
    let bookmark = direct_shape.2.clone().unwrap_or(Value::Null);
    anyhow::ensure!(
        bookmark["object"]["kind"] == "Table"
            && bookmark["object"]["rows"][0]["object"]["metadata"]["annotations"]["k8s.io/initial-events-end"]
                == "true",
        "{path}: the API server's streaming list did not end with a Table bookmark:\n{}",
        direct.body
    );
    anyhow::ensure!(
        proxied_shape == direct_shape,
        "{path}: the proxy's Table watch\n{}\nthe API server's\n{}",
        proxied.body,
        direct.body
    );
    Ok(())
}
