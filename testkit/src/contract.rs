//! The Clouddriver contract server shared by the hub's registrar tests
//! (`hub/tests/clouddriver.rs`), its hub-level registration test
//! (`hub/tests/proxy_clouddriver.rs`) and the replicas' registration test
//! (`e2e/tests/hub_ownership.rs`).
//!
//! THE SERVER BELOW IS NOT CLOUDDRIVER. It is a contract written from Clouddriver's source:
//! it answers what Clouddriver answers and refuses what Clouddriver would refuse (plus a few
//! things it would accept and then fail on, marked "stricter"). Each rule, and where it comes
//! from (repository, commit, path):
//!
//! - Routes and their meaning, `spinnaker/spinnaker@32649bce`
//!   `clouddriver/clouddriver-web/src/main/java/com/netflix/spinnaker/clouddriver/controllers/CredentialsController.java`:
//!   `PUT /credentials` is `saveAccount` (create or replace), `POST /credentials` creates,
//!   `PUT /credentials/{accountName}` updates (the URI name must equal the body's), `DELETE
//!   /credentials/{accountName}` deletes, `GET /credentials/type/{accountType}` lists
//!   definitions of a type (`limit`, default 100, and `startingAccountName`).
//! - Listing definitions, `spinnaker/clouddriver`
//!   `clouddriver-sql/src/main/kotlin/com/netflix/spinnaker/clouddriver/sql/security/SqlAccountDefinitionRepository.kt`
//!   (`listByType`): the definitions whose type is the one asked and whose name is at or
//!   after `startingAccountName` (`idColumn.ge`), ordered by name, at most `limit`; the
//!   bodies as stored (secret references not decrypted). Used by the hub's migration of
//!   Clouddriver accounts (Armory's `POST /armory/accounts`, `hub/tests/armory_accounts.rs`).
//! - What each does, `spinnaker/spinnaker@0f06254e`
//!   `clouddriver/clouddriver-core/src/main/java/com/netflix/spinnaker/clouddriver/security/AccountDefinitionService.java`:
//!   `saveAccount` stores and returns the definition (200, the body echoed); `createAccount`
//!   refuses an existing name with `InvalidRequestException` (400, "Cannot create an account
//!   which already exists"); `deleteAccount` has no existence check (200 for a missing
//!   account); `validateAccountAuthorization` refuses an account whose permissions grant none
//!   of the user's roles ("Cannot save account without granting permissions for current
//!   user", 400), the user coming from `X-SPINNAKER-USER` (`AuthenticatedRequest`).
//! - Error bodies, `spinnaker/kork@261ccbac`
//!   `kork-web/src/main/java/com/netflix/spinnaker/kork/web/exceptions/GenericExceptionHandlers.java`:
//!   `{"error", "message", "status", ...}`; `InvalidRequestException` is 400.
//! - The body is a JSON object (`@RequestBody CredentialsDefinition`); Spring answers 415
//!   when the request's `Content-Type` is not JSON.
//! - Type discriminator, `spinnaker/clouddriver@ccf45789`
//!   `clouddriver-core/src/main/java/com/netflix/spinnaker/clouddriver/jackson/mixins/CredentialsDefinitionMixin.java`
//!   (`@JsonTypeInfo(use = NAME, property = "type")`) and `@JsonTypeName("kubernetes")` on
//!   `ManagedAccount`: `type` must be `"kubernetes"` (Jackson: 400 when missing or unknown).
//!   spinnaker.io documents `@type`; stricter: when present it must be `"kubernetes"` too.
//! - Fields and their JSON types, `spinnaker/spinnaker@6f89b62d`
//!   `clouddriver/clouddriver-kubernetes/src/main/java/com/netflix/spinnaker/clouddriver/kubernetes/config/KubernetesAccountProperties.java`
//!   (`ManagedAccount`). Stricter: Clouddriver ignores unknown properties
//!   (`spinnaker/clouddriver@1a81c481`
//!   `clouddriver-core/src/main/groovy/com/netflix/spinnaker/clouddriver/config/CloudDriverConfig.groovy`,
//!   `failOnUnknownProperties(false)`); this contract refuses them, since a field Clouddriver
//!   drops silently is a bug in the sender.
//! - `ManagedAccount.validate()` (same file): a name, not both `namespaces` and
//!   `omitNamespaces`, not both `kinds` and `omitKinds`. Stricter: Clouddriver runs it when
//!   it loads the account, after the API accepted it; this contract answers 400 at once.
//! - Name pattern, `spinnaker/kork@9c3371fa`
//!   `kork-credentials/src/main/java/com/netflix/spinnaker/credentials/validator/CredentialsDefinitionValidatorProperties.java`:
//!   `[a-zA-Z][-_a-zA-Z0-9]+[a-zA-Z0-9]`.
//! - Permission keys, `spinnaker/fiat@04138a88`
//!   `fiat-core/src/main/java/com/netflix/spinnaker/fiat/model/Authorization.java` (`READ`,
//!   `WRITE`, `EXECUTE`, `CREATE`) read as the keys of `Permissions.Builder`
//!   (`fiat-core/.../model/resources/Permissions.java`, a map of `Authorization` to roles):
//!   Jackson refuses any other key.
//! - Not from Clouddriver (which only writes `kubeconfigContents` to a file for kubectl): the
//!   kubeconfig must parse, and its current context must name a cluster whose `server` is the
//!   hub's proxy URL for the account and a user with a token. That is this project's design.

// Test code: a failed set-up should panic.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::{
    collections::{BTreeMap, VecDeque},
    net::SocketAddr,
    sync::{
        Arc, Mutex,
        atomic::{AtomicUsize, Ordering},
    },
    time::Instant,
};

use axum::{
    Json, Router,
    body::Bytes,
    extract::{Path as UrlPath, State},
    http::{HeaderMap, StatusCode, header},
    response::{IntoResponse, Response},
    routing::{delete, put},
};
use rcgen::ExtendedKeyUsagePurpose;
use serde_json::{Value, json};
use tokio::net::TcpListener;

use crate::{pki, tls};

/// The hub URL the registrar tests put into their kubeconfigs.
pub const HUB: &str = "https://hub.example:8443";

// ------------------------------------------------------------------ the contract server

/// One request the contract saw.
#[derive(Clone, Debug)]
pub struct Seen {
    pub method: &'static str,
    pub path: String,
    pub user: Option<String>,
    pub at: Instant,
    pub status: u16,
    /// Why the contract refused the body, if it did.
    pub refusal: Option<String>,
}

#[derive(Default)]
pub struct ContractState {
    pub accounts: BTreeMap<String, Value>,
    pub seen: Vec<Seen>,
    /// Statuses to answer the next requests with, before looking at them.
    pub faults: VecDeque<u16>,
    /// Accounts refused as Clouddriver refuses an account that locks its creator out.
    pub locked_out: Vec<String>,
}

pub struct Contract {
    /// The hub URL every kubeconfig must point at.
    hub_url: String,
    state: Mutex<ContractState>,
    /// Connections to close as soon as they are accepted.
    pub drops: Arc<AtomicUsize>,
    pub dropped: Arc<AtomicUsize>,
}

impl Contract {
    fn new(hub_url: &str) -> Self {
        Contract {
            hub_url: hub_url.trim_end_matches('/').to_owned(),
            state: Mutex::default(),
            drops: Arc::default(),
            dropped: Arc::default(),
        }
    }

    pub fn state(&self) -> std::sync::MutexGuard<'_, ContractState> {
        self.state.lock().unwrap()
    }

    pub fn seen(&self) -> Vec<Seen> {
        self.state().seen.clone()
    }

    pub fn accounts(&self) -> BTreeMap<String, Value> {
        self.state().accounts.clone()
    }
}

/// kork-web's error body.
fn kork_error(status: StatusCode, message: &str) -> Response {
    let body = json!({
        "timestamp": 1_700_000_000_000_u64,
        "status": status.as_u16(),
        "error": status.canonical_reason().unwrap_or(""),
        "message": message,
    });
    // A failed exchange closes its connection, so that the next request makes a new one
    // (and a scripted connection drop applies to it).
    (status, [(header::CONNECTION, "close")], Json(body)).into_response()
}

fn user(headers: &HeaderMap) -> Option<String> {
    headers
        .get("x-spinnaker-user")
        .and_then(|v| v.to_str().ok())
        .map(str::to_owned)
}

/// `ManagedAccount`'s fields and JSON types (KubernetesAccountProperties.java), written here
/// again from the Java source rather than taken from the code under test.
fn managed_account_field(name: &str) -> Option<&'static str> {
    Some(match name {
        "name"
        | "environment"
        | "accountType"
        | "context"
        | "oAuthServiceAccount"
        | "oauthServiceAccount"
        | "kubeconfigFile"
        | "kubeconfigContents"
        | "kubectlExecutable"
        | "namingStrategy" => "string",
        "oAuthScopes"
        | "oauthScopes"
        | "namespaces"
        | "omitNamespaces"
        | "requiredGroupMembership"
        | "kinds"
        | "omitKinds" => "strings",
        "kubectlRequestTimeoutSeconds" | "cacheThreads" | "cacheIntervalSeconds" => "integer",
        "serviceAccount"
        | "debug"
        | "metrics"
        | "checkPermissionsOnStartup"
        | "onlySpinnakerManaged"
        | "cacheAllApplicationRelationships" => "boolean",
        "permissions" => "permissions",
        "customResources" | "cachingPolicies" => "objects",
        "rawResourcesEndpointConfig" => "object",
        _ => return None,
    })
}

fn type_ok(kind: &str, v: &Value) -> bool {
    let strings = |v: &Value| v.as_array().is_some_and(|a| a.iter().all(Value::is_string));
    match kind {
        "string" => v.is_string(),
        "strings" => strings(v),
        "integer" => v.is_i64() || v.is_u64(),
        "boolean" => v.is_boolean(),
        "objects" => v.as_array().is_some_and(|a| a.iter().all(Value::is_object)),
        "object" => v.is_object(),
        "permissions" => v.as_object().is_some_and(|m| {
            m.iter().all(|(k, roles)| {
                ["READ", "WRITE", "EXECUTE", "CREATE"].contains(&k.as_str()) && strings(roles)
            })
        }),
        _ => false,
    }
}

/// kork's default account name pattern `[a-zA-Z][-_a-zA-Z0-9]+[a-zA-Z0-9]`.
fn valid_name(name: &str) -> bool {
    let b = name.as_bytes();
    b.len() >= 3
        && b[0].is_ascii_alphabetic()
        && b[b.len() - 1].is_ascii_alphanumeric()
        && b[1..b.len() - 1]
            .iter()
            .all(|c| c.is_ascii_alphanumeric() || *c == b'-' || *c == b'_')
}

fn find<'a>(list: &'a Value, name: &str) -> Option<&'a Value> {
    list.as_array()?
        .iter()
        .find(|e| e.get("name").and_then(Value::as_str) == Some(name))
}

/// The kubeconfig checks (this project's requirement): parses, and its current context
/// reaches `{hub}/clusters/{account}` with a token.
fn check_kubeconfig(text: &str, hub: &str, account: &str) -> Result<(), String> {
    let k: Value = serde_saphyr::from_str(text).map_err(|e| format!("kubeconfig: {e}"))?;
    if k["apiVersion"] != "v1" || k["kind"] != "Config" {
        return Err("kubeconfig: not apiVersion v1, kind Config".into());
    }
    let current = k["current-context"]
        .as_str()
        .ok_or("kubeconfig: no current-context")?;
    let context = find(&k["contexts"], current).ok_or("kubeconfig: current context missing")?;
    let cluster_name = context["context"]["cluster"].as_str().unwrap_or_default();
    let user_name = context["context"]["user"].as_str().unwrap_or_default();
    let cluster = find(&k["clusters"], cluster_name).ok_or("kubeconfig: cluster missing")?;
    let expected = format!("{hub}/clusters/{account}");
    if cluster["cluster"]["server"] != expected.as_str() {
        return Err(format!("kubeconfig: server is not {expected}"));
    }
    let user = find(&k["users"], user_name).ok_or("kubeconfig: user missing")?;
    if user["user"]["token"].as_str().is_none_or(str::is_empty) {
        return Err("kubeconfig: the user has no token".into());
    }
    Ok(())
}

/// Everything Clouddriver (or this stricter contract) checks in a `ManagedAccount` body.
fn check_definition(
    hub: &str,
    headers: &HeaderMap,
    raw: &[u8],
) -> Result<(String, Value), (u16, String)> {
    let bad = |m: String| (400, m);
    let json_type = headers
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| v.starts_with("application/json"));
    if !json_type {
        return Err((415, "Content type not supported".into()));
    }
    let body: Value =
        serde_json::from_slice(raw).map_err(|e| bad(format!("JSON parse error: {e}")))?;
    let map = body
        .as_object()
        .ok_or_else(|| bad("not a JSON object".into()))?;
    match map.get("type").and_then(Value::as_str) {
        Some("kubernetes") => {}
        Some(other) => return Err(bad(format!("Could not resolve type id '{other}'"))),
        None => return Err(bad("missing type id property 'type'".into())),
    }
    if map.get("@type").is_some_and(|t| t != "kubernetes") {
        return Err(bad("@type is not kubernetes".into()));
    }
    for (key, value) in map {
        if key == "type" || key == "@type" {
            continue;
        }
        let kind = managed_account_field(key)
            .ok_or_else(|| bad(format!("{key:?} is not a ManagedAccount field")))?;
        if !type_ok(kind, value) {
            return Err(bad(format!("{key:?} is not a valid {kind}")));
        }
    }
    let name = map.get("name").and_then(Value::as_str).unwrap_or_default();
    if name.is_empty() {
        return Err(bad("Account name for Kubernetes provider missing.".into()));
    }
    if !valid_name(name) {
        return Err(bad(format!(
            "Provided account name '{name}' does not match regular expression"
        )));
    }
    let set = |k: &str| {
        map.get(k)
            .and_then(Value::as_array)
            .is_some_and(|a| !a.is_empty())
    };
    if set("namespaces") && set("omitNamespaces") {
        return Err(bad(
            "At most one of 'namespaces' and 'omitNamespaces' can be specified".into(),
        ));
    }
    if set("kinds") && set("omitKinds") {
        return Err(bad(
            "At most one of 'kinds' and 'omitKinds' can be specified".into(),
        ));
    }
    let kubeconfig = map
        .get("kubeconfigContents")
        .and_then(Value::as_str)
        .ok_or_else(|| bad("no kubeconfigContents".into()))?;
    check_kubeconfig(kubeconfig, hub, name).map_err(bad)?;
    Ok((name.to_owned(), body))
}

impl Contract {
    /// A scripted fault for the next request, if any.
    fn fault(&self, method: &'static str, path: &str, headers: &HeaderMap) -> Option<Response> {
        let mut st = self.state();
        let status = st.faults.pop_front()?;
        st.seen.push(Seen {
            method,
            path: path.into(),
            user: user(headers),
            at: Instant::now(),
            status,
            refusal: None,
        });
        let status = StatusCode::from_u16(status).unwrap();
        Some(kork_error(status, "scripted failure"))
    }

    fn record(
        &self,
        method: &'static str,
        path: String,
        headers: &HeaderMap,
        status: u16,
        refusal: Option<String>,
    ) {
        self.state().seen.push(Seen {
            method,
            path,
            user: user(headers),
            at: Instant::now(),
            status,
            refusal,
        });
    }
}

async fn save(State(c): State<Arc<Contract>>, headers: HeaderMap, raw: Bytes) -> Response {
    if let Some(r) = c.fault("PUT", "/credentials", &headers) {
        return r;
    }
    let (name, definition) = match check_definition(&c.hub_url, &headers, &raw) {
        Ok(ok) => ok,
        Err((status, message)) => {
            c.record(
                "PUT",
                "/credentials".into(),
                &headers,
                status,
                Some(message.clone()),
            );
            return kork_error(StatusCode::from_u16(status).unwrap(), &message);
        }
    };
    if c.state().locked_out.contains(&name) {
        let message = format!(
            "Cannot save account without granting permissions for current user (name: {name})"
        );
        c.record(
            "PUT",
            "/credentials".into(),
            &headers,
            400,
            Some(message.clone()),
        );
        return kork_error(StatusCode::BAD_REQUEST, &message);
    }
    c.record("PUT", "/credentials".into(), &headers, 200, None);
    c.state().accounts.insert(name, definition.clone());
    Json(definition).into_response()
}

async fn create(State(c): State<Arc<Contract>>, headers: HeaderMap, raw: Bytes) -> Response {
    let (name, definition) = match check_definition(&c.hub_url, &headers, &raw) {
        Ok(ok) => ok,
        Err((status, message)) => {
            return kork_error(StatusCode::from_u16(status).unwrap(), &message);
        }
    };
    let mut st = c.state();
    if st.accounts.contains_key(&name) {
        return kork_error(
            StatusCode::BAD_REQUEST,
            &format!("Cannot create an account which already exists (name: {name})"),
        );
    }
    st.accounts.insert(name, definition.clone());
    Json(definition).into_response()
}

async fn remove(
    State(c): State<Arc<Contract>>,
    UrlPath(name): UrlPath<String>,
    headers: HeaderMap,
) -> Response {
    let path = format!("/credentials/{name}");
    if let Some(r) = c.fault("DELETE", &path, &headers) {
        return r;
    }
    c.record("DELETE", path, &headers, 200, None);
    c.state().accounts.remove(&name);
    StatusCode::OK.into_response()
}

/// `GET /credentials/type/{accountType}?limit=&startingAccountName=`.
async fn list_by_type(
    State(c): State<Arc<Contract>>,
    UrlPath(kind): UrlPath<String>,
    axum::extract::Query(query): axum::extract::Query<BTreeMap<String, String>>,
    headers: HeaderMap,
) -> Response {
    let path = format!("/credentials/type/{kind}");
    if let Some(r) = c.fault("GET", &path, &headers) {
        return r;
    }
    let limit = match query.get("limit").map(|l| l.parse::<usize>()) {
        None => 100,
        Some(Ok(limit)) => limit,
        Some(Err(_)) => {
            return kork_error(
                StatusCode::BAD_REQUEST,
                "Failed to convert value of type 'java.lang.String' to required type 'java.lang.Integer'",
            );
        }
    };
    let from = query
        .get("startingAccountName")
        .cloned()
        .unwrap_or_default();
    c.record("GET", path, &headers, 200, None);
    let listed: Vec<Value> = c
        .state()
        .accounts
        .range(from..)
        .map(|(_, definition)| definition)
        .filter(|d| d.get("type").and_then(Value::as_str) == Some(kind.as_str()))
        .take(limit)
        .cloned()
        .collect();
    Json(listed).into_response()
}

async fn not_found() -> Response {
    kork_error(StatusCode::NOT_FOUND, "No handler found")
}

fn router(contract: Arc<Contract>) -> Router {
    Router::new()
        .route("/credentials", put(save).post(create))
        .route("/credentials/{name}", delete(remove))
        .route("/credentials/type/{kind}", axum::routing::get(list_by_type))
        .fallback(not_found)
        .with_state(contract)
}

/// A TCP listener that closes the connections it was told to drop as soon as they arrive.
struct DroppingListener {
    inner: TcpListener,
    drops: Arc<AtomicUsize>,
    dropped: Arc<AtomicUsize>,
}

impl axum::serve::Listener for DroppingListener {
    type Io = tokio::net::TcpStream;
    type Addr = SocketAddr;

    async fn accept(&mut self) -> (Self::Io, Self::Addr) {
        loop {
            let Ok((stream, addr)) = self.inner.accept().await else {
                continue;
            };
            let drop_it = self
                .drops
                .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |n| n.checked_sub(1))
                .is_ok();
            if drop_it {
                self.dropped.fetch_add(1, Ordering::SeqCst);
                drop(stream);
                continue;
            }
            return (stream, addr);
        }
    }

    fn local_addr(&self) -> std::io::Result<Self::Addr> {
        self.inner.local_addr()
    }
}

/// A contract whose kubeconfigs must point at [`HUB`]; returns its URL.
pub async fn start_contract() -> (Arc<Contract>, String) {
    start_contract_for(HUB).await
}

/// A contract whose kubeconfigs must point at `hub_url`; returns its URL.
pub async fn start_contract_for(hub_url: &str) -> (Arc<Contract>, String) {
    let contract = Arc::new(Contract::new(hub_url));
    let inner = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = inner.local_addr().unwrap();
    let listener = DroppingListener {
        inner,
        drops: contract.drops.clone(),
        dropped: contract.dropped.clone(),
    };
    let app = router(contract.clone());
    tokio::spawn(async move { axum::serve(listener, app).await });
    (contract, format!("http://{addr}"))
}

/// A TLS listener (the server certificate is signed by a test CA); the OIDC issuer uses it
/// too.
pub(crate) struct TlsListener {
    pub(crate) inner: TcpListener,
    pub(crate) acceptor: tokio_rustls::TlsAcceptor,
}

impl axum::serve::Listener for TlsListener {
    type Io = tokio_rustls::server::TlsStream<tokio::net::TcpStream>;
    type Addr = SocketAddr;

    async fn accept(&mut self) -> (Self::Io, Self::Addr) {
        loop {
            let Ok((stream, addr)) = self.inner.accept().await else {
                continue;
            };
            if let Ok(tls) = self.acceptor.accept(stream).await {
                return (tls, addr);
            }
        }
    }

    fn local_addr(&self) -> std::io::Result<Self::Addr> {
        self.inner.local_addr()
    }
}

/// An HTTPS contract; returns its URL and the CA's PEM.
pub async fn start_tls_contract() -> (Arc<Contract>, String, String) {
    let ca = pki::ca("clouddriver-test-ca");
    let (cert_pem, key_pem) = pki::leaf(&ca, &["localhost"], ExtendedKeyUsagePurpose::ServerAuth);
    let server = tls::server_config(&cert_pem, &key_pem).unwrap();
    let contract = Arc::new(Contract::new(HUB));
    let inner = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = inner.local_addr().unwrap().port();
    let listener = TlsListener {
        inner,
        acceptor: tokio_rustls::TlsAcceptor::from(Arc::new(server)),
    };
    let app = router(contract.clone());
    tokio::spawn(async move { axum::serve(listener, app).await });
    (contract, format!("https://localhost:{port}"), ca.pem())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{
        http::Call,
        https::{Https, Proto},
    };

    fn kubeconfig(hub: &str, account: &str) -> String {
        format!(
            "apiVersion: v1\nkind: Config\ncurrent-context: c\n\
             contexts: [{{name: c, context: {{cluster: k, user: u}}}}]\n\
             clusters: [{{name: k, cluster: {{server: '{hub}/clusters/{account}'}}}}]\n\
             users: [{{name: u, user: {{token: t}}}}]\n"
        )
    }

    #[tokio::test]
    async fn saves_a_valid_account_and_refuses_a_foreign_kubeconfig() {
        let (contract, url) = start_contract().await;
        let put = |body: Value| {
            Call::new("PUT", format!("{url}/credentials"))
                .header("x-spinnaker-user", "registrar")
                .json(&body)
                .send()
        };
        let good = json!({
            "type": "kubernetes",
            "name": "prod-eu",
            "kubeconfigContents": kubeconfig(HUB, "prod-eu"),
        });
        let reply = put(good.clone()).await.unwrap();
        assert_eq!(reply.status, 200, "{}", reply.body);
        assert_eq!(contract.accounts().get("prod-eu"), Some(&good));
        let foreign = json!({
            "type": "kubernetes",
            "name": "staging",
            "kubeconfigContents": kubeconfig("https://elsewhere", "staging"),
        });
        let reply = put(foreign).await.unwrap();
        assert_eq!(reply.status, 400, "{}", reply.body);
        let seen = contract.seen();
        assert_eq!(seen.len(), 2);
        assert_eq!(seen[0].user.as_deref(), Some("registrar"));
        assert!(
            seen[1]
                .refusal
                .as_deref()
                .is_some_and(|r| r.contains("server is not")),
            "{seen:?}"
        );
    }

    #[tokio::test]
    async fn the_tls_contract_answers_a_client_trusting_its_ca() {
        let (_contract, url, ca_pem) = start_tls_contract().await;
        let reply = Https::new(&ca_pem, url, Proto::H1)
            .get("/nowhere", None)
            .await;
        assert_eq!(reply.status, 404, "{}", reply.text());
        assert_eq!(reply.json()["message"], "No handler found");
    }
}
