//! Long-running requests end when their token is revoked (issue 28, F17). A watch, a
//! followed log or an upgraded connection (exec, attach, port-forward) opened with a token
//! the hub issued takes a [`Lease`] on it before it is authenticated (so a revocation in
//! between is never missed: authentication then refuses it); the lease travels in the
//! request's extensions to whatever carries the connection's bytes (this replica's tunnel,
//! or the forwarding to the account's owner), and the response body is wrapped by
//! [`EndsOnRevocation`].
//!
//! A watch ends the way the API server ends one: its body simply ends, and the client (a
//! kubectl, an informer) starts a new request, which the revoked token no longer
//! authenticates (401).

use std::{
    future::Future,
    pin::Pin,
    task::{Context, Poll},
};

use axum::{
    body::Body,
    http::{HeaderMap, header},
};
use bytes::Bytes;
use http_body::{Frame, SizeHint};
use scale_agent_hub_auth::{
    AuthBook,
    credential_sessions::{Credential, Lease, revoked},
};

/// The lease of a long-running request on the hub-issued token it presents, if it presents
/// one this replica knows (OIDC ID tokens are not revocable here: they expire).
pub(crate) fn lease(auth: &AuthBook, headers: &HeaderMap) -> Option<Lease> {
    let token = headers
        .get(header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(scale_agent_hub_auth::tokens::bearer)?;
    let id = auth.tokens().verify(token).map(|r| r.id.clone())?;
    Some(auth.credential_sessions().open(Credential::Token(id)))
}

/// A response body that ends cleanly when its request's token is revoked.
pub(crate) struct EndsOnRevocation {
    body: Body,
    revoked: Pin<Box<dyn Future<Output = ()> + Send>>,
    ended: bool,
}

impl EndsOnRevocation {
    pub(crate) fn new(body: Body, lease: Lease) -> Self {
        EndsOnRevocation {
            body,
            revoked: Box::pin(revoked(Some(lease))),
            ended: false,
        }
    }
}

impl http_body::Body for EndsOnRevocation {
    type Data = Bytes;
    type Error = axum::Error;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, axum::Error>>> {
        let this = &mut *self;
        if this.ended {
            return Poll::Ready(None);
        }
        if this.revoked.as_mut().poll(cx).is_ready() {
            this.ended = true;
            tracing::info!("the token of a long-running request was revoked; its response ends");
            return Poll::Ready(None);
        }
        Pin::new(&mut this.body).poll_frame(cx)
    }

    fn is_end_stream(&self) -> bool {
        self.ended || self.body.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.body.size_hint()
    }
}
