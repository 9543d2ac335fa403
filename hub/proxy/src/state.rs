//! [`ProxyState`], what the Kubernetes API proxy keeps between requests: its open exchanges,
//! the discovery documents and the cached reads' snapshots and awaited writes.

use std::sync::{Arc, atomic::AtomicU64};

use scale_agent_hub_state::tunnel::Tunnels;

use super::{cached::CachedReads, discovery::DiscoveryCache};

/// The proxy's own state. The live state tells it of changes through its
/// [`CacheEvents`](scale_agent_hub_state::CacheEvents) ([`super::events`]).
#[derive(Default)]
pub struct ProxyState {
    /// Open exchanges of the Kubernetes API proxy. The agents' streams hold this too: they
    /// hand each exchange its agent's frames and end them when the stream ends.
    pub tunnels: Arc<Tunnels>,
    /// The per-account discovery and OpenAPI documents.
    pub discovery: DiscoveryCache,
    /// The reads from the cache: continue-token snapshots, writes awaited.
    pub cached_reads: CachedReads,
    /// Reads seen, for `--proxy-audit-reads sample:N`.
    pub audited_reads: AtomicU64,
}
