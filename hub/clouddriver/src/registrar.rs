//! The reconcile loop: compares what the hub wants ([`Registrar::set_desired`]) with what was
//! registered (the [`Ledger`] for the API, the file's contents for the file), sends what
//! differs, and sleeps until the next change or the next retry.
//!
//! The API and the file each have their own loop, so a hung Clouddriver never delays the file
//! nor a stuck file system the API. On the API each account has its own retry schedule, so
//! one refused account never holds the others back; a changed account is tried at once,
//! whatever its schedule said.
//!
//! This file holds the registrar's state, its public handle and the loops; what to do on a
//! target is decided in `plan`, and done in `send`.

use std::{
    collections::{BTreeMap, BTreeSet},
    path::Path,
    sync::{Arc, Mutex, MutexGuard},
    time::{Duration, Instant, SystemTime},
};

use scale_agent_hub_model::{HubError, Result};
use tokio::sync::{Notify, watch};

use super::{
    ClouddriverMetrics, ClouddriverSettings, DesiredAccount, Ledger, RegistrationStatus,
    TargetStatus, body, client::Client,
};

mod plan;
mod send;

use plan::bodies;

/// Registers the hub's accounts in Clouddriver; see the [module docs](super).
pub struct Registrar {
    settings: ClouddriverSettings,
    ledger: Arc<dyn Ledger>,
    client: Option<Client>,
    metrics: ClouddriverMetrics,
    state: Mutex<State>,
    wake_api: Notify,
    wake_file: Notify,
}

/// Attempts at one thing (an account on one target, the file, loading the ledger).
#[derive(Debug, Default)]
struct Track {
    attempts: u64,
    failures: u32,
    next_attempt: Option<Instant>,
    last_attempt: Option<SystemTime>,
    last_success: Option<SystemTime>,
    last_error: Option<String>,
    /// What failed (a body hash, or "delete"): anything else is tried at once.
    failed: Option<String>,
}

impl Track {
    fn due(&self, what: &str, now: Instant) -> bool {
        self.failed.as_deref() != Some(what) || self.next_attempt.is_none_or(|t| t <= now)
    }

    fn waiting(&self, what: &str) -> Option<Instant> {
        if self.failed.as_deref() == Some(what) {
            self.next_attempt
        } else {
            None
        }
    }

    fn started(&mut self) {
        self.attempts += 1;
        self.last_attempt = Some(SystemTime::now());
    }

    fn succeeded(&mut self) {
        self.failures = 0;
        self.next_attempt = None;
        self.last_error = None;
        self.failed = None;
        self.last_success = Some(SystemTime::now());
    }

    /// Records a failure; returns whether it is worth a warning (the first of a run, or a new
    /// reason) rather than a debug line, so a long outage does not flood the log.
    fn failed(&mut self, what: &str, error: String, delay: Duration) -> bool {
        let news = self.failures == 0 || self.last_error.as_deref() != Some(error.as_str());
        self.failures = self.failures.saturating_add(1);
        self.next_attempt = Some(Instant::now() + delay);
        self.last_error = Some(error);
        self.failed = Some(what.to_owned());
        news
    }

    fn status(&self, registered: bool, in_sync: bool, invalid: Option<&String>) -> TargetStatus {
        TargetStatus {
            registered,
            in_sync,
            attempts: self.attempts,
            consecutive_failures: self.failures,
            last_attempt: self.last_attempt,
            last_success: self.last_success,
            last_error: invalid.or(self.last_error.as_ref()).cloned(),
        }
    }
}

#[derive(Debug, Default)]
struct FileState {
    /// Hash of the contents on disk, once known (written, or found equal at start).
    written: Option<String>,
    /// The disk was compared with the wanted contents once (a restart rewrites nothing that
    /// is already there).
    checked: bool,
    /// Each account in the file on disk, with the hash of its `ManagedAccount` fields.
    accounts: BTreeMap<String, String>,
    track: Track,
}

/// The two targets; each has its own loop, so a hung Clouddriver never delays the file nor
/// a stuck file system the API.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Target {
    Api,
    File,
}

#[derive(Default)]
struct State {
    /// This replica registers accounts now ([`Registrar::set_active`]); otherwise the loops
    /// send nothing and write no file.
    active: bool,
    desired: BTreeMap<String, DesiredAccount>,
    /// What the ledger holds; `None` until loaded (nothing is sent to the API before).
    ledger: Option<BTreeMap<String, String>>,
    ledger_track: Track,
    api: BTreeMap<String, Track>,
    file: FileState,
    /// Accounts with work left, per target (the union is the `accounts_pending` gauge).
    pending_api: BTreeSet<String>,
    pending_file: BTreeSet<String>,
}

impl Registrar {
    /// A registrar for these settings (checked: a bad URL, CA file or defaults fail here, at
    /// start-up). `ledger` is read when [`Registrar::run`] starts.
    pub fn new(settings: ClouddriverSettings, ledger: Arc<dyn Ledger>) -> Result<Self> {
        settings.validate()?;
        let client = settings
            .api_url
            .as_deref()
            .map(|url| {
                Client::new(
                    url,
                    settings.user.as_deref(),
                    settings.ca_file.as_deref(),
                    settings.request_timeout,
                )
                .map_err(HubError::Config)
            })
            .transpose()?;
        Ok(Registrar {
            settings,
            ledger,
            client,
            metrics: ClouddriverMetrics::default(),
            state: Mutex::new(State {
                active: true,
                ..State::default()
            }),
            wake_api: Notify::new(),
            wake_file: Notify::new(),
        })
    }

    /// The Account Management API's client, when the target is Clouddriver's API.
    pub(crate) fn client(&self) -> Option<&Client> {
        self.client.as_ref()
    }

    /// The registrar's metrics, to add to the hub's registry
    /// ([`ClouddriverMetrics::register`]).
    pub fn metrics(&self) -> &ClouddriverMetrics {
        &self.metrics
    }

    fn state(&self) -> MutexGuard<'_, State> {
        // Every critical section leaves the state consistent; a panic elsewhere must not stop
        // registration.
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Makes this replica the one that registers accounts (`true`), or stops it (`false`):
    /// with replicas sharing a store, only one may, or each would remove the accounts the
    /// others registered. A registrar starts active; becoming active again reads the ledger
    /// and the file anew (another replica registered meanwhile), so nothing unchanged is
    /// sent again. Set the accounts ([`Registrar::set_desired`]) before activating: an
    /// active registrar with no accounts removes every account in the ledger.
    pub fn set_active(&self, active: bool) {
        let mut st = self.state();
        if st.active == active {
            return;
        }
        st.active = active;
        if active {
            st.ledger = None;
            st.ledger_track = Track::default();
            st.file.checked = false;
            st.file.written = None;
        } else {
            st.pending_api.clear();
            st.pending_file.clear();
            self.metrics.accounts_pending.set(0);
        }
        drop(st);
        self.wake_api.notify_one();
        self.wake_file.notify_one();
    }

    /// Whether this replica registers accounts now ([`Registrar::set_active`]).
    pub fn is_active(&self) -> bool {
        self.state().active
    }

    /// Replaces the whole set of accounts the hub wants registered and wakes the loop.
    /// Returns at once.
    pub fn set_desired(&self, accounts: Vec<DesiredAccount>) {
        let mut desired = BTreeMap::new();
        for account in accounts {
            if let Some(previous) = desired.insert(account.name.clone(), account) {
                tracing::warn!(account = %previous.name, "account listed twice for Clouddriver; the last entry wins");
            }
        }
        let mut st = self.state();
        for (name, account) in &desired {
            if st.desired.get(name) == Some(account) {
                continue;
            }
            // Said once per change of the account, not at every pass.
            if let Err(e) = body::managed_account(account, &self.settings.account_defaults) {
                tracing::error!(account = %name, error = %e, "account not registered in Clouddriver: fix its settings");
            }
        }
        st.desired = desired;
        drop(st);
        self.wake_api.notify_one();
        self.wake_file.notify_one();
    }

    /// Where every account stands: those wanted, those still registered through the API, and
    /// those still in the file.
    pub fn status(&self) -> Vec<RegistrationStatus> {
        let st = self.state();
        let mut names: BTreeSet<&String> = st.desired.keys().collect();
        if let Some(ledger) = &st.ledger {
            names.extend(ledger.keys());
        }
        names.extend(st.file.accounts.keys());
        let defaults = &self.settings.account_defaults;
        let no_track = Track::default();
        // Until the ledger is read nothing is sent to the API: say why on every account.
        let ledger_error = st
            .ledger
            .is_none()
            .then_some(st.ledger_track.last_error.as_ref())
            .flatten();
        names
            .into_iter()
            .map(|name| {
                let wanted = st.desired.get(name).map(|a| bodies(a, defaults));
                let invalid = match &wanted {
                    Some(Err(e)) => Some(e),
                    _ => None,
                };
                let api = self.client.as_ref().map(|_| {
                    let registered = st.ledger.as_ref().and_then(|l| l.get(name));
                    let in_sync = match &wanted {
                        Some(Ok(b)) => registered == Some(&b.api_hash),
                        Some(Err(_)) => false,
                        None => registered.is_none() && st.ledger.is_some(),
                    };
                    st.api.get(name).unwrap_or(&no_track).status(
                        registered.is_some(),
                        in_sync,
                        invalid.or(ledger_error),
                    )
                });
                let file = self.settings.accounts_file.as_ref().map(|_| {
                    let present = st.file.accounts.get(name);
                    let in_sync = match &wanted {
                        Some(Ok(b)) => present == Some(&b.managed_hash),
                        Some(Err(_)) => false,
                        None => present.is_none() && st.file.checked,
                    };
                    st.file.track.status(present.is_some(), in_sync, invalid)
                });
                RegistrationStatus {
                    account: name.clone(),
                    desired: wanted.is_some(),
                    api,
                    file,
                }
            })
            .collect()
    }

    /// Runs until `shutdown` is true (or its sender is dropped). Returns at once when no
    /// target is configured.
    pub async fn run(self: Arc<Self>, shutdown: watch::Receiver<bool>) {
        if !self.settings.enabled() {
            tracing::info!(
                "no --clouddriver-url nor --clouddriver-accounts-file: accounts are not registered in Clouddriver"
            );
            return;
        }
        let file = self.settings.accounts_file.as_deref().map(Path::display);
        tracing::info!(
            api = self.settings.api_url.as_deref(),
            file = file.map(tracing::field::display),
            "registering accounts in Clouddriver"
        );
        let api = async {
            if self.client.is_some() {
                self.reconcile(Target::Api, &self.wake_api, shutdown.clone())
                    .await;
            }
        };
        let file = async {
            if self.settings.accounts_file.is_some() {
                self.reconcile(Target::File, &self.wake_file, shutdown.clone())
                    .await;
            }
        };
        futures::join!(api, file);
        tracing::debug!("Clouddriver registrar stopped");
    }

    /// One target's loop: plan, do what is due, sleep until a change or the next retry.
    async fn reconcile(&self, target: Target, wake: &Notify, mut shutdown: watch::Receiver<bool>) {
        loop {
            if *shutdown.borrow() {
                break;
            }
            // Registered before planning, so a change made while requests run is not missed.
            let notified = wake.notified();
            tokio::pin!(notified);
            notified.as_mut().enable();

            let plan = {
                let mut st = self.state();
                let plan = self.plan(target, &mut st, Instant::now());
                let pending = match target {
                    Target::Api => &mut st.pending_api,
                    Target::File => &mut st.pending_file,
                };
                *pending = plan.pending.clone();
                let all = st.pending_api.union(&st.pending_file).count();
                self.metrics.accounts_pending.set(all as i64);
                plan
            };
            if plan.load_ledger || plan.file.is_some() || !plan.ops.is_empty() {
                tokio::select! {
                    () = self.execute(plan) => {}
                    changed = shutdown.changed() => {
                        // A dropped sender means shutdown too (and would answer at once forever).
                        if changed.is_err() {
                            break;
                        }
                    }
                }
                continue;
            }
            let sleep = async {
                match plan.next_wake {
                    Some(at) => tokio::time::sleep_until(at.into()).await,
                    None => std::future::pending().await,
                }
            };
            tokio::select! {
                () = &mut notified => {}
                () = sleep => {}
                changed = shutdown.changed() => {
                    if changed.is_err() {
                        break;
                    }
                }
            }
        }
    }
}
