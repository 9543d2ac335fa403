//! Which replica registers accounts in Clouddriver when several share PostgreSQL: the one
//! holding the registrar's lock ([`crate::owners::singleton`]). Each registrar removes what
//! it registered and no longer wants, so two would remove each other's accounts.
//!
//! Every [`TRY_EVERY`] each replica tries the lock (the holder checks its connection). On
//! taking it, the replica hands the registrar every account of the store (not only those it
//! streams) and only then activates it; the registrar reads the ledger from the store, so
//! what the previous registrar sent is not sent again. On losing it (the connection broke),
//! the replica stops registering at once.

use std::sync::Arc;

use crate::{Hub, clouddriver::Registrar, owners::singleton::TRY_EVERY};

/// The duty's name: in the lock's key and in the name of the connection holding it.
pub(crate) const NAME: &str = "clouddriver-registrar";

/// Tries, takes, checks and loses the duty until the hub stops.
pub(crate) async fn run(hub: Arc<Hub>, registrar: Arc<Registrar>) {
    let mut shutdown = hub.shutdown.clone();
    let mut interval = tokio::time::interval(TRY_EVERY);
    interval.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut last_error: Option<String> = None;
    loop {
        tokio::select! {
            _ = interval.tick() => {}
            _ = shutdown.wait_for(|stopping| *stopping) => break,
        }
        let held = match hub.registrar_duty.hold().await {
            Ok(held) => {
                last_error = None;
                held
            }
            Err(e) => {
                let text = crate::error::Chain(&e).to_string();
                if last_error.as_ref() != Some(&text) {
                    tracing::warn!(error = %text, "cannot hold the Clouddriver registrar's lock; this replica does not register accounts until it can");
                }
                last_error = Some(text);
                false
            }
        };
        match (held, registrar.is_active()) {
            (true, false) => {
                // The accounts first: an active registrar with none would remove them all.
                hub.forget_registered_accounts();
                match hub.hand_accounts_to_registrar().await {
                    Ok(()) => {
                        registrar.set_active(true);
                        tracing::info!(
                            replica = %hub.replicas.id(),
                            "this replica registers the accounts in Clouddriver now"
                        );
                    }
                    Err(e) => {
                        tracing::warn!(error = %crate::error::Chain(&e), "took the Clouddriver registrar's lock but cannot read the accounts; giving it up");
                        hub.registrar_duty.release().await;
                    }
                }
            }
            (false, true) => {
                registrar.set_active(false);
                tracing::warn!(
                    replica = %hub.replicas.id(),
                    "this replica lost the Clouddriver registrar's lock and stopped registering"
                );
            }
            _ => {}
        }
    }
    registrar.set_active(false);
}
