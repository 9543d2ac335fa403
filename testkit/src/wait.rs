//! The one polling helper of the tests, the demo's harness and the bench: ask again every
//! so often until the answer is there, and fail with what was awaited (and the last error,
//! if the check kept failing) when it never comes.
//!
//! [`wait_for`] and [`until`] (and their `_within` forms) return an error, and the futures
//! they return are `Send` when the checks' are (a task may spawn them). [`eventually`]
//! panics instead, and takes an async closure that may borrow the test's state mutably (a
//! fake agent reading its stream, say).

use std::{future::Future, time::Duration};

use tokio::time::Instant;

/// How long [`wait_for`] waits: generous, because two cores are shared by many tests.
pub const WAIT: Duration = Duration::from_secs(90);
/// How often [`wait_for`] asks.
pub const EVERY: Duration = Duration::from_millis(250);

/// Polls `check` every [`EVERY`] until it returns `Some`, failing after [`WAIT`] naming
/// `what` (see [`wait_for_within`]).
pub async fn wait_for<T, F, Fut>(what: &str, check: F) -> anyhow::Result<T>
where
    F: FnMut() -> Fut,
    Fut: Future<Output = anyhow::Result<Option<T>>>,
{
    wait_for_within(what, WAIT, EVERY, check).await
}

/// Polls `check` every `every` until it returns `Some`. An error from `check` is retried
/// like `None` (a server still starting refuses connections); after `timeout` it fails
/// naming `what` and the last error seen, so a check that can never succeed says why.
pub async fn wait_for_within<T, F, Fut>(
    what: &str,
    timeout: Duration,
    every: Duration,
    mut check: F,
) -> anyhow::Result<T>
where
    F: FnMut() -> Fut,
    Fut: Future<Output = anyhow::Result<Option<T>>>,
{
    let deadline = Instant::now() + timeout;
    let mut last_error = None;
    loop {
        match check().await {
            Ok(Some(value)) => return Ok(value),
            Ok(None) => {}
            Err(error) => last_error = Some(error),
        }
        if Instant::now() >= deadline {
            anyhow::bail!(
                "timed out after {timeout:?} waiting for {what}{}",
                last_error
                    .map(|e| format!(" (last error: {e:#})"))
                    .unwrap_or_default()
            );
        }
        tokio::time::sleep(every).await;
    }
}

/// [`wait_for`] with a yes/no check: polls `check` every [`EVERY`] until it returns `true`,
/// failing after [`WAIT`] naming `what` and the last error.
pub async fn until<F, Fut>(what: &str, check: F) -> anyhow::Result<()>
where
    F: FnMut() -> Fut,
    Fut: Future<Output = anyhow::Result<bool>>,
{
    until_within(what, WAIT, EVERY, check).await
}

/// [`until`] every `every`, failing after `timeout`.
pub async fn until_within<F, Fut>(
    what: &str,
    timeout: Duration,
    every: Duration,
    mut check: F,
) -> anyhow::Result<()>
where
    F: FnMut() -> Fut,
    Fut: Future<Output = anyhow::Result<bool>>,
{
    wait_for_within(what, timeout, every, || {
        let answer = check();
        async move { Ok(answer.await?.then_some(())) }
    })
    .await
}

/// Polls `check` every `every` until it holds; panics after `timeout` naming `what`. The
/// check is an async closure that may borrow what the test holds, mutably too.
pub async fn eventually(
    what: &str,
    timeout: Duration,
    every: Duration,
    mut check: impl AsyncFnMut() -> bool,
) {
    let deadline = Instant::now() + timeout;
    while !check().await {
        assert!(
            Instant::now() < deadline,
            "timed out after {timeout:?} waiting for {what}"
        );
        tokio::time::sleep(every).await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn returns_the_first_answer_and_retries_errors() {
        let mut calls = 0;
        let found = wait_for_within(
            "the third call",
            Duration::from_secs(5),
            Duration::from_millis(1),
            || {
                calls += 1;
                let n = calls;
                async move {
                    match n {
                        1 => anyhow::bail!("not up yet"),
                        2 => Ok(None),
                        _ => Ok(Some(n)),
                    }
                }
            },
        )
        .await
        .unwrap();
        assert_eq!(found, 3);
    }

    #[tokio::test]
    async fn a_check_that_never_holds_fails_with_what_and_the_last_error() {
        let error = wait_for_within(
            "the impossible",
            Duration::from_millis(30),
            Duration::from_millis(5),
            || async { Err::<Option<()>, _>(anyhow::anyhow!("403 forbidden")) },
        )
        .await
        .unwrap_err()
        .to_string();
        assert!(
            error.contains("waiting for the impossible") && error.contains("403 forbidden"),
            "{error}"
        );
        let error = wait_for_within(
            "nothing",
            Duration::from_millis(30),
            Duration::from_millis(5),
            || async { Ok::<Option<()>, anyhow::Error>(None) },
        )
        .await
        .unwrap_err()
        .to_string();
        assert!(!error.contains("last error"), "{error}");
    }

    #[tokio::test]
    async fn until_waits_for_true_and_names_what_it_waited_for() {
        let mut calls = 0;
        until_within(
            "the second call",
            Duration::from_secs(5),
            Duration::from_millis(1),
            || {
                calls += 1;
                let n = calls;
                async move { Ok(n >= 2) }
            },
        )
        .await
        .unwrap();
        assert_eq!(calls, 2);
        let error = until_within(
            "never",
            Duration::from_millis(30),
            Duration::from_millis(5),
            || async { Ok(false) },
        )
        .await
        .unwrap_err()
        .to_string();
        assert!(error.contains("waiting for never"), "{error}");
    }

    #[tokio::test]
    async fn eventually_lets_the_check_change_the_tests_state() {
        let mut seen = Vec::new();
        eventually(
            "three calls",
            Duration::from_secs(5),
            Duration::from_millis(1),
            async || {
                seen.push(seen.len());
                seen.len() == 3
            },
        )
        .await;
        assert_eq!(seen, [0, 1, 2]);
    }

    #[tokio::test]
    #[should_panic(expected = "waiting for never")]
    async fn eventually_panics_naming_what_it_waited_for() {
        eventually(
            "never",
            Duration::from_millis(30),
            Duration::from_millis(5),
            async || false,
        )
        .await;
    }
}
