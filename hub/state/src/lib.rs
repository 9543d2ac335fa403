//! `scale-agent-hub-state`: the hub's live state of the agents' streams, behind one handle,
//! [`Live`]. The registry of accounts, clusters and sessions with each account's lifecycle
//! state; the protocol state of one stream (`session`, no I/O); the tunnelled HTTP
//! exchanges; the messages the rest of the hub sends to a running stream, and `dispatch`,
//! which picks a replica and queues work on its stream under the registry guard; the book of
//! dynamic accounts; the metrics of all this ([`StreamMetrics`]).
//!
//! Layer L2: depends only on the model and cache crates, and on no crate of the hub above
//! it. What it needs from above is passed in: the ownership task's wake-up is a `Notify`
//! [`Live`] owns, whether one replica owns everything is a flag given at start-up, and the
//! proxy's caches hear of changes through the [`CacheEvents`] they implement.

pub mod dispatch;
pub mod dynamic_accounts;
mod hearing;
pub mod identity_use;
mod live;
pub mod metrics;
pub mod registry;
pub mod session;
pub mod tunnel;

pub use hearing::Hearing;
pub use live::{CacheEvents, Control, Live, SessionHandle, account_state_message};
pub use metrics::StreamMetrics;
