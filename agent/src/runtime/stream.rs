//! One stream to the hub, from connecting to its end: the handshake, the loop, and
//! dispatching what the hub sends.

use std::time::Duration;

use futures::StreamExt;
use scale_agent_proto::v1::{
    self, HubMessage, agent_hub_client::AgentHubClient, agent_message, hub_message,
};
use tokio::{sync::mpsc, time::Instant};

use super::{
    End, Inputs, MAX_HUB_MESSAGE_BYTES, Runtime,
    renewal::{renewal_due, sleep_until_renewal},
    stopped,
};
use crate::{
    callers::Acting,
    enrolment::{self, CertificateFiles},
    error::{Error, Result},
    hub_conn::{WELCOME_TIMEOUT, await_welcome, connect},
    session::Session,
    tunnel::Route,
    watch::Outbound,
};

/// Used when the hub's Welcome gives no heartbeat period (a hub that never does so is
/// broken; this keeps the stream alive anyway).
const FALLBACK_HEARTBEAT_SECONDS: u32 = 15;

/// The heartbeat period of a stream: the one the hub granted in Welcome (which it chose
/// within its bounds from `requested`, the agent's `keepAliveHeartbeatSeconds`), else what
/// the agent asked for, else 15 s.
fn granted_period(requested: u32, granted: u32) -> u32 {
    match (granted, requested) {
        (0, 0) => FALLBACK_HEARTBEAT_SECONDS,
        (0, requested) => requested,
        (granted, _) => granted,
    }
}

/// What the stream loop needs once the handshake is done.
struct Open {
    session: Session,
    inbound: tonic::Streaming<HubMessage>,
    /// The heartbeat period agreed in Welcome.
    period: Duration,
    events: mpsc::Receiver<Outbound>,
    results: mpsc::Receiver<v1::OperationResult>,
    /// Enrolled agents: their certificate files, and when to renew the certificate.
    renew: Option<(CertificateFiles, Instant)>,
}

impl Runtime {
    /// One stream, from connecting to its end. Its span names the hub and this replica, and
    /// the identity the hub knows it by once welcomed; the accounts' streamers and the
    /// operations started on the stream log inside it.
    #[tracing::instrument(
        name = "hub_stream",
        skip_all,
        fields(hub = %self.config.clouddriver.grpc, replica = %self.options.replica_name(), identity = tracing::field::Empty)
    )]
    pub(super) async fn session(&mut self, inputs: &mut Inputs) -> End {
        match self.open(inputs).await {
            Ok(open) => self.stream(open, inputs).await,
            Err(end) => end,
        }
    }

    /// The handshake: connects, sends Hello, waits for Welcome, then unregisters the
    /// accounts removed while disconnected and registers every prepared account. The
    /// error is how the stream ended (shut down, or failed before or after Welcome).
    async fn open(&mut self, inputs: &mut Inputs) -> std::result::Result<Open, End> {
        let failed = |welcomed: bool| move |error: Error| End::Failed { welcomed, error };
        let hub = self.config.clouddriver.clone();
        let certificate_files = CertificateFiles::from_config(&hub).map_err(failed(false))?;
        if let Some(files) = &certificate_files {
            tokio::select! {
                enrolled = enrolment::ensure_certificate(&hub, files) => enrolled.map_err(failed(false))?,
                _ = stopped(&mut inputs.shutdown) => return Err(End::Shutdown),
            }
        }
        let bearer = enrolment::bearer_token(&hub).map_err(failed(false))?;
        let channel = tokio::select! {
            channel = connect(&hub) => channel.map_err(failed(false))?,
            _ = stopped(&mut inputs.shutdown) => return Err(End::Shutdown),
        };
        let (mut session, receivers) = Session::new(self.shared.clone());
        let requested = hub.keep_alive_heartbeat_seconds.unwrap_or(0);
        session
            .hello(
                self.options.replica_name(),
                self.session_token.clone(),
                requested,
            )
            .await
            .map_err(failed(false))?;
        // tonic's default of 4 MiB would refuse an operation carrying the manifests the hub
        // accepts (--max-request-bytes, 8 MiB by default) and end the stream; the hub bounds
        // what it sends.
        let mut client =
            AgentHubClient::new(channel).max_decoding_message_size(MAX_HUB_MESSAGE_BYTES);
        let mut request = tonic::Request::new(scale_agent_proto::tunnel::outbound(
            receivers.outgoing,
            receivers.tunnel_outgoing,
        ));
        if let Some(token) = bearer {
            let value = format!("Bearer {token}").parse().map_err(|_| {
                failed(false)(Error::InvalidConfig(
                    "the agent token (clouddriver.auth.token or tokenFile) holds characters a \
                     header cannot carry"
                        .into(),
                ))
            })?;
            request.metadata_mut().insert("authorization", value);
        }
        let response = tokio::select! {
            response = tokio::time::timeout(WELCOME_TIMEOUT, client.session(request)) => response,
            _ = stopped(&mut inputs.shutdown) => return Err(End::Shutdown),
        };
        let mut inbound = match response {
            Ok(Ok(response)) => response.into_inner(),
            Ok(Err(status)) => return Err(failed(false)(Error::Stream(status))),
            Err(_) => {
                return Err(failed(false)(Error::Protocol(format!(
                    "the hub did not answer within {} s",
                    WELCOME_TIMEOUT.as_secs()
                ))));
            }
        };
        let welcome = tokio::select! {
            welcome = tokio::time::timeout(WELCOME_TIMEOUT, await_welcome(&mut inbound)) => match welcome {
                Ok(Ok(welcome)) => welcome,
                Ok(Err(error)) => return Err(failed(false)(error)),
                Err(_) => return Err(failed(false)(Error::Protocol(format!("no Welcome within {} s", WELCOME_TIMEOUT.as_secs())))),
            },
            _ = stopped(&mut inputs.shutdown) => return Err(End::Shutdown),
        };
        session.welcome(&welcome);
        self.dynamic.stream_started();
        self.session_token = welcome.session_token.clone();
        self.renewal = None;
        let renew = certificate_files.and_then(renewal_due);
        let period_secs = granted_period(requested, welcome.heartbeat_period_seconds);
        if requested > 0 && period_secs != requested {
            // The hub clamped the request to its bounds (or is older and does not read it).
            tracing::info!(
                requested_seconds = requested,
                granted_seconds = period_secs,
                "the hub set another heartbeat period than clouddriver.keepAliveHeartbeatSeconds asks for; using the hub's"
            );
        }
        let period = Duration::from_secs(u64::from(period_secs));
        tracing::Span::current().record("identity", tracing::field::display(&welcome.identity));
        tracing::info!(hub_version = %welcome.hub_version,
            max_unacked = session.max_unacked, heartbeat_seconds = period_secs, "connected to the hub");
        self.shared.metrics.hub_connected.set(1);
        self.shared.update(|view| {
            view.hub_connected = true;
            view.hub_identity = welcome.identity.clone();
            view.heartbeat_period_seconds = period_secs;
        });

        // Accounts removed from the config while disconnected.
        for name in std::mem::take(&mut self.unregister_pending) {
            let unregister =
                agent_message::Kind::UnregisterAccount(v1::UnregisterAccount { account: name });
            session.send(unregister).await.map_err(failed(true))?;
        }
        let names: Vec<String> = self.accounts.keys().cloned().collect();
        for name in names {
            self.register(&name, &mut session)
                .await
                .map_err(failed(true))?;
        }
        Ok(Open {
            session,
            inbound,
            period,
            events: receivers.events,
            results: receivers.results,
            renew,
        })
    }

    /// The stream after the handshake, until it ends: the hub's messages, heartbeats,
    /// operation results, the watches' events (while the hub has acknowledged enough),
    /// config changes and accounts that finished preparing.
    async fn stream(&mut self, open: Open, inputs: &mut Inputs) -> End {
        let failed = |error: Error| End::Failed {
            welcomed: true,
            error,
        };
        let Open {
            mut session,
            mut inbound,
            period,
            mut events,
            mut results,
            mut renew,
        } = open;
        let mut heartbeat = tokio::time::interval_at(Instant::now() + period, period);
        heartbeat.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        let mut last_heard = Instant::now();
        loop {
            let room = session.has_room();
            tokio::select! {
                biased;
                _ = stopped(&mut inputs.shutdown) => {
                    return self.drain(session, inbound, results, period).await;
                }
                message = inbound.next() => {
                    let result = match message {
                        None => Err(Error::Protocol("the hub closed the stream".into())),
                        Some(Err(status)) => Err(Error::Stream(status)),
                        Some(Ok(message)) => {
                            last_heard = Instant::now();
                            self.handle(message, &mut session).await
                        }
                    };
                    if let Err(error) = result {
                        return failed(error);
                    }
                }
                // At two periods of silence exactly, not at the next heartbeat after them (up
                // to a period later): a hub cut off by a silent partition is left in time for
                // another replica to take the accounts over within the lease's bounds.
                () = tokio::time::sleep_until(last_heard + period * 2) => {
                    return failed(Error::Protocol(format!(
                        "the hub sent nothing for {} s (two heartbeat periods)", last_heard.elapsed().as_secs()
                    )));
                }
                _ = heartbeat.tick() => {
                    if let Err(error) = session.heartbeat().await {
                        return failed(error);
                    }
                    if let Err(error) = self.report_dynamic(&mut session).await {
                        return failed(error);
                    }
                }
                Some(result) = results.recv() => {
                    // In parts below the hub's message limit: one large list must not end
                    // the stream (and every account on it).
                    for part in crate::operations::split(result, session.max_message_bytes) {
                        if let Err(error) = session.send(agent_message::Kind::OperationResult(part)).await {
                            return failed(error);
                        }
                    }
                }
                Some(_) = session.operations.join_next(), if !session.operations.is_empty() => {}
                () = sleep_until_renewal(&renew), if renew.is_some() => {
                    // Once per stream: a refused renewal is tried again on the next one.
                    if let Some((files, _)) = renew.take()
                        && let Err(error) = self.ask_renewal(files, &mut session).await
                    {
                        return failed(error);
                    }
                }
                Some(outbound) = events.recv(), if room => {
                    let current = self
                        .accounts
                        .get(&outbound.account)
                        .is_some_and(|entry| entry.stream_generation == outbound.generation);
                    if current {
                        let is_object = matches!(outbound.message, agent_message::Kind::Object(_));
                        if let Err(error) = session.send(outbound.message).await {
                            return failed(error);
                        }
                        if is_object {
                            self.shared.metrics.events_sent
                                .get_or_create(&crate::metrics::AccountLabels { account: outbound.account })
                                .inc();
                        }
                    }
                }
                Some(config) = inputs.configs.next() => {
                    if self.apply_config(config, Some(&mut session)).await {
                        return End::HubChanged;
                    }
                }
                Some(prep) = inputs.prep_rx.recv() => {
                    if let Err(error) = self.prepared(prep, Some(&mut session)).await {
                        return failed(error);
                    }
                }
            }
        }
    }

    pub(super) async fn handle(
        &mut self,
        message: HubMessage,
        session: &mut Session,
    ) -> Result<()> {
        match message.kind {
            Some(hub_message::Kind::Ack(ack)) => session.ack(ack.seq),
            Some(hub_message::Kind::Assignment(assignment)) => {
                self.assign(assignment, session);
                self.report_dynamic(session).await?;
            }
            Some(hub_message::Kind::DynamicAccounts(set)) => {
                self.dynamic.replace(set);
                // Same file, so the hub settings did not change.
                self.apply_config(self.file_config.clone(), Some(session))
                    .await;
                self.report_dynamic(session).await?;
            }
            Some(hub_message::Kind::Operation(operation)) => self.operate(operation, session),
            Some(hub_message::Kind::Tunnel(frame)) => {
                let accounts = &self.accounts;
                session.tunnel.handle(frame, |head| {
                    let Some(entry) = accounts.get(&head.account) else {
                        return Route::NotServed;
                    };
                    if let Some(message) = crate::tunnel_scope::refusal(
                        &entry.config,
                        &head.method,
                        &head.path_and_query,
                    ) {
                        return Route::Refused(message);
                    }
                    let Some(prepared) = entry.prepared.as_ref() else {
                        return Route::NotServed;
                    };
                    match crate::callers::acting(&entry.config, head.caller.as_ref()) {
                        Acting::Agent => Route::Replay {
                            client: prepared.proxy_client_for(crate::tunnel::is_write(head)),
                            identity: None,
                        },
                        // The person's own rights decide, reads and writes alike: the
                        // agent's credentials without its ServiceAccount impersonation.
                        Acting::Person(identity) => Route::Replay {
                            client: prepared.proxy_client.clone(),
                            identity: Some(identity),
                        },
                        Acting::Refused(message) => Route::Refused(message),
                    }
                });
            }
            Some(hub_message::Kind::CertificateRenewal(renewal)) => self.renewed(renewal),
            Some(hub_message::Kind::AccountState(state)) => self.hub_account_state(state),
            Some(hub_message::Kind::KindStatus(status)) => {
                // The hub left the kind out of its cache (its object quota) or took it back;
                // the watch goes on either way: the hub asks for a relist by withholding
                // the kind's resume point on the next assignment.
                let state = v1::kind_status::State::try_from(status.state)
                    .map(|s| s.as_str_name())
                    .unwrap_or("STATE_UNSPECIFIED");
                let kind = status
                    .kind
                    .as_ref()
                    .map(|k| k.kind.as_str())
                    .unwrap_or_default();
                tracing::warn!(account = %status.account, kind, state, message = %status.message, "the hub reports a kind's state");
            }
            Some(hub_message::Kind::Capabilities(capabilities)) => {
                session.hub_reads_unavailable = capabilities
                    .capabilities
                    .iter()
                    .any(|c| c == scale_agent_proto::ACCOUNT_UNAVAILABLE_CAPABILITY);
                // The accounts that failed before this stream (or before the hub said it
                // reads the report).
                let names: Vec<String> = self.accounts.keys().cloned().collect();
                for name in names {
                    self.report_unavailable(&name, session).await?;
                }
            }
            Some(hub_message::Kind::AgentReplicas(replicas)) => {
                self.shared
                    .update(|view| view.hub_replicas = replicas.replicas);
            }
            Some(hub_message::Kind::Heartbeat(_)) | Some(hub_message::Kind::Welcome(_)) | None => {}
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_hubs_grant_wins_then_the_request_then_the_fallback() {
        assert_eq!(granted_period(20, 30), 30, "the hub clamped the request");
        assert_eq!(granted_period(0, 7), 7, "no request: the hub's period");
        assert_eq!(granted_period(20, 0), 20, "a Welcome without a period");
        assert_eq!(granted_period(0, 0), FALLBACK_HEARTBEAT_SECONDS);
    }
}
