//! The reconcile loop: compares what the hub wants ([`Registrar::set_desired`]) with what was
//! registered (the [`Ledger`] for the API, the file's contents for the file), sends what
//! differs, and sleeps until the next change or the next retry.
//!
//! The API and the file each have their own loop, so a hung Clouddriver never delays the file
//! nor a stuck file system the API. On the API each account has its own retry schedule, so
//! one refused account never holds the others back; a changed account is tried at once,
//! whatever its schedule said.

use std::{
    collections::{BTreeMap, BTreeSet},
    path::Path,
    sync::{Arc, Mutex, MutexGuard},
    time::{Duration, Instant, SystemTime},
};

use futures::StreamExt;
use scale_agent_hub_model::{HubError, Result, error::Chain};
use serde_json::{Map, Value};
use tokio::sync::{Notify, watch};
use tracing::Instrument;

use super::{
    ClouddriverMetrics, ClouddriverSettings, DesiredAccount, Ledger, RegistrationStatus,
    TargetStatus,
    body::{self, Method, Outcome},
    client::{Client, SendError},
};

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

/// One request to make.
enum Op {
    Put {
        name: String,
        body: Vec<u8>,
        hash: String,
        secrets: Vec<String>,
        update: bool,
    },
    Delete {
        name: String,
    },
}

const DELETE: &str = "delete";

impl Op {
    fn name(&self) -> &str {
        match self {
            Op::Put { name, .. } | Op::Delete { name } => name,
        }
    }

    fn method(&self) -> Method {
        match self {
            Op::Put { .. } => Method::Put,
            Op::Delete { .. } => Method::Delete,
        }
    }
}

struct FileJob {
    contents: String,
    hash: String,
    accounts: BTreeMap<String, String>,
}

#[derive(Default)]
struct Plan {
    ops: Vec<Op>,
    file: Option<FileJob>,
    load_ledger: bool,
    next_wake: Option<Instant>,
    pending: BTreeSet<String>,
}

impl Plan {
    fn wake_at(&mut self, at: Option<Instant>) {
        if let Some(at) = at {
            self.next_wake = Some(self.next_wake.map_or(at, |w| w.min(at)));
        }
    }
}

/// The bodies of one desired account.
struct Bodies {
    /// `ManagedAccount` fields (the file's entry).
    managed: Map<String, Value>,
    managed_hash: String,
    api_hash: String,
}

fn bodies(account: &DesiredAccount, defaults: &Map<String, Value>) -> Result<Bodies, String> {
    let managed = body::managed_account(account, defaults).map_err(|e| e.to_string())?;
    let api = body::with_type(managed.clone());
    Ok(Bodies {
        managed_hash: body::body_hash(&managed),
        api_hash: body::body_hash(&api),
        managed,
    })
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

    /// What to do now on `target`, and when to look again.
    fn plan(&self, target: Target, st: &mut State, now: Instant) -> Plan {
        let mut plan = Plan::default();
        if !st.active {
            // Another replica registers; set_active wakes the loops.
            return plan;
        }
        let defaults = &self.settings.account_defaults;
        let mut file_entries = Vec::new();
        let mut file_hashes = BTreeMap::new();
        let mut api_bodies = Vec::new();
        for (name, account) in &st.desired {
            match bodies(account, defaults) {
                Ok(b) => {
                    file_hashes.insert(name.clone(), b.managed_hash.clone());
                    let secrets = body::kubeconfig_secrets(&account.kubeconfig);
                    api_bodies.push((name.clone(), b.api_hash, secrets));
                    file_entries.push(b.managed);
                }
                // Reported by status() and logged when the set changes; nothing to send.
                Err(_) => {
                    plan.pending.insert(name.clone());
                }
            }
        }

        if target == Target::Api {
            match &st.ledger {
                None => {
                    if st.ledger_track.due("load", now) {
                        plan.load_ledger = true;
                    } else {
                        plan.wake_at(st.ledger_track.waiting("load"));
                    }
                }
                Some(ledger) => {
                    let ledger = ledger.clone();
                    st.api.retain(|name, _| {
                        st.desired.contains_key(name) || ledger.contains_key(name)
                    });
                    for (name, hash, secrets) in api_bodies {
                        let registered = ledger.get(&name);
                        if registered == Some(&hash) {
                            continue;
                        }
                        plan.pending.insert(name.clone());
                        let track = st.api.entry(name.clone()).or_default();
                        if !track.due(&hash, now) {
                            plan.wake_at(track.waiting(&hash));
                            continue;
                        }
                        let Some(account) = st.desired.get(&name) else {
                            continue;
                        };
                        let Ok(body) = body::api_body(account, defaults) else {
                            continue;
                        };
                        plan.ops.push(Op::Put {
                            body: Value::Object(body).to_string().into_bytes(),
                            update: registered.is_some(),
                            name,
                            hash,
                            secrets,
                        });
                    }
                    for name in ledger.keys().filter(|n| !st.desired.contains_key(*n)) {
                        plan.pending.insert(name.clone());
                        let track = st.api.entry(name.clone()).or_default();
                        if track.due(DELETE, now) {
                            plan.ops.push(Op::Delete { name: name.clone() });
                        } else {
                            plan.wake_at(track.waiting(DELETE));
                        }
                    }
                }
            }
        }

        if target == Target::File {
            for (name, hash) in &file_hashes {
                if st.file.accounts.get(name) != Some(hash) {
                    plan.pending.insert(name.clone());
                }
            }
            for name in st.file.accounts.keys() {
                if !file_hashes.contains_key(name) {
                    plan.pending.insert(name.clone());
                }
            }
            match body::accounts_file(&file_entries) {
                Ok(contents) => {
                    let hash = body::bytes_hash(contents.as_bytes());
                    if st.file.written.as_deref() != Some(hash.as_str()) {
                        if st.file.track.due(&hash, now) {
                            plan.file = Some(FileJob {
                                contents,
                                hash,
                                accounts: file_hashes,
                            });
                        } else {
                            plan.wake_at(st.file.track.waiting(&hash));
                        }
                    }
                }
                Err(e) => {
                    // Not expected (plain JSON values); retried like a failed write.
                    let delay = self.backoff(st.file.track.failures + 1);
                    if st.file.track.due("yaml", now) {
                        st.file.track.failed("yaml", e.clone(), delay);
                        tracing::error!(error = %e, "cannot build the Clouddriver accounts file");
                    }
                    plan.wake_at(st.file.track.waiting("yaml"));
                }
            }
        }
        plan
    }

    fn backoff(&self, failures: u32) -> Duration {
        body::backoff_delay(&self.settings.backoff, failures, body::jitter_unit())
    }

    async fn execute(&self, plan: Plan) {
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
