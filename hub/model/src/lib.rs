//! `scale-agent-hub-model`: the bottom layer of the hub. The records and changes its store
//! persists ([`StoreOp`](store_op::StoreOp)), cached objects and their kinds, identities and
//! names, API roles, the time helpers, and the hub's error type. No I/O: every crate of the
//! hub above depends on this one, and it depends on none of them.

pub mod auth;
pub mod dynamic_accounts;
pub mod error;
pub mod identity;
pub mod names;
pub mod object;
pub mod packed;
pub mod records;
pub mod store_op;
pub mod time;

pub use error::{HubError, Result};
