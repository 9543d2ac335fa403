//! Budgets of work that runs at once, per account under an agent-wide ceiling:
//! - the list budget (`tasks.totalBudget`, `tasks.budgetPerAccount`): initial LISTs. A LIST
//!   holds its permits until its snapshot is sent, so the budget bounds the memory of lists
//!   in flight; watches are free;
//! - the operation budget (`tasks.operationsTotal`, `tasks.operationsPerAccount`): the hub's
//!   operations. Per account, so one account's slow operations (sixteen `delete wait:true`
//!   waiting on finalizers) never hold the slots another account's operations need; the
//!   agent-wide ceiling bounds what a burst over many accounts costs.

use std::sync::Arc;

use tokio::sync::{OwnedSemaphorePermit, Semaphore};

/// One account's view of a budget: its own limit plus the agent-wide one.
#[derive(Clone, Debug)]
pub struct Budget {
    total: Arc<Semaphore>,
    account: Arc<Semaphore>,
}

/// Both permits of one LIST or operation; dropping it returns them.
#[derive(Debug)]
pub struct Permit {
    _account: OwnedSemaphorePermit,
    _total: OwnedSemaphorePermit,
}

/// Permits for a configured limit: `0` means no limit, as in Armory's agent.
fn permits(limit: u32) -> usize {
    match limit {
        0 => Semaphore::MAX_PERMITS,
        limit => limit as usize,
    }
}

/// The agent-wide limit, shared by every account's [`Budget`]; `0` means no limit.
pub fn total(limit: u32) -> Arc<Semaphore> {
    Arc::new(Semaphore::new(permits(limit)))
}

impl Budget {
    /// An account's budget under the agent-wide `total`; `per_account` `0` means no limit.
    pub fn for_account(total: Arc<Semaphore>, per_account: u32) -> Self {
        Self {
            total,
            account: Arc::new(Semaphore::new(permits(per_account))),
        }
    }

    /// Waits for a permit of both limits; `None` once the budget is closed. The account's
    /// permit is taken first, so an account at its own limit holds no agent-wide permit
    /// while it waits.
    pub async fn acquire(&self) -> Option<Permit> {
        let account = self.account.clone().acquire_owned().await.ok()?;
        let total = self.total.clone().acquire_owned().await.ok()?;
        Some(Permit {
            _account: account,
            _total: total,
        })
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    async fn blocked(budget: &Budget) -> bool {
        tokio::time::timeout(Duration::from_millis(50), budget.acquire())
            .await
            .is_err()
    }

    #[tokio::test]
    async fn each_account_and_the_whole_agent_are_limited() {
        let total = total(3);
        let a = Budget::for_account(total.clone(), 2);
        let b = Budget::for_account(total.clone(), 2);

        let a1 = a.acquire().await.unwrap();
        let _a2 = a.acquire().await.unwrap();
        assert!(blocked(&a).await, "account a is at its own limit of 2");
        let b1 = b.acquire().await.unwrap();
        assert!(blocked(&b).await, "the agent is at its total of 3");

        drop(b1);
        let _b2 = b.acquire().await.unwrap();
        assert!(
            blocked(&a).await,
            "a freed total permit does not lift a's own limit"
        );
        drop(a1);
        let _a3 = a.acquire().await.unwrap();
    }

    #[tokio::test]
    async fn an_account_at_its_limit_does_not_starve_the_others() {
        let total = total(2);
        let a = Budget::for_account(total.clone(), 1);
        let b = Budget::for_account(total.clone(), 1);
        let _a1 = a.acquire().await.unwrap();
        // A second LIST of a waits on a's own limit without taking a total permit...
        let waiting = tokio::spawn({
            let a = a.clone();
            async move { a.acquire().await.is_some() }
        });
        tokio::time::sleep(Duration::from_millis(20)).await;
        // ...so b still gets the agent's second permit.
        assert!(!blocked(&b).await);
        waiting.abort();
    }

    #[tokio::test]
    async fn zero_limits_mean_no_limit_as_in_armory() {
        assert_eq!(total(0).available_permits(), Semaphore::MAX_PERMITS);
        let unlimited = Budget::for_account(total(0), 0);
        let mut held = Vec::new();
        for _ in 0..1000 {
            held.push(unlimited.acquire().await.unwrap());
        }
        assert!(!blocked(&unlimited).await, "no limit at all");
        let budget = Budget::for_account(total(5), 0);
        assert_eq!(budget.account.available_permits(), Semaphore::MAX_PERMITS);
        assert_eq!(total(3).available_permits(), 3);
    }
}
