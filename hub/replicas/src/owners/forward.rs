//! The internal channel between replicas: a request for an account owned by another replica
//! is authenticated where it arrived, as always, then sent to the owner under
//! `/internal/...` with the replicas' shared secret (`--replica-secret-file`) as its bearer
//! token. The owner serves it as if it had arrived there, without authenticating the client
//! again, and never forwards it further: a request carries the [`Forwarded`] mark on the
//! owner, so two replicas that disagree about the owner cannot bounce it between them.

use std::{sync::Arc, time::Duration};

use axum::{
    body::Body,
    extract::{Request, State},
    http::{HeaderMap, HeaderValue, header},
    middleware::Next,
    response::{IntoResponse, Response},
};
use hyper_util::rt::TokioIo;
use rustls::pki_types::ServerName;
use scale_agent_hub_auth::credential_sessions::{self, Lease};
use scale_agent_hub_model::{
    HubError, Result,
    auth::{Caller, Role, Source, Submitter},
    error::Chain,
};
use scale_agent_hub_net::{https, status::Status};
use scale_agent_hub_state::Live;

pub use super::secret::ReplicaSecret;
use super::{
    OwnerInfo,
    peers::PeerRule,
    secret::{PREVIOUS_HEADER, RotatingSecret},
};
use crate::Replicas;

/// The prefix of the routes other replicas forward to.
pub const INTERNAL_PREFIX: &str = "/internal";
/// The replica that forwarded a request (its `--replica-id`).
pub const FORWARDED_BY: &str = "x-scale-agent-forwarded-by";
/// The name of the caller the forwarding replica authenticated (for the owner's audit).
pub const FORWARDED_FOR: &str = "x-scale-agent-forwarded-for";
/// Who the caller is to the operations ([`Submitter::to_header`]): an operation forwarded
/// to the owner is the caller's there too, and so are its lookups (F18).
pub const FORWARDED_SUBMITTER: &str = "x-scale-agent-forwarded-submitter";
/// On answers of the Kubernetes API proxy: the replica that served the request.
pub const REPLICA_HEADER: &str = "x-scale-agent-replica";
/// How long connecting to the owner may take.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(5);

/// Marks a request that another replica forwarded: it is served here, never forwarded.
#[derive(Clone, Debug)]
pub struct Forwarded {
    /// The replica it came from.
    pub from: String,
}

/// Sends requests to the replicas that own their accounts.
pub struct Forwarder {
    client: https::HttpsClient<Body>,
    /// The replicas' secret, following its file ([`super::secret`]).
    secret: Arc<RotatingSecret>,
    /// This replica's `--replica-id`, which the owner is told the request came from.
    replica: String,
    /// The addresses the secret may be sent to.
    peers: PeerRule,
}

impl Forwarder {
    /// A client sending to the addresses `peers` allows, over HTTPS trusting nothing but
    /// `--serving-ca` (the replicas' serving certificates are the hub's own: a public CA's
    /// certificate for a host an attacker wrote into the store must not do), verifying them
    /// for `server_name` (`--replica-server-name`) or else for the host of each owner's
    /// address. `replica` is this replica's `--replica-id`.
    pub fn new(
        secret: Arc<RotatingSecret>,
        replica: &str,
        serving_ca_pem: Option<&[u8]>,
        server_name: Option<&str>,
        peers: PeerRule,
    ) -> Result<Self> {
        let tls = match (serving_ca_pem, peers.scheme()) {
            (Some(pem), _) => {
                https::private_client_tls_config("--serving-ca", pem).map_err(HubError::Config)?
            }
            (None, "https") => {
                return Err(HubError::Config(
                    "replicas forward to each other over HTTPS trusting only --serving-ca: give \
                     it the CA of the replicas' serving certificates"
                        .into(),
                ));
            }
            // Plaintext replicas (--http-plaintext): the rule refuses https:// addresses, so
            // this configuration is never used for a connection.
            (None, _) => https::client_tls_config(None).map_err(HubError::Config)?,
        };
        let server_name = server_name
            .map(|name| {
                ServerName::try_from(name.to_string())
                    .map_err(|e| HubError::Config(format!("--replica-server-name {name:?}: {e}")))
            })
            .transpose()?;
        // HTTP/1.1 only: upgraded connections (exec, port-forward) cross it as on the
        // client's side.
        let client = https::client(
            tls,
            https::ClientOptions {
                connect_timeout: Some(CONNECT_TIMEOUT),
                nodelay: true,
                server_name,
            },
        );
        Ok(Forwarder {
            client,
            secret,
            replica: replica.to_string(),
            peers,
        })
    }

    /// The replicas' secret, read again by [`RotatingSecret::watch`].
    pub fn secret(&self) -> &Arc<RotatingSecret> {
        &self.secret
    }

    /// Puts the secret in `headers`: the current one as the bearer token, and during a
    /// rotation's overlap the previous one beside it (for replicas that have not seen the
    /// new one yet).
    fn present_secret(&self, headers: &mut HeaderMap) -> std::result::Result<(), ()> {
        let (current, previous) = self.secret.offered();
        let bearer = HeaderValue::from_str(&format!("Bearer {current}")).map_err(|_| ())?;
        headers.insert(header::AUTHORIZATION, bearer);
        if let Some(previous) = previous {
            headers.insert(
                PREVIOUS_HEADER,
                HeaderValue::from_str(&previous).map_err(|_| ())?,
            );
        }
        Ok(())
    }

    /// Sends `request` to `owner` and hands back its answer, its body streamed.
    /// `caller` is who the client was here: named for the owner's audit, and the submitter
    /// its operations and their lookups are scoped to there. A watch (or a log
    /// follow: `ends_cleanly`) whose owner goes away in the middle ends cleanly, as a watch
    /// the API server ends, so that its client watches again (through the next owner).
    pub async fn send(
        &self,
        owner: &OwnerInfo,
        caller: Option<&Caller>,
        mut request: Request,
        ends_cleanly: bool,
    ) -> Result<Response, Status> {
        let path_and_query = request
            .uri()
            .path_and_query()
            .map_or("/", |p| p.as_str())
            .to_string();
        let uri = format!(
            "{}{INTERNAL_PREFIX}{path_and_query}",
            owner.address.trim_end_matches('/')
        );
        let unreachable = |why: String| {
            Status::unavailable(format!(
                "hub replica {} owns this account but cannot be reached at {} ({why}); \
                 retry: when a replica dies another takes its accounts within seconds",
                owner.replica, owner.address
            ))
        };
        if let Err(why) = self.peers.check(&owner.address) {
            tracing::warn!(owner = %owner.replica, address = %owner.address, %why, "owner address refused: nothing forwarded");
            return Err(Status::bad_gateway(format!(
                "hub replica {} owns this account, but the hub {why}",
                owner.replica
            )));
        }
        let uri: http::Uri = uri
            .parse()
            .map_err(|e| unreachable(format!("not a URL: {e}")))?;
        let upgrade = scale_agent_hub_net::headers::is_upgrade(request.headers())
            .then(|| hyper::upgrade::on(&mut request));
        // The proxy's hold on the token an upgrade was opened with (F17): revoking the
        // token ends the forwarded connection too.
        let lease = request.extensions().get::<Lease>().cloned();
        let (parts, body) = request.into_parts();
        let mut headers = forwarded_headers(&parts.headers, upgrade.is_some());
        self.present_secret(&mut headers)
            .map_err(|_| unreachable("the replica secret is not a header value".into()))?;
        if let Ok(replica) = HeaderValue::from_str(&self.replica) {
            headers.insert(FORWARDED_BY, replica);
        }
        if let Some(caller) = caller {
            if let Ok(name) = HeaderValue::from_str(&caller.name) {
                headers.insert(FORWARDED_FOR, name);
            }
            // Bytes, not a str: an OIDC name may be any UTF-8.
            let submitter = Submitter::of(caller).to_header();
            let value = HeaderValue::from_bytes(submitter.as_bytes()).map_err(|_| {
                Status::failure(
                    400,
                    "BadRequest",
                    format!(
                    "the caller's name {:?} holds a control character, which cannot be                      forwarded to hub replica {}, the account's owner",
                    caller.name, owner.replica
                ),
                )
            })?;
            headers.insert(FORWARDED_SUBMITTER, value);
        }
        let mut outbound = http::Request::new(body);
        *outbound.method_mut() = parts.method;
        *outbound.uri_mut() = uri;
        *outbound.headers_mut() = headers;
        let mut response = self
            .client
            .request(outbound)
            .await
            .map_err(|e| unreachable(Chain(&e).to_string()))?;
        tracing::debug!(owner = %owner.replica, status = response.status().as_u16(), "request forwarded to the account's owner");
        if let Some(on_client) = upgrade
            && response.status() == http::StatusCode::SWITCHING_PROTOCOLS
        {
            let on_owner = hyper::upgrade::on(&mut response);
            tokio::spawn(async move {
                let (Ok(client), Ok(owner)) = tokio::join!(on_client, on_owner) else {
                    tracing::debug!("a forwarded upgrade did not complete");
                    return;
                };
                let mut client = TokioIo::new(client);
                let mut owner = TokioIo::new(owner);
                tokio::select! {
                    _ = tokio::io::copy_bidirectional(&mut client, &mut owner) => {}
                    () = credential_sessions::revoked(lease) => {
                        tracing::info!("the token of a forwarded upgraded connection was revoked; the connection ends");
                    }
                }
            });
        }
        let (mut parts, body) = response.into_parts();
        strip_hop_by_hop(&mut parts.headers, parts.status);
        let body = if ends_cleanly {
            use futures::StreamExt as _;
            use http_body_util::BodyExt as _;
            let replica = owner.replica.clone();
            Body::from_stream(body.into_data_stream().scan((), move |(), chunk| {
                std::future::ready(match chunk {
                    Ok(bytes) => Some(Ok::<_, std::io::Error>(bytes)),
                    Err(error) => {
                        tracing::info!(owner = %replica, %error, "the owner of a forwarded watch went away; the watch ends");
                        None
                    }
                })
            }))
        } else {
            Body::new(body)
        };
        Ok(Response::from_parts(parts, body))
    }

    /// GETs `path` of this replica's own view from `replica` at `address` (under
    /// `/internal`), as JSON, within `timeout`. The error says why it cannot be reached.
    pub async fn get_json(
        &self,
        replica: &str,
        address: &str,
        path: &str,
        timeout: Duration,
    ) -> std::result::Result<serde_json::Value, String> {
        use http_body_util::BodyExt as _;
        let unreachable =
            |why: String| format!("hub replica {replica} cannot be asked at {address}: {why}");
        if let Err(why) = self.peers.check(address) {
            tracing::warn!(%replica, %address, %why, "replica address refused: not asked");
            return Err(format!("hub replica {replica}: {why}"));
        }
        let uri: http::Uri = format!("{}{INTERNAL_PREFIX}{path}", address.trim_end_matches('/'))
            .parse()
            .map_err(|e| unreachable(format!("not a URL: {e}")))?;
        let mut request = http::Request::get(uri)
            .body(Body::empty())
            .map_err(|e| unreachable(e.to_string()))?;
        self.present_secret(request.headers_mut())
            .map_err(|_| unreachable("the replica secret is not a header value".into()))?;
        if let Ok(id) = HeaderValue::from_str(&self.replica) {
            request.headers_mut().insert(FORWARDED_BY, id);
        }
        let ask = async {
            let response = self
                .client
                .request(request)
                .await
                .map_err(|e| unreachable(Chain(&e).to_string()))?;
            let code = response.status();
            let body = response
                .into_body()
                .collect()
                .await
                .map_err(|e| unreachable(format!("its answer broke off: {e}")))?
                .to_bytes();
            if !code.is_success() {
                return Err(unreachable(format!(
                    "it answered {code}: {}",
                    String::from_utf8_lossy(&body).trim()
                )));
            }
            serde_json::from_slice(&body)
                .map_err(|e| unreachable(format!("its answer is not JSON: {e}")))
        };
        tokio::time::timeout(timeout, ask)
            .await
            .unwrap_or_else(|_| Err(unreachable(format!("no answer within {timeout:?}"))))
    }
}

/// The client's headers as the owner gets them: its credentials stay here (the owner
/// trusts this replica's check), and hop-by-hop headers belong to one connection (except
/// the upgrade asked for).
fn forwarded_headers(headers: &HeaderMap, upgrade: bool) -> HeaderMap {
    let mut out = headers.clone();
    for name in [header::AUTHORIZATION, header::COOKIE, header::HOST] {
        out.remove(name);
    }
    // A client's own channel headers never cross: only this replica says who called.
    out.remove(FORWARDED_BY);
    out.remove(FORWARDED_FOR);
    out.remove(PREVIOUS_HEADER);
    out.remove(FORWARDED_SUBMITTER);
    strip_hop_by_hop(&mut out, http::StatusCode::OK);
    if upgrade {
        out.insert(header::CONNECTION, HeaderValue::from_static("Upgrade"));
        for value in headers.get_all(header::UPGRADE) {
            out.append(header::UPGRADE, value.clone());
        }
    }
    out
}

/// Removes hop-by-hop headers, keeping those of a 101 answer (the upgrade's).
fn strip_hop_by_hop(headers: &mut HeaderMap, status: http::StatusCode) {
    if status == http::StatusCode::SWITCHING_PROTOCOLS {
        return;
    }
    for name in scale_agent_proto::tunnel::HOP_BY_HOP {
        headers.remove(*name);
    }
}

impl Replicas {
    /// The owner of `account` when it is another replica and `request` may go there: not a
    /// request forwarded already, and not an account this replica owns (in `live`'s
    /// registry). `None`: serve it here.
    pub async fn owner_elsewhere(
        &self,
        live: &Live,
        account: &str,
        headers_of: &http::Extensions,
    ) -> Option<OwnerInfo> {
        self.forwarder.as_ref()?;
        if headers_of.get::<Forwarded>().is_some() || live.registry_read().owns(account) {
            return None;
        }
        match self
            .owner_lookups
            .owner(self.ownership.as_ref(), account)
            .await
        {
            Ok(Some(owner)) if owner.replica != self.id() => Some(owner),
            Ok(_) => None,
            Err(e) => {
                tracing::warn!(error = %Chain(&e), %account, "cannot look up the account's owner; serving the request here");
                None
            }
        }
    }

    /// Sends `request` for `account` to its `owner` (as [`Forwarder::send`]); when the owner
    /// cannot be reached, or answers 503 (it no longer streams the account), the owner kept
    /// for the account is forgotten, so the next request looks it up again.
    pub async fn forward(
        &self,
        owner: &OwnerInfo,
        account: &str,
        caller: Option<&Caller>,
        request: Request,
        ends_cleanly: bool,
    ) -> Result<Response, Status> {
        let Some(forwarder) = &self.forwarder else {
            return Err(Status::unavailable(
                "this hub replica has no channel to the others (no --replica-secret-file)",
            ));
        };
        let answer = forwarder.send(owner, caller, request, ends_cleanly).await;
        if answer.as_ref().map_or(true, |r| {
            r.status() == http::StatusCode::SERVICE_UNAVAILABLE
        }) {
            self.owner_lookups.forget(account);
        }
        answer
    }
}

/// Admits requests to the internal routes: only with the replicas' secret.
pub async fn internal_auth(
    State(replicas): State<Arc<Replicas>>,
    mut request: Request,
    next: Next,
) -> Response {
    let headers = request.headers();
    let presented = headers
        .get(header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(scale_agent_hub_auth::tokens::bearer)
        .into_iter()
        .chain(headers.get(PREVIOUS_HEADER).and_then(|v| v.to_str().ok()));
    let admitted = replicas
        .forwarder
        .as_ref()
        .is_some_and(|forwarder| forwarder.secret.accepts(presented));
    if !admitted {
        return Status::unauthorized(
            "the internal routes of the hub are for its other replicas, with the secret of \
             --replica-secret-file",
        )
        .into_response();
    }
    let header = |headers: &HeaderMap, name: &str| {
        headers
            .get(name)
            .and_then(|v| v.to_str().ok())
            .unwrap_or_default()
            .to_string()
    };
    let from = header(request.headers(), FORWARDED_BY);
    let caller = header(request.headers(), FORWARDED_FOR);
    let submitter = request
        .headers()
        .get(FORWARDED_SUBMITTER)
        .and_then(|v| std::str::from_utf8(v.as_bytes()).ok())
        .and_then(Submitter::from_header);
    // The channel's own headers stop here: the agent replays what the client sent.
    for name in [
        FORWARDED_BY,
        FORWARDED_FOR,
        PREVIOUS_HEADER,
        FORWARDED_SUBMITTER,
    ] {
        request.headers_mut().remove(name);
    }
    if let Some(submitter) = submitter {
        request.extensions_mut().insert(submitter);
    }
    request.extensions_mut().insert(Caller {
        name: if caller.is_empty() {
            format!("replica {from}")
        } else {
            format!("{caller} (through replica {from})")
        },
        role: Role::Operator,
        accounts: Vec::new(),
        source: Source::Hub,
    });
    request.extensions_mut().insert(Forwarded { from });
    next.run(request).await
}

/// Serves a route of one account (its `{name}`) on the account's owner: forwarded there
/// when another replica owns it, after this replica authenticated the caller. Its state: the
/// replicas, and the live state that says which accounts this replica owns.
pub async fn to_owner(
    State((replicas, live)): State<(Arc<Replicas>, Arc<Live>)>,
    axum::extract::Path(params): axum::extract::Path<std::collections::HashMap<String, String>>,
    request: Request,
    next: Next,
) -> Response {
    let owner = match params.get("name") {
        Some(account) => {
            replicas
                .owner_elsewhere(&live, account, request.extensions())
                .await
        }
        None => None,
    };
    match (owner, params.get("name"), &replicas.forwarder) {
        (Some(owner), Some(account), Some(_)) => {
            let caller = request.extensions().get::<Caller>().cloned();
            replicas
                .forward(&owner, account, caller.as_ref(), request, false)
                .await
                .unwrap_or_else(IntoResponse::into_response)
        }
        _ => next.run(request).await,
    }
}
