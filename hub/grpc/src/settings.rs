//! What the gRPC service reads of the hub's configuration, collected once at start (the
//! hub's `start` builds it from its `Config`; the service never reads `Config`).

use std::time::Duration;

use scale_agent_hub_auth::{agent_renewal::RenewalPolicy, forwarded::ProxyTrust};
use scale_agent_hub_state::session::Limits;

/// The heartbeat periods the hub grants to a stream.
#[derive(Clone, Copy, Debug)]
pub struct HeartbeatBounds {
    /// For an agent that asks for none (`--heartbeat-period`).
    pub default: Duration,
    /// The shortest granted (`--min-heartbeat-period`).
    pub min: Duration,
    /// The longest granted (`--max-heartbeat-period`).
    pub max: Duration,
}

impl HeartbeatBounds {
    /// The heartbeat period of a stream whose agent asked for `requested_seconds` in Hello:
    /// the request within `min` and `max`, or `default` when it asked for none (0, or an
    /// agent from before the field).
    pub fn grant(&self, requested_seconds: u32) -> Duration {
        match requested_seconds {
            0 => self.default,
            secs => Duration::from_secs(u64::from(secs)).clamp(self.min, self.max),
        }
    }
}

/// The settings of the agents' streams and of the Enroll RPC.
#[derive(Clone, Debug)]
pub struct StreamSettings {
    pub heartbeat: HeartbeatBounds,
    /// Messages an agent may send ahead of the hub's Ack (`--max-unacked`; sent in Welcome).
    pub max_unacked: u32,
    /// What one stream may send and hold (`--max-object-bytes`, `--max-staged-bytes`,
    /// `--max-objects-per-account`, `--allow`), checked by the session protocol; the first
    /// and third are also sent in Welcome.
    pub limits: Limits,
    /// Lifetime of the certificates issued to agents, by enrolment or renewal
    /// (`--agent-cert-lifetime`).
    pub agent_cert_lifetime: Duration,
    /// How long renewals may extend one enrolment (`--agent-max-enrolment-age`).
    pub agent_max_enrolment_age: Duration,
    /// Behind a TLS-terminating proxy: who may forward an agent's certificate in a header,
    /// and how it is read. `None`: the certificate is the one the TLS connection presents.
    pub trusted_proxy: Option<ProxyTrust>,
}

impl StreamSettings {
    /// The lifetimes of the certificates issued by renewal.
    pub fn renewal_policy(&self) -> RenewalPolicy {
        RenewalPolicy {
            lifetime: self.agent_cert_lifetime,
            max_enrolment_age: self.agent_max_enrolment_age,
        }
    }

    /// The largest AgentMessage the hub decodes: an object of `--max-object-bytes` with room
    /// for its envelope. Agents that know it (Welcome.max_message_bytes) split operation
    /// results into parts below it.
    pub fn max_message_bytes(&self) -> usize {
        usize::try_from(self.limits.max_object_bytes)
            .unwrap_or(usize::MAX)
            .saturating_add(1024 * 1024)
    }

    /// Keepalive settings of the gRPC server (interval, timeout), derived from the default
    /// heartbeat period.
    pub fn keepalive(&self) -> (Duration, Duration) {
        let period = self.heartbeat.default;
        (period, period * 2)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_request_is_granted_within_the_bounds() {
        let secs = Duration::from_secs;
        let bounds = HeartbeatBounds {
            default: secs(10),
            min: secs(5),
            max: secs(60),
        };
        assert_eq!(bounds.grant(0), secs(10));
        assert_eq!(bounds.grant(1), secs(5));
        assert_eq!(bounds.grant(20), secs(20));
        assert_eq!(bounds.grant(3600), secs(60));
    }
}
