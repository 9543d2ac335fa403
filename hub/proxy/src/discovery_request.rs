//! Discovery, version and OpenAPI requests ([`discovery::is_discovery`]): answered from the
//! account's documents when they are fresh, revalidated with the API server's ETag when they
//! are not, fetched through an agent and kept when missing, and the last one served while no
//! agent is connected.

use std::time::Instant;

use axum::{
    body::Body,
    extract::Request,
    http::{HeaderValue, Method, StatusCode, header},
    response::Response,
};
use bytes::Bytes;
use futures::StreamExt as _;

use super::{
    CACHE_HEADER, Proxy, Served, discovery,
    forward::{Exchange, forward},
    status::Status,
};

/// A discovery, version or OpenAPI request: from the cache when it can, else through the
/// tunnel, keeping the answer.
pub(crate) async fn discovery_request(
    proxy: &Proxy,
    account: &str,
    path_and_query: &str,
    request: Request,
) -> Result<(Response, Served), Status> {
    let key = discovery::Key::new(path_and_query, request.headers());
    let client_etag = request
        .headers()
        .get(header::IF_NONE_MATCH)
        .and_then(|v| v.to_str().ok())
        .map(str::to_string);
    let mut headers = request.headers().clone();
    let cached = match proxy.state.discovery.lookup(account, &key, Instant::now()) {
        discovery::Lookup::Fresh(document) => {
            return Ok((
                document_response(&document, client_etag.as_deref(), "hit"),
                Served::Cache,
            ));
        }
        discovery::Lookup::Revalidate(document) => {
            if let Some(etag) = document
                .etag
                .as_deref()
                .and_then(|e| HeaderValue::from_str(e).ok())
            {
                headers.insert(header::IF_NONE_MATCH, etag);
            }
            Some(document)
        }
        discovery::Lookup::Miss => {
            // The client's own If-None-Match would turn our fetch into a 304 we cannot keep.
            headers.remove(header::IF_NONE_MATCH);
            None
        }
    };
    let response = match forward(
        proxy,
        account,
        &Method::GET,
        path_and_query,
        &headers,
        None,
        Exchange::default(),
    )
    .await
    {
        Ok(response) => response,
        Err(status) if status.code() == 503 => {
            // No agent: the last document the cluster gave still describes its kinds best,
            // and with it kubectl gets as far as the request itself, whose error says why.
            return match proxy.state.discovery.last_known(account, &key) {
                Some(document) => Ok((
                    document_response(&document, client_etag.as_deref(), "stale"),
                    Served::Cache,
                )),
                None => Err(status),
            };
        }
        Err(status) => return Err(status),
    };
    if response.status() == StatusCode::NOT_MODIFIED
        && let Some(document) = cached
    {
        proxy
            .state
            .discovery
            .revalidated(account, &key, Instant::now());
        return Ok((
            document_response(&document, client_etag.as_deref(), "revalidated"),
            Served::Tunnel,
        ));
    }
    if response.status() != StatusCode::OK {
        return Ok((response, Served::Tunnel));
    }
    let (parts, body) = response.into_parts();
    let mut chunks = Vec::new();
    let mut size = 0usize;
    let mut stream = body.into_data_stream();
    while let Some(chunk) = stream.next().await {
        let chunk = chunk.map_err(|e| {
            Status::bad_gateway(format!(
                "the agent of account {account:?} failed in the middle of {path_and_query}: {e}"
            ))
        })?;
        size += chunk.len();
        chunks.push(chunk);
        if size > discovery::MAX_ENTRY_BYTES {
            // Too big to keep: hand on what arrived and the rest as it comes.
            let head = futures::stream::iter(chunks.into_iter().map(Ok::<_, axum::Error>));
            let body = Body::from_stream(head.chain(stream));
            return Ok((Response::from_parts(parts, body), Served::Tunnel));
        }
    }
    let mut body = Vec::with_capacity(size);
    for chunk in &chunks {
        body.extend_from_slice(chunk);
    }
    let document = discovery::Document {
        headers: parts
            .headers
            .iter()
            .filter(|(name, _)| discovery::KEPT_HEADERS.contains(&name.as_str()))
            .map(|(name, value)| (name.as_str().to_string(), value.as_bytes().to_vec()))
            .collect(),
        etag: parts
            .headers
            .get(header::ETAG)
            .and_then(|v| v.to_str().ok())
            .map(str::to_string),
        body: Bytes::from(body),
    };
    proxy
        .state
        .discovery
        .store(account, key, document.clone(), Instant::now());
    Ok((
        document_response(&document, client_etag.as_deref(), "miss"),
        Served::Tunnel,
    ))
}

fn document_response(
    document: &discovery::Document,
    client_etag: Option<&str>,
    cache: &'static str,
) -> Response {
    let not_modified = client_etag.is_some_and(|sent| {
        document
            .etag
            .as_deref()
            .is_some_and(|etag| sent.split(',').any(|e| e.trim() == etag))
    });
    let mut response = if not_modified {
        let mut r = Response::new(Body::empty());
        *r.status_mut() = StatusCode::NOT_MODIFIED;
        r
    } else {
        Response::new(Body::from(document.body.clone()))
    };
    for (name, value) in &document.headers {
        if not_modified && name != "etag" && name != "cache-control" {
            continue;
        }
        if let (Ok(name), Ok(value)) = (
            header::HeaderName::from_bytes(name.as_bytes()),
            HeaderValue::from_bytes(value),
        ) {
            response.headers_mut().append(name, value);
        }
    }
    response
        .headers_mut()
        .insert(CACHE_HEADER, HeaderValue::from_static(cache));
    response
}
