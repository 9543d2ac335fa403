//! The proxy's caches as listeners of the live state ([`CacheEvents`]): the stream loop and
//! the ownership task tell [`Live`](scale_agent_hub_state::Live), which tells these.

use scale_agent_hub_state::CacheEvents;

use super::ProxyState;

/// The discovery documents and the reads from the cache, hearing of changes.
impl CacheEvents for ProxyState {
    fn cache_advanced(&self) {
        self.cached_reads.cache_advanced();
    }

    fn account_forgotten(&self, account: &str) {
        self.discovery.forget(account);
    }

    fn kinds_changed(&self, account: &str) {
        self.discovery
            .invalidate(account, std::time::Instant::now());
    }
}
