//! The one polling helper of the tests, the demo's harness and the bench, from
//! `scale-agent-testkit` (the hub's and the agent's tests use it too).

pub use scale_agent_testkit::wait::{
    EVERY, WAIT, eventually, until, until_within, wait_for, wait_for_within,
};
