//! Carrying out a plan: requests to Clouddriver's API (the ledger recorded after each), the
//! file written, the ledger loaded, and each failure's retry scheduled.

use std::{path::Path, time::Duration};

use futures::StreamExt;
use scale_agent_hub_model::{HubError, Result, error::Chain};
use tracing::Instrument;

use super::{
    Registrar,
    plan::{DELETE, FileJob, Op, Plan},
};
use crate::{
    Ledger,
    body::{self, Outcome},
    client::SendError,
};

impl Registrar {
    pub(super) fn backoff(&self, failures: u32) -> Duration {
        body::backoff_delay(&self.settings.backoff, failures, body::jitter_unit())
    }

    pub(super) async fn execute(&self, plan: Plan) {
        if plan.load_ledger {
            self.load_ledger().await;
        }
        let file = async {
            if let (Some(job), Some(path)) = (plan.file, &self.settings.accounts_file) {
                self.write_file(path, job).await;
            }
        };
        let api = futures::stream::iter(plan.ops)
            .map(|op| {
                let span = tracing::info_span!(
                    "clouddriver",
                    account = %op.name(),
                    method = op.method().as_str()
                );
                self.send(op).instrument(span)
            })
            .buffer_unordered(self.settings.concurrency)
            .for_each(|()| async {});
        futures::join!(file, api);
    }

    /// Runs a ledger call on a blocking thread (a store-backed ledger does disk I/O).
    async fn with_ledger<T: Send + 'static>(
        &self,
        f: impl FnOnce(&dyn Ledger) -> Result<T> + Send + 'static,
    ) -> Result<T> {
        let ledger = self.ledger.clone();
        tokio::task::spawn_blocking(move || f(ledger.as_ref()))
            .await
            .map_err(|e| HubError::Task(format!("ledger: {e}")))?
    }

    async fn load_ledger(&self) {
        self.state().ledger_track.started();
        match self.with_ledger(|l| l.load()).await {
            Ok(entries) => {
                tracing::info!(
                    accounts = entries.len(),
                    "loaded the accounts registered in Clouddriver before"
                );
                self.metrics.accounts_registered.set(entries.len() as i64);
                let mut st = self.state();
                st.ledger_track.succeeded();
                st.ledger = Some(entries);
            }
            Err(e) => {
                let mut st = self.state();
                let delay = self.backoff(st.ledger_track.failures + 1);
                st.ledger_track.failed("load", Chain(&e).to_string(), delay);
                tracing::error!(error = %Chain(&e), retry_in = ?delay, "cannot read the Clouddriver ledger; nothing is sent to the API until it can be read");
            }
        }
    }

    async fn send(&self, op: Op) {
        let Some(client) = &self.client else {
            return;
        };
        let method = op.method();
        if let Some(track) = self.state().api.get_mut(op.name()) {
            track.started();
        }
        let (answer, secrets) = match &op {
            Op::Put { body, secrets, .. } => (
                client.put_credentials(body.clone()).await,
                secrets.as_slice(),
            ),
            Op::Delete { name } => (client.delete_credentials(name).await, &[][..]),
        };
        let (what, outcome) = match &op {
            Op::Put { hash, .. } => (hash.as_str(), answer),
            Op::Delete { .. } => (DELETE, answer),
        };
        match outcome {
            Err(e) => {
                self.metrics.request(method.as_str(), "unreachable");
                let error = match &e {
                    SendError::Timeout(_) => format!("Clouddriver did not answer: {e}"),
                    SendError::Transport(_) => format!("cannot reach Clouddriver: {e}"),
                };
                self.failed(&op, what, body::redact(&error, secrets), None);
            }
            // Scrubbed before classify() shortens the message, which could cut a token in two.
            Ok(answer) => match body::classify(
                method,
                answer.status,
                body::redact(&String::from_utf8_lossy(&answer.body), secrets).as_bytes(),
            ) {
                Outcome::Done => {
                    self.metrics.request(method.as_str(), "success");
                    self.done(op).await;
                }
                Outcome::Retry { status, message } => {
                    self.metrics.request(method.as_str(), "retry");
                    let error = format!("Clouddriver answered {status}: {message}");
                    self.failed(&op, what, body::redact(&error, secrets), None);
                }
                Outcome::Rejected {
                    status,
                    message,
                    hint,
                } => {
                    self.metrics.request(method.as_str(), "rejected");
                    let error = format!("Clouddriver refused ({status}): {message}; {hint}");
                    self.failed(
                        &op,
                        what,
                        body::redact(&error, secrets),
                        Some(self.settings.rejected_retry),
                    );
                }
            },
        }
    }

    fn failed(&self, op: &Op, what: &str, error: String, fixed_delay: Option<Duration>) {
        let mut st = self.state();
        let track = st.api.entry(op.name().to_owned()).or_default();
        let delay = fixed_delay.unwrap_or_else(|| self.backoff(track.failures + 1));
        let news = track.failed(what, error.clone(), delay);
        let attempts = track.failures;
        drop(st);
        if fixed_delay.is_some() {
            tracing::error!(%error, attempts, retry_in = ?delay, "Clouddriver refused the request");
        } else if news {
            tracing::warn!(%error, attempts, retry_in = ?delay, "Clouddriver request failed; retrying");
        } else {
            tracing::debug!(%error, attempts, retry_in = ?delay, "Clouddriver request failed again");
        }
    }

    async fn done(&self, op: Op) {
        match op {
            Op::Put {
                name, hash, update, ..
            } => {
                let recorded = {
                    let (name, hash) = (name.clone(), hash.clone());
                    self.with_ledger(move |l| l.record(&name, &hash)).await
                };
                if let Err(e) = &recorded {
                    // Registered all the same; after a restart it is sent again (harmless).
                    tracing::error!(error = %Chain(e), "registered, but the ledger could not record it");
                }
                let count = {
                    let mut st = self.state();
                    st.api.entry(name.clone()).or_default().succeeded();
                    let ledger = st.ledger.get_or_insert_default();
                    ledger.insert(name, hash);
                    ledger.len()
                };
                self.metrics.accounts_registered.set(count as i64);
                if update {
                    tracing::info!("account updated in Clouddriver");
                } else {
                    tracing::info!("account registered in Clouddriver");
                }
            }
            Op::Delete { name } => {
                let forgotten = {
                    let name = name.clone();
                    self.with_ledger(move |l| l.forget(&name)).await
                };
                if let Err(e) = &forgotten {
                    // Removed all the same; after a restart the DELETE is sent again (harmless).
                    tracing::error!(error = %Chain(e), "removed, but the ledger could not forget it");
                }
                let count = {
                    let mut st = self.state();
                    st.api.remove(&name);
                    let ledger = st.ledger.get_or_insert_default();
                    ledger.remove(&name);
                    ledger.len()
                };
                self.metrics.accounts_registered.set(count as i64);
                tracing::info!("account removed from Clouddriver");
            }
        }
    }

    async fn write_file(&self, path: &Path, job: FileJob) {
        let checked = self.state().file.checked;
        if !checked {
            // At start: if the file already holds exactly this, keep it (no reload in
            // Clouddriver for a hub restart).
            let existing = {
                let path = path.to_path_buf();
                tokio::task::spawn_blocking(move || std::fs::read(path))
                    .await
                    .ok()
                    .and_then(|r| r.ok())
            };
            let same = existing.is_some_and(|b| body::bytes_hash(&b) == job.hash);
            let mut st = self.state();
            st.file.checked = true;
            if same {
                st.file.written = Some(job.hash);
                st.file.accounts = job.accounts;
                tracing::info!(path = %path.display(), "the Clouddriver accounts file is up to date");
                return;
            }
        }
        self.state().file.track.started();
        let written = {
            let (path, contents) = (path.to_path_buf(), job.contents);
            tokio::task::spawn_blocking(move || {
                scale_agent_runtime::write_private(&path, contents.as_bytes())
            })
            .await
            .map_err(std::io::Error::other)
            .and_then(|r| r)
        };
        self.metrics.file_write(written.is_ok());
        let mut st = self.state();
        match written {
            Ok(()) => {
                let count = job.accounts.len();
                st.file.track.succeeded();
                st.file.written = Some(job.hash);
                st.file.accounts = job.accounts;
                drop(st);
                tracing::info!(path = %path.display(), accounts = count, "wrote the Clouddriver accounts file");
            }
            Err(e) => {
                let delay = self.backoff(st.file.track.failures + 1);
                let error = format!("cannot write {}: {e}", path.display());
                let news = st.file.track.failed(&job.hash, error.clone(), delay);
                drop(st);
                if news {
                    tracing::error!(%error, retry_in = ?delay, "Clouddriver accounts file not written");
                }
            }
        }
    }
}
