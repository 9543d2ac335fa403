//! The hub's error type, defined at the bottom layer ([`scale_agent_hub_model::error`]).

pub use scale_agent_hub_model::error::*;
