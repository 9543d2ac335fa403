//! `scale-agent-hub-state`: the hub's live state of the agents' streams. The registry of
//! accounts, clusters and sessions with each account's lifecycle state; the protocol state
//! of one stream (`session`, no I/O); the tunnelled HTTP exchanges; the messages the rest of
//! the hub sends to a running stream; the book of dynamic accounts. Layer L2: depends only
//! on the model and cache crates (and on no crate of the hub above it).

pub mod dynamic_accounts;
mod live;
pub mod registry;
pub mod session;
pub mod tunnel;

pub use live::{Control, SessionHandle, account_state_message};
