//! Refusals that reach the client whole (issue 28, "Refusals that clients cannot read").
//!
//! The hub refuses most requests before it reads their body: a missing or foreign token, a
//! role too small, an account it does not know. hyper then answers, and on HTTP/2 resets the
//! request's stream (`RST_STREAM`, `NO_ERROR`) because the client is still sending; RFC 9113
//! §8.1 allows it, but curl 7.88 (Debian 12) often reports error 92 and shows no answer at
//! all (9 of 20 tries of the README's own examples), and on HTTP/1.1 the connection closes
//! mid-request. [`read_refused_bodies`] makes a refusal wait for the rest of its request's
//! body first, within [`DRAIN_LIMIT_BYTES`] and [`DRAIN_DEADLINE`], discarding it: the
//! answer then arrives after the request is complete, as every client expects.
//!
//! Why drain after the handler and not before it: the handler decides, and most requests are
//! not refused; bodies that are read (streamed to an agent, parsed by a route) are untouched.
//! Only a body its handler dropped unread, on an answer of 400 or more, is drained. Past the
//! bounds the answer goes out anyway (the old behaviour): an unauthenticated client cannot
//! make the hub read more than a megabyte or wait more than a few seconds.

use std::{
    pin::Pin,
    sync::{Arc, Mutex},
    task::{Context, Poll},
    time::Duration,
};

use axum::{
    body::{Body, Bytes},
    extract::Request,
    middleware::Next,
    response::Response,
};
use http_body::{Body as _, Frame, SizeHint};

/// At most this much of a refused request's body is read (and discarded) before answering.
pub const DRAIN_LIMIT_BYTES: usize = 1024 * 1024;
/// At most this long is spent reading it.
pub const DRAIN_DEADLINE: Duration = Duration::from_secs(5);

/// Where a request body its handler dropped unread waits for [`read_refused_bodies`].
type Left = Arc<Mutex<Option<Body>>>;

/// A request body that, when dropped before its end, leaves what is left of it in a slot the
/// middleware can still read.
struct Tracked {
    inner: Option<Body>,
    left: Left,
}

impl http_body::Body for Tracked {
    type Data = Bytes;
    type Error = axum::Error;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, axum::Error>>> {
        match self.inner.as_mut() {
            Some(body) => Pin::new(body).poll_frame(cx),
            None => Poll::Ready(None),
        }
    }

    fn is_end_stream(&self) -> bool {
        self.inner.as_ref().is_none_or(|b| b.is_end_stream())
    }

    fn size_hint(&self) -> SizeHint {
        self.inner
            .as_ref()
            .map_or_else(|| SizeHint::with_exact(0), |b| b.size_hint())
    }
}

impl Drop for Tracked {
    fn drop(&mut self) {
        if let Some(body) = self.inner.take()
            && !body.is_end_stream()
        {
            *self.left.lock().unwrap_or_else(|e| e.into_inner()) = Some(body);
        }
    }
}

/// Middleware for the whole HTTP router: a refusal (status 400 or more) whose request body
/// the handler left unread answers only once that body has been read (and discarded), within
/// [`DRAIN_LIMIT_BYTES`] and [`DRAIN_DEADLINE`]. See the module docs for why.
pub async fn read_refused_bodies(request: Request, next: Next) -> Response {
    if request.body().is_end_stream() {
        return next.run(request).await;
    }
    let left: Left = Arc::new(Mutex::new(None));
    let request = request.map(|body| {
        Body::new(Tracked {
            inner: Some(body),
            left: left.clone(),
        })
    });
    let response = next.run(request).await;
    if response.status().as_u16() < 400 {
        return response;
    }
    let unread = left.lock().unwrap_or_else(|e| e.into_inner()).take();
    if let Some(body) = unread {
        drain(body, DRAIN_LIMIT_BYTES, DRAIN_DEADLINE).await;
    }
    response
}

/// Reads and discards `body` until its end, `limit` bytes, or `deadline`, whichever comes
/// first; returns whether it reached the end.
pub async fn drain(mut body: Body, limit: usize, deadline: Duration) -> bool {
    let read = async {
        let mut seen = 0usize;
        loop {
            match std::future::poll_fn(|cx| Pin::new(&mut body).poll_frame(cx)).await {
                None => return true,
                Some(Err(_)) => return false,
                Some(Ok(frame)) => {
                    seen = seen.saturating_add(frame.data_ref().map_or(0, |d| d.len()));
                    if seen > limit {
                        return false;
                    }
                }
            }
        }
    };
    let complete = tokio::time::timeout(deadline, read).await.unwrap_or(false);
    if !complete {
        tracing::debug!(
            limit,
            ?deadline,
            "answered a refusal before its request body ended (larger or slower than the bounds)"
        );
    }
    complete
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn drains_within_bounds_only() {
        assert!(drain(Body::from(vec![0u8; 1000]), 1000, DRAIN_DEADLINE).await);
        assert!(!drain(Body::from(vec![0u8; 1001]), 1000, DRAIN_DEADLINE).await);
        assert!(!drain(Body::new(Stalled), 1000, Duration::from_millis(50)).await);
    }

    /// A client that stopped sending.
    struct Stalled;

    impl http_body::Body for Stalled {
        type Data = Bytes;
        type Error = axum::Error;

        fn poll_frame(
            self: Pin<&mut Self>,
            _: &mut Context<'_>,
        ) -> Poll<Option<Result<Frame<Bytes>, axum::Error>>> {
            Poll::Pending
        }
    }
}
