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

    /// The gRPC server's keepalive (interval, timeout): see [`StreamSettings::keepalive`].
    pub fn keepalive(&self) -> (Duration, Duration) {
        (
            self.default.min(KEEPALIVE_INTERVAL),
            (self.default * 2).min(KEEPALIVE_TIMEOUT),
        )
    }
}

/// The settings of the agents' streams and of the Enroll RPC.
#[derive(Clone, Debug)]
pub struct StreamSettings {
    pub heartbeat: HeartbeatBounds,
    /// Messages an agent may send ahead of the hub's Ack (`--max-unacked`; sent in Welcome).
    pub max_unacked: u32,
    /// Most streams one agent identity may have open at once (`--max-streams-per-identity`;
    /// 0: no limit).
    pub max_streams_per_identity: u64,
    /// What one stream may send and hold (`--max-object-bytes`, `--max-staged-bytes` with
    /// the identity's other streams,
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

/// The longest an agent's connection stays without a byte before the hub PINGs it.
pub const KEEPALIVE_INTERVAL: Duration = Duration::from_secs(5);
/// The longest the hub waits for the agent's answer to a PING before closing the connection.
pub const KEEPALIVE_TIMEOUT: Duration = Duration::from_secs(10);

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

    /// Keepalive settings of the gRPC server (interval, timeout): an HTTP/2 PING after
    /// [`KEEPALIVE_INTERVAL`] without a byte from the agent (or the default heartbeat period
    /// when shorter), unanswered after [`KEEPALIVE_TIMEOUT`] (or two periods), closes the
    /// connection. A PING is answered by the agent's transport whatever its load, so this
    /// bounds how long a silent partition between this replica and its agents keeps their
    /// streams, and their accounts, here: at most the two, well under the two heartbeat
    /// periods of silence that end a stream otherwise (30 s by default).
    pub fn keepalive(&self) -> (Duration, Duration) {
        self.heartbeat.keepalive()
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

    #[test]
    fn keepalive_is_bounded_whatever_the_heartbeat_period() {
        let secs = Duration::from_secs;
        let bounds = |default| HeartbeatBounds {
            default,
            min: secs(1),
            max: secs(300),
        };
        assert_eq!(bounds(secs(15)).keepalive(), (secs(5), secs(10)));
        assert_eq!(bounds(secs(1)).keepalive(), (secs(1), secs(2)));
        assert_eq!(bounds(secs(300)).keepalive(), (secs(5), secs(10)));
    }
}
