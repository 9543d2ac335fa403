//! The accounts' lifecycle: prepared from the config (and the hub's dynamic accounts),
//! registered with the hub, assigned a role, and what the hub hears and says of them.

use std::{sync::Arc, time::Duration};

use scale_agent_crds::agent_config::{AccountConfig, AgentConfig};
use scale_agent_proto::v1::{self, account_assignment::Role, agent_message};
use tokio::task::JoinHandle;
use tracing::Instrument as _;

use super::{Entry, Prep, Runtime};
use crate::{
    account,
    backoff::Backoff,
    config::diff_accounts,
    error::Result,
    session::Session,
    state::{self, ClusterView},
    streamer::{self, StreamerContext},
};

impl Runtime {
    pub(super) fn assign(&mut self, assignment: v1::AccountAssignment, session: &Session) {
        let name = assignment.account.clone();
        let generation = self.generation();
        let Some(entry) = self.accounts.get_mut(&name) else {
            tracing::warn!(account = %name, "assignment for an account this agent does not serve; ignored");
            return;
        };
        entry.stop_streaming();
        let role = Role::try_from(assignment.role).unwrap_or(Role::Unspecified);
        let labels = crate::metrics::AccountLabels {
            account: name.clone(),
        };
        let metrics = &self.shared.metrics;
        metrics
            .account_rejected
            .get_or_create(&labels)
            .set(i64::from(role == Role::Rejected));
        metrics
            .account_streaming
            .get_or_create(&labels)
            .set(i64::from(role == Role::Streaming));
        let role_name = match role {
            Role::Streaming => state::ROLE_STREAMING,
            Role::Standby => state::ROLE_STANDBY,
            Role::Rejected => state::ROLE_REJECTED,
            Role::Unspecified => state::ROLE_PENDING,
        };
        self.shared.update_account(&name, |view| {
            view.role = role_name.into();
            view.rejection_reason = (role == Role::Rejected).then(|| assignment.reason.clone());
            view.kinds.clear();
            view.kinds_started = false;
        });
        match role {
            Role::Streaming => {
                let Some(prepared) = entry.prepared.clone() else {
                    tracing::warn!(account = %name, "STREAMING assignment for an account not prepared; ignored");
                    return;
                };
                tracing::info!(account = %name, resume_points = assignment.resume_points.len(), "streaming this account");
                entry.stream_generation = generation;
                // Created here, inside the stream's span, so the account's events carry both.
                let span = tracing::info_span!("account", account = %name);
                entry.streamer = Some(tokio::spawn(
                    streamer::run(StreamerContext {
                        account: entry.config.clone(),
                        prepared,
                        generation,
                        tx: session.events_tx.clone(),
                        shared: self.shared.clone(),
                        total_budget: self.total_budget.clone(),
                        budget_per_account: self.config.tasks.budget_per_account,
                        max_object_bytes: session.max_object_bytes,
                        resume_points: assignment.resume_points,
                        rediscover: Duration::from_secs(self.options.rediscover_seconds.max(1)),
                    })
                    .instrument(span),
                ));
            }
            Role::Standby => {
                tracing::info!(account = %name, "standby: another replica streams this account");
            }
            Role::Rejected => {
                tracing::error!(account = %name, reason = %assignment.reason,
                    "the hub rejected this account; it is not streamed until the config changes or the agent reconnects");
            }
            Role::Unspecified => {
                tracing::warn!(account = %name, role = assignment.role, "assignment with an unknown role; ignored");
            }
        }
    }

    pub(super) async fn register(&mut self, name: &str, session: &mut Session) -> Result<()> {
        let Some(entry) = self.accounts.get(name) else {
            return Ok(());
        };
        let Some(prepared) = &entry.prepared else {
            return Ok(());
        };
        let register = v1::RegisterAccount {
            account: name.to_string(),
            cluster: Some(prepared.cluster.clone()),
            namespaces: entry.config.namespaces.clone(),
            properties_json: serde_json::to_vec(&entry.config).unwrap_or_default(),
        };
        self.shared.update_account(name, |view| {
            view.role = state::ROLE_PENDING.into();
            view.rejection_reason = None;
        });
        tracing::info!(account = %name, "registering account");
        // The registration ends at the hub what this stream reported of the account: a
        // later failure is reported again, whatever its reason.
        session.reported_unavailable.remove(name);
        session
            .send(agent_message::Kind::RegisterAccount(register))
            .await
    }

    pub(super) async fn prepared(
        &mut self,
        prep: Prep,
        session: Option<&mut Session>,
    ) -> Result<()> {
        let Some(entry) = self.accounts.get_mut(&prep.account) else {
            return Ok(());
        };
        if entry.generation != prep.generation {
            return Ok(());
        }
        let prepared = match prep.outcome {
            Ok(prepared) => prepared,
            Err(reason) => {
                entry.failure = Some(reason);
                return match session {
                    Some(session) => self.report_unavailable(&prep.account, session).await,
                    None => Ok(()),
                };
            }
        };
        entry.failure = None;
        entry.executor = Some(Arc::new(crate::operations::Executor::new(
            prep.account.clone(),
            self.options.replica_name(),
            prepared.operations_client.clone(),
            crate::budget::Budget::for_account(
                self.operations_total.clone(),
                self.config.tasks.operations_per_account,
            ),
        )));
        entry.prepared = Some(prepared);
        entry.preparing = None;
        match session {
            Some(session) => self.register(&prep.account, session).await,
            None => Ok(()),
        }
    }

    /// Tells the hub the account cannot be served (AccountUnavailable), if its preparation
    /// failed, the hub reads the message, and this stream has not been told this reason yet.
    pub(super) async fn report_unavailable(
        &mut self,
        name: &str,
        session: &mut Session,
    ) -> Result<()> {
        let Some(reason) = self
            .accounts
            .get(name)
            .filter(|entry| entry.prepared.is_none())
            .and_then(|entry| entry.failure.clone())
        else {
            return Ok(());
        };
        if !session.hub_reads_unavailable || session.reported_unavailable.get(name) == Some(&reason)
        {
            return Ok(());
        }
        tracing::info!(account = %name, %reason, "telling the hub the account cannot be served");
        session
            .reported_unavailable
            .insert(name.to_string(), reason.clone());
        session
            .send(agent_message::Kind::AccountUnavailable(
                v1::AccountUnavailable {
                    account: name.to_string(),
                    reason,
                },
            ))
            .await
    }

    fn spawn_prepare(&self, config: AccountConfig, generation: u64) -> JoinHandle<()> {
        let tx = self.prep_tx.clone();
        let shared = self.shared.clone();
        let span = tracing::info_span!("account", account = %config.name);
        tokio::spawn(async move {
            let name = config.name.clone();
            let mut backoff = Backoff::for_retries();
            loop {
                match account::prepare(&config).await {
                    Ok(prepared) => {
                        tracing::info!(api_server = %prepared.cluster.api_server_host,
                            version = %prepared.cluster.kubernetes_version, "account credentials loaded");
                        shared.update_account(&name, |view| {
                            view.error = None;
                            view.prepared = true;
                            view.cluster = Some(ClusterView {
                                api_server_host: prepared.cluster.api_server_host.clone(),
                                ca_fingerprint: prepared.cluster.ca_fingerprint.clone(),
                                kubernetes_version: prepared.cluster.kubernetes_version.clone(),
                            });
                        });
                        let _ = tx.send(Prep {
                            account: name,
                            generation,
                            outcome: Ok(Arc::new(prepared)),
                        });
                        return;
                    }
                    Err(error) => {
                        let delay = backoff.next_delay();
                        let error = crate::error::Chain(&error).to_string();
                        tracing::warn!(%error, "account not usable; retrying in {:.1} s", delay.as_secs_f64());
                        shared.update_account(&name, |view| view.error = Some(error.clone()));
                        let _ = tx.send(Prep {
                            account: name.clone(),
                            generation,
                            outcome: Err(error),
                        });
                        tokio::time::sleep(delay).await;
                    }
                }
            }
        }.instrument(span))
    }

    /// Applies the latest config: accounts added, changed (re-prepared and re-registered)
    /// or removed (watches stopped, UnregisterAccount sent). True when the hub settings
    /// changed, which needs a new stream.
    pub(super) async fn apply_config(
        &mut self,
        new: Arc<AgentConfig>,
        mut session: Option<&mut Session>,
    ) -> bool {
        self.file_config = new.clone();
        let mut new = self.dynamic.merged(&new);
        if new.kubernetes.no_proxy {
            // Armory's kubernetes.noProxy is every account's noProxy (a change re-prepares
            // the accounts, as any change of theirs does).
            for account in &mut Arc::make_mut(&mut new).kubernetes.accounts {
                account.no_proxy = true;
            }
        }
        let hub_changed = new.clouddriver != self.config.clouddriver;
        let diff = diff_accounts(&self.config.kubernetes.accounts, &new.kubernetes.accounts);
        self.config = new;
        for name in diff.removed {
            tracing::info!(account = %name, "account removed from the config; stopping its watches");
            self.accounts.remove(&name);
            self.shared.remove_account(&name);
            let labels = crate::metrics::AccountLabels {
                account: name.clone(),
            };
            self.shared
                .metrics
                .account_streaming
                .get_or_create(&labels)
                .set(0);
            self.shared
                .metrics
                .account_rejected
                .get_or_create(&labels)
                .set(0);
            match session.as_deref_mut() {
                Some(session) => {
                    // The hub forgets what this stream reported of it, too.
                    session.reported_unavailable.remove(&name);
                    let unregister =
                        agent_message::Kind::UnregisterAccount(v1::UnregisterAccount {
                            account: name.clone(),
                        });
                    if session.send(unregister).await.is_err() {
                        // The stream is gone: tell the next one.
                        self.unregister_pending.insert(name);
                    }
                }
                None => {
                    self.unregister_pending.insert(name);
                }
            }
        }
        for config in diff.added.into_iter().chain(diff.changed) {
            let name = config.name.clone();
            tracing::info!(account = %name, "account added or changed; (re)loading its credentials");
            let generation = self.generation();
            self.unregister_pending.remove(&name);
            // Replacing the entry drops the old one, which stops its watches.
            self.accounts.remove(&name);
            self.shared.update_account(&name, |view| {
                view.role = state::ROLE_PENDING.into();
                view.rejection_reason = None;
                view.prepared = false;
                view.kinds.clear();
                view.kinds_started = false;
            });
            let preparing = self.spawn_prepare(config.clone(), generation);
            self.accounts.insert(
                name,
                Entry {
                    config,
                    generation,
                    prepared: None,
                    preparing: Some(preparing),
                    streamer: None,
                    executor: None,
                    stream_generation: 0,
                    failure: None,
                },
            );
        }
        hub_changed
    }

    /// Records the hub's state of an account (for the admin view and the status writer).
    pub(super) fn hub_account_state(&mut self, state: v1::AccountState) {
        let name = v1::account_state::State::try_from(state.state)
            .map(|s| s.as_str_name())
            .unwrap_or("STATE_UNSPECIFIED");
        tracing::debug!(account = %state.account, state = name, reason = %state.reason, "hub account state");
        if !self.accounts.contains_key(&state.account) {
            return;
        }
        self.shared.update_account(&state.account, |view| {
            view.hub_state = Some(state::HubAccountState {
                state: name.to_string(),
                reason: state.reason,
                since_unix_millis: state.since_unix_millis,
            });
        });
    }

    /// Tells the hub how the dynamic accounts fare, where that changed.
    pub(super) async fn report_dynamic(&mut self, session: &mut Session) -> Result<()> {
        for status in self.dynamic.changed(&self.file_config, &self.shared.view()) {
            session
                .send(agent_message::Kind::DynamicAccountStatus(status))
                .await?;
        }
        Ok(())
    }
}
