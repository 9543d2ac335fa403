//! Reading Prometheus/OpenMetrics text, as the tests and the bench read `/metrics`, from
//! `scale-agent-testkit`.

pub use scale_agent_testkit::metrics::metric_sum;
