//! Audit lines, both halves under one path: the REST API's operations
//! ([`scale_agent_hub_api::audit`]) and the Kubernetes API proxy's requests
//! ([`crate::proxy::audit`]: every write, reads as `--proxy-audit-reads` says). Both log under the tracing target [`TARGET`] (`audit`), so a
//! log pipeline routes them together.

pub use scale_agent_hub_api::audit::{OperationSubject, TARGET, operation, operation_object};

pub use crate::proxy::audit::{
    AuditReads, ProxyObject, ProxyRequest, is_proxy_write, proxy_object,
};

#[cfg(test)]
mod tests {
    #[test]
    fn both_halves_log_under_one_target() {
        assert_eq!(super::TARGET, crate::proxy::audit::TARGET);
    }
}
