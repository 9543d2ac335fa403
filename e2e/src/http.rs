//! The one HTTP client of the tests, the demo and the bench: plain HTTP/1 on loopback (the
//! agent's admin port, etcd's JSON gateway, a plaintext hub) and HTTPS to the hub's TLS
//! listener with a given CA. It lives in `scale-agent-testkit` (the hub's and the agent's
//! tests use it too); its [`Error`](scale_agent_testkit::http::Error) becomes this crate's
//! [`Error::Http`](crate::Error::Http).

pub use scale_agent_testkit::http::{
    Call, GET_TIMEOUT, Response, get, get_json, post_json, request,
};
