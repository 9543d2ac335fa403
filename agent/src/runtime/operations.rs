//! The hub's operations: each runs on its account's executor, and its result goes back on
//! the stream it came on.

use scale_agent_proto::v1;
use tracing::Instrument as _;

use super::Runtime;
use crate::session::Session;

impl Runtime {
    /// Starts an operation; its result goes back on this stream when it finishes.
    pub(super) fn operate(&mut self, operation: v1::Operation, session: &mut Session) {
        let replica = self.options.replica_name();
        let executor = self
            .accounts
            .get(&operation.account)
            .map(|entry| entry.executor.clone());
        let tx = session.results_tx.clone();
        let executor = match executor {
            Some(Some(executor)) => executor,
            found => {
                let (code, reason, message) = if found.is_none() {
                    (
                        404,
                        "NotFound",
                        format!(
                            "this agent (replica {replica}) does not serve account {:?}",
                            operation.account
                        ),
                    )
                } else {
                    (
                        503,
                        "ServiceUnavailable",
                        format!(
                            "account {:?} is not ready on replica {replica}: its credentials are still loading",
                            operation.account
                        ),
                    )
                };
                let result =
                    crate::operations::refused(&operation, &replica, code, reason, message);
                session.operations.spawn(async move {
                    let _ = tx.send(result).await;
                });
                return;
            }
        };
        let span =
            tracing::info_span!("operation", account = %operation.account, id = %operation.id);
        span.in_scope(|| {
            tracing::info!(
                r#type = operation
                    .op
                    .as_ref()
                    .map(scale_agent_proto::v1::operation::Op::name)
                    .unwrap_or("none"),
                "operation received"
            );
        });
        let shared = self.shared.clone();
        session.operations.spawn(
            async move {
                let metrics = &shared.metrics;
                let kind = operation
                    .op
                    .as_ref()
                    .map(scale_agent_proto::v1::operation::Op::name)
                    .unwrap_or("none");
                let account = operation.account.clone();
                // Decremented on drop too: the task is aborted when the stream ends.
                struct Running<'a>(&'a prometheus_client::metrics::gauge::Gauge);
                impl Drop for Running<'_> {
                    fn drop(&mut self) {
                        self.0.dec();
                    }
                }
                metrics.operations_running.inc();
                let running = Running(&metrics.operations_running);
                let result = executor.execute(operation).await;
                drop(running);
                let outcome = match result.status.as_ref().map(|s| s.code) {
                    _ if result.ok => "succeeded",
                    Some(504) => "timedOut",
                    _ => "failed",
                };
                metrics
                    .operations
                    .get_or_create(&crate::metrics::OperationLabels {
                        account,
                        r#type: kind.into(),
                        outcome: outcome.into(),
                    })
                    .inc();
                let _ = tx.send(result).await;
            }
            .instrument(span),
        );
    }
}
