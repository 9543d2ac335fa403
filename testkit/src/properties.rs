//! The configuration of the hub's and the agent's property tests (feature `proptest`).

use proptest::test_runner::Config;

/// Cases per property: `PROPTEST_CASES` (proptest's own variable), else a CI-sized 64.
/// Failures are kept as regression tests in the test files, not in a side file.
pub fn config() -> Config {
    Config {
        cases: std::env::var("PROPTEST_CASES")
            .ok()
            .and_then(|n| n.parse().ok())
            .unwrap_or(64),
        failure_persistence: None,
        ..Config::default()
    }
}
