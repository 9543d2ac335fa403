//! The ownership task of a replica that shares its accounts with others: acquires the
//! accounts whose agents stand by here, reloading each from the store before its first
//! standby streams it; releases those no agent serves here any more; and, when every
//! ownership was lost at once, ends the streams of the accounts it owned.

use std::{sync::Arc, time::Duration};

use super::{AccountSource, Claim};
use crate::{Control, Hub, store::StoreOp};

/// How often accounts owned elsewhere are tried again: the time a standby waits, at most,
/// after its owner died (the lock frees when the owner's database session ends).
pub const POLL: Duration = Duration::from_secs(1);

/// Runs until the hub shuts down (which releases everything once the store is flushed).
/// `source` loads an account taken over.
pub(crate) async fn run(hub: Arc<Hub>, source: Arc<dyn AccountSource>) {
    let mut losses = hub.ownership.losses();
    let mut shutdown = hub.shutdown.clone();
    loop {
        let to_acquire = hub.state().registry.to_acquire();
        for account in to_acquire {
            acquire(&hub, source.as_ref(), &account).await;
        }
        let to_release = hub.state().registry.to_release();
        for account in to_release {
            release(&hub, &account).await;
        }
        tokio::select! {
            () = hub.live.owners_wake().notified() => {}
            () = tokio::time::sleep(POLL) => {}
            changed = losses.changed() => {
                if changed.is_ok() {
                    lost_all(&hub);
                }
            }
            _ = shutdown.changed() => {
                if *shutdown.borrow() {
                    break;
                }
            }
        }
    }
}

/// Tries to take `account`; on success loads it and promotes its first standby here.
#[tracing::instrument(name = "acquire", skip_all, fields(%account))]
async fn acquire(hub: &Hub, source: &dyn AccountSource, account: &str) {
    let epoch = match hub.ownership.try_acquire(account).await {
        Ok(Claim::Acquired { epoch }) => epoch,
        Ok(Claim::HeldElsewhere(owner)) => {
            tracing::trace!(owner = ?owner.map(|o| o.replica), "account owned by another replica");
            return;
        }
        Err(e) => {
            tracing::warn!(error = %crate::error::Chain(&e), "cannot acquire the account; trying again");
            return;
        }
    };
    let snapshot = match source.load_account(account).await {
        Ok(snapshot) => snapshot,
        Err(e) => {
            tracing::warn!(error = %crate::error::Chain(&e), "cannot load the account taken over; releasing it");
            if let Err(e) = hub.ownership.release(account).await {
                tracing::warn!(error = %crate::error::Chain(&e), "cannot release the account");
            }
            return;
        }
    };
    let promotion = {
        let mut st = hub.state();
        if let Some(snapshot) = snapshot {
            st.cache
                .accounts
                .insert(account.to_string(), snapshot.cache);
        }
        let promotion = st.registry.acquired(account);
        // What the standbys' registrations here said, written now that this replica may
        // write the account (queued in this critical section, in order with the streams').
        let mut ops = Vec::new();
        if let Some(a) = st.registry.accounts.get(account) {
            ops.push(StoreOp::PutAccount {
                account: account.to_string(),
                record: a.record.clone(),
            });
        }
        if let Some(binding) = st.registry.bindings.get(account) {
            ops.push(StoreOp::PutBinding {
                account: account.to_string(),
                binding: binding.clone(),
            });
        }
        hub.commits.enqueue(ops);
        promotion
    };
    hub.live.account_forgotten(account);
    hub.live.cache_advanced();
    tracing::info!(
        epoch,
        promoted = promotion.is_some(),
        "account owned by this replica"
    );
    hub.deliver(promotion.into_iter().collect());
    hub.observe_states();
}

/// Gives `account` up once what was queued for it is stored, so that the next owner loads
/// it.
#[tracing::instrument(name = "release", skip_all, fields(%account))]
async fn release(hub: &Hub, account: &str) {
    hub.state().registry.released(account);
    let ticket = hub.commits.last_ticket();
    if let Err(failure) = hub.commits.committed_or_failing(ticket).await {
        tracing::warn!(%failure, "releasing an account whose last changes are not stored yet; its next owner resumes from older resume points");
    }
    match hub.ownership.release(account).await {
        Ok(()) => tracing::info!("account released: no agent of it is connected here"),
        Err(e) => {
            tracing::warn!(error = %crate::error::Chain(&e), "cannot release the account")
        }
    }
    hub.observe_states();
}

/// Every ownership was lost at once: the streams of those accounts end, so their agents
/// reconnect (to whichever replica owns the account next).
fn lost_all(hub: &Hub) {
    let sessions = hub.state().registry.lost_all();
    tracing::warn!(
        streams = sessions.len(),
        "this replica lost the ownership of its accounts (its connection to the ownership \
         store broke); ending their streams so their agents reconnect"
    );
    for session in sessions {
        hub.control(
            session,
            Control::Close(tonic::Status::unavailable(
                "this hub replica lost the ownership of an account this stream streamed; \
                 reconnect",
            )),
        );
    }
    hub.observe_states();
}
