//! What to do on a target now: the requests to Clouddriver's API, the file to write, and
//! when to look again, from the desired accounts, the ledger and each account's retry schedule.

use std::{
    collections::{BTreeMap, BTreeSet},
    time::Instant,
};

use scale_agent_hub_model::Result;
use serde_json::{Map, Value};

use super::{Registrar, State, Target};
use crate::{
    DesiredAccount,
    body::{self, Method},
};

/// One request to make.
pub(super) enum Op {
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

pub(super) const DELETE: &str = "delete";

impl Op {
    pub(super) fn name(&self) -> &str {
        match self {
            Op::Put { name, .. } | Op::Delete { name } => name,
        }
    }

    pub(super) fn method(&self) -> Method {
        match self {
            Op::Put { .. } => Method::Put,
            Op::Delete { .. } => Method::Delete,
        }
    }
}

pub(super) struct FileJob {
    pub(super) contents: String,
    pub(super) hash: String,
    pub(super) accounts: BTreeMap<String, String>,
}

#[derive(Default)]
pub(super) struct Plan {
    pub(super) ops: Vec<Op>,
    pub(super) file: Option<FileJob>,
    pub(super) load_ledger: bool,
    pub(super) next_wake: Option<Instant>,
    pub(super) pending: BTreeSet<String>,
}

impl Plan {
    pub(super) fn wake_at(&mut self, at: Option<Instant>) {
        if let Some(at) = at {
            self.next_wake = Some(self.next_wake.map_or(at, |w| w.min(at)));
        }
    }
}

/// The bodies of one desired account.
pub(super) struct Bodies {
    /// `ManagedAccount` fields (the file's entry).
    pub(super) managed: Map<String, Value>,
    pub(super) managed_hash: String,
    pub(super) api_hash: String,
}

pub(super) fn bodies(
    account: &DesiredAccount,
    defaults: &Map<String, Value>,
) -> Result<Bodies, String> {
    let managed = body::managed_account(account, defaults).map_err(|e| e.to_string())?;
    let api = body::with_type(managed.clone());
    Ok(Bodies {
        managed_hash: body::body_hash(&managed),
        api_hash: body::body_hash(&api),
        managed,
    })
}

impl Registrar {
    /// What to do now on `target`, and when to look again.
    pub(super) fn plan(&self, target: Target, st: &mut State, now: Instant) -> Plan {
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
}
