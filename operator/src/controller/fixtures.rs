//! A scripted API server for reconcile tests without a cluster, in the style of kube-rs
//! controller-rs `src/fixtures.rs`: a test lists the requests it expects, in order, with the
//! answers, and kube's own client talks to it through a `tower::service_fn`. The paths the
//! control-plane tests reach only slowly or by luck (conflicts, server errors) are tested
//! here.

use std::{
    collections::VecDeque,
    convert::Infallible,
    sync::{Arc, Mutex},
};

use http::{Request, Response};
use kube::{
    client::Body,
    runtime::{reflector, watcher},
};
use scale_agent_crds::AgentAccount;
use serde_json::{Value, json};

use super::{AccountCache, AccountStore, Config, Context, GuardedAccount};
use crate::metrics::Metrics;

/// One expected request and its answer.
struct Exchange {
    method: &'static str,
    path: String,
    status: u16,
    body: Value,
}

/// The requests a test expects, in order; anything else is recorded and answered 500.
#[derive(Clone, Default)]
pub(crate) struct ApiServer {
    expected: Arc<Mutex<VecDeque<Exchange>>>,
    unexpected: Arc<Mutex<Vec<String>>>,
}

impl ApiServer {
    /// Expects `method path` next and answers `status` with `body`.
    pub(crate) fn expect(self, method: &'static str, path: &str, status: u16, body: Value) -> Self {
        self.expected
            .lock()
            .expect("not poisoned")
            .push_back(Exchange {
                method,
                path: path.to_owned(),
                status,
                body,
            });
        self
    }

    /// A client of this server.
    pub(crate) fn client(&self) -> kube::Client {
        let server = self.clone();
        let service = tower::service_fn(move |request: Request<Body>| {
            let server = server.clone();
            async move {
                let seen = format!("{} {}", request.method(), request.uri().path());
                let next = server.expected.lock().expect("not poisoned").pop_front();
                let (status, body) = match next {
                    Some(exchange)
                        if exchange.method == request.method().as_str()
                            && exchange.path == request.uri().path() =>
                    {
                        (exchange.status, exchange.body)
                    }
                    other => {
                        let wanted = other.map(|e| format!("{} {}", e.method, e.path));
                        server
                            .unexpected
                            .lock()
                            .expect("not poisoned")
                            .push(format!("{seen} (expected {wanted:?})"));
                        (500, status_body(500, "InternalError", "unexpected request"))
                    }
                };
                let response = Response::builder()
                    .status(status)
                    .header("content-type", "application/json")
                    .body(Body::from(body.to_string().into_bytes()))
                    .expect("a valid response");
                Ok::<_, Infallible>(response)
            }
        });
        kube::Client::new(service, "default")
    }

    /// Fails the test when a request was missing or unexpected.
    pub(crate) fn verify(&self) {
        let unexpected = self.unexpected.lock().expect("not poisoned").clone();
        assert!(unexpected.is_empty(), "unexpected requests: {unexpected:?}");
        let left: Vec<String> = self
            .expected
            .lock()
            .expect("not poisoned")
            .iter()
            .map(|e| format!("{} {}", e.method, e.path))
            .collect();
        assert!(left.is_empty(), "requests never made: {left:?}");
    }
}

/// A Kubernetes `Status` answer.
pub(crate) fn status_body(code: u16, reason: &str, message: &str) -> Value {
    json!({
        "kind": "Status", "apiVersion": "v1", "metadata": {},
        "status": "Failure", "reason": reason, "message": message, "code": code,
    })
}

/// An AgentAccount cache holding `accounts`, filled (as after the watch's first list).
pub(crate) fn filled_store(accounts: &[AgentAccount]) -> AccountStore {
    let (store, mut writer) = reflector::store::<GuardedAccount>();
    writer.apply_watcher_event(&watcher::Event::Init);
    for account in accounts {
        let guarded: GuardedAccount =
            serde_json::from_value(serde_json::to_value(account).expect("serialises"))
                .expect("deserialises");
        writer.apply_watcher_event(&watcher::Event::InitApply(guarded));
    }
    writer.apply_watcher_event(&watcher::Event::InitDone);
    store
}

/// A context whose client is `server`'s, with `accounts` in its cache, retrying after 3 s
/// (doubling, at most 24 s): distinct from the 1 s of a lost finalizer race.
pub(crate) fn context(server: &ApiServer, accounts: &[AgentAccount]) -> Arc<Context> {
    let config = Config {
        retry_base: std::time::Duration::from_secs(3),
        retry_max: std::time::Duration::from_secs(24),
        ..Config::default()
    };
    Arc::new(Context::new(
        server.client(),
        config,
        Arc::new(Metrics::new()),
        vec![AccountCache {
            store: filled_store(accounts),
            filled: tokio::sync::watch::channel(true).1,
        }],
    ))
}
