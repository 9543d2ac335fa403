//! [`Registry::observe`] looks only at the accounts changed since its last look: any
//! sequence of the registry's changes, observed along the way, leaves every account's state
//! as a look at every account would (the O(accounts) look each registration used to make);
//! and the streams found by identity are those a walk over every stream finds.

use std::time::{Instant, SystemTime};

use scale_agent_proto::v1::kind_status::State as KindStatusState;

use super::{AccountBinding, AccountRecord, ClusterRecord, Registry, SessionId};

fn rec(host: &str) -> AccountRecord {
    AccountRecord {
        cluster: ClusterRecord {
            api_server_host: host.into(),
            ca_fingerprint: "ff".into(),
            kubernetes_version: "v1.37.0".into(),
        },
        namespaces: vec![],
        properties: serde_json::Value::Null,
    }
}

fn now() -> (Instant, SystemTime) {
    (Instant::now(), SystemTime::now())
}

/// A small deterministic generator (xorshift), so a failure names its seed.
struct Rng(u64);

impl Rng {
    fn below(&mut self, n: usize) -> usize {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        (self.0 % n as u64) as usize
    }
}

/// One random change of the registry, by the methods the hub calls.
fn change(r: &mut Registry, rng: &mut Rng, sessions: &mut Vec<SessionId>) {
    const ACCOUNTS: [&str; 6] = ["a0", "a1", "a2", "a3", "a4", "a5"];
    let account = ACCOUNTS[rng.below(ACCOUNTS.len())];
    let session = |rng: &mut Rng, sessions: &Vec<SessionId>| {
        (!sessions.is_empty()).then(|| sessions[rng.below(sessions.len())])
    };
    match rng.below(12) {
        0 | 1 => {
            let (id, _, _) = r.connect(
                &format!("identity-{}", rng.below(3)),
                &format!("pod-{}", rng.below(3)),
                "v",
                now(),
            );
            sessions.push(id);
        }
        2 | 3 => {
            if let Some(s) = session(rng, sessions) {
                // Two clusters, so that some registrations are refused.
                let host = if rng.below(4) == 0 { "h2" } else { "h1" };
                r.register(s, account, rec(host));
            }
        }
        4 => {
            if let Some(s) = session(rng, sessions) {
                r.unregister(s, account, now());
            }
        }
        5 => {
            if let Some(s) = session(rng, sessions) {
                r.disconnect(s, now());
                sessions.retain(|x| *x != s);
            }
        }
        6 => {
            if let Some(s) = session(rng, sessions) {
                r.note_rejection(s, account, "refused");
            }
        }
        7 => {
            if let Some(s) = session(rng, sessions) {
                r.note_unavailable(s, account, "no kubeconfig", now());
            }
        }
        8 => {
            if let Some(s) = session(rng, sessions) {
                let (state, message) = if rng.below(2) == 0 {
                    (KindStatusState::Failing, "401 Unauthorized: token expired")
                } else {
                    (KindStatusState::Watching, "")
                };
                r.note_kind_status(s, account, state, message);
            }
        }
        9 => {
            r.bind(account, &format!("identity-{}", rng.below(3)), 0);
        }
        10 => match rng.below(4) {
            0 => {
                r.remove_account(account);
            }
            1 => {
                r.remove_binding(account);
            }
            2 => {
                r.set_binding_if_none(
                    account,
                    AccountBinding {
                        identity: "identity-0".into(),
                        since: 0,
                    },
                );
            }
            _ => {
                if !r.accounts.contains_key(account) {
                    r.load(account.to_string(), rec("h1"), now());
                }
            }
        },
        _ => match rng.below(3) {
            0 => {
                r.acquired(account);
            }
            1 => {
                r.released(account);
            }
            _ => {
                r.lost_all();
            }
        },
    }
}

#[test]
fn looking_at_the_changed_accounts_gives_what_looking_at_all_gives() {
    for seed in 1..=200u64 {
        for shared in [false, true] {
            let mut r = if shared {
                Registry::shared()
            } else {
                Registry::default()
            };
            let mut rng = Rng(seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1);
            let mut sessions = Vec::new();
            for step in 0..60 {
                change(&mut r, &mut rng, &mut sessions);
                for identity in ["identity-0", "identity-1", "identity-2"] {
                    let mut scanned: Vec<(SessionId, String)> = r
                        .sessions
                        .values()
                        .filter(|s| s.identity == identity)
                        .map(|s| (s.id, s.replica.clone()))
                        .collect();
                    scanned.sort_by(|a, b| a.1.cmp(&b.1));
                    assert_eq!(
                        r.replicas_of_identity(identity),
                        scanned,
                        "seed {seed}, step {step}: the index of streams by identity"
                    );
                }
                if rng.below(3) == 0 {
                    r.observe(SystemTime::now());
                    let incremental = r.states.clone();
                    r.changed.all = true;
                    r.observe(SystemTime::now());
                    assert_eq!(
                        incremental, r.states,
                        "seed {seed}, shared {shared}, step {step}: a look at every account \
                         changed what the look at the changed ones left"
                    );
                }
            }
        }
    }
}

#[test]
fn a_look_with_nothing_changed_derives_nothing() {
    let mut r = Registry::default();
    let (a, _, _) = r.connect("agent", "pod-a", "v", now());
    r.register(a, "prod", rec("h1"));
    assert_eq!(r.observe(SystemTime::now()).len(), 1, "prod is new: ACTIVE");
    assert!(r.changed.names.is_empty() && !r.changed.all);
    // A stream connecting changes no account's state, and marks none.
    r.connect("agent", "pod-b", "v", now());
    assert!(r.changed.names.is_empty());
    assert!(r.observe(SystemTime::now()).is_empty());
    r.disconnect(a, now());
    assert_eq!(
        r.changed
            .names
            .iter()
            .map(String::as_str)
            .collect::<Vec<_>>(),
        ["prod"]
    );
    let transitions = r.observe(SystemTime::now());
    assert_eq!(transitions.len(), 1, "prod: ACTIVE to INACTIVE");
}
