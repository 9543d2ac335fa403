//! The statements a commit batch runs, and each [`StoreOp`] encoded as the statements and
//! parameters that write it.

use tokio_postgres::{Client, Statement, types::ToSql};

use scale_agent_hub_model::Result;

use super::pg;
use crate::{StoreOp, encode_object};

/// The statements of a batch.
#[derive(Clone, Copy)]
pub(super) enum Which {
    PutAccount,
    DeleteAccount,
    DeleteKinds,
    DeleteObjects,
    DeleteResumes,
    PutKind,
    PutObject,
    DeleteObject,
    PutResume,
    DeleteResume,
    PutToken,
    DeleteToken,
    PutMeta,
    PutRegistration,
    DeleteRegistration,
    PutAgentToken,
    DeleteAgentToken,
    PutIdentity,
    PutBinding,
    DeleteBinding,
    PutIdentityState,
    PutDynamicAccount,
    DeleteDynamicAccount,
}

const SQL: &[(Which, &str)] = &[
    (
        Which::PutAccount,
        "INSERT INTO accounts (account, record) VALUES ($1, $2) \
         ON CONFLICT (account) DO UPDATE SET record = EXCLUDED.record",
    ),
    (
        Which::DeleteAccount,
        "DELETE FROM accounts WHERE account = $1",
    ),
    (Which::DeleteKinds, "DELETE FROM kinds WHERE account = $1"),
    (
        Which::DeleteObjects,
        "DELETE FROM objects WHERE account = $1",
    ),
    (
        Which::DeleteResumes,
        "DELETE FROM resume_points WHERE account = $1",
    ),
    (
        Which::PutKind,
        "INSERT INTO kinds (account, kind, info) VALUES ($1, $2, $3) \
         ON CONFLICT (account, kind) DO UPDATE SET info = EXCLUDED.info",
    ),
    (
        Which::PutObject,
        "INSERT INTO objects (account, kind, uid, object) VALUES ($1, $2, $3, $4) \
         ON CONFLICT (account, kind, uid) DO UPDATE SET object = EXCLUDED.object",
    ),
    (
        Which::DeleteObject,
        "DELETE FROM objects WHERE account = $1 AND kind = $2 AND uid = $3",
    ),
    (
        Which::PutResume,
        "INSERT INTO resume_points (account, kind, watch_namespace, resource_version) \
         VALUES ($1, $2, $3, $4) ON CONFLICT (account, kind, watch_namespace) \
         DO UPDATE SET resource_version = EXCLUDED.resource_version",
    ),
    (
        Which::DeleteResume,
        "DELETE FROM resume_points WHERE account = $1 AND kind = $2 AND watch_namespace = $3",
    ),
    (
        Which::PutToken,
        "INSERT INTO tokens (id, record, sha256) VALUES ($1, $2, $3) \
         ON CONFLICT (id) DO UPDATE SET record = EXCLUDED.record, sha256 = EXCLUDED.sha256",
    ),
    (Which::DeleteToken, "DELETE FROM tokens WHERE id = $1"),
    (
        Which::PutMeta,
        "INSERT INTO meta (key, value) VALUES ($1, $2) \
         ON CONFLICT (key) DO UPDATE SET value = EXCLUDED.value",
    ),
    (
        Which::PutRegistration,
        "INSERT INTO clouddriver_accounts (account, body_hash) VALUES ($1, $2) \
         ON CONFLICT (account) DO UPDATE SET body_hash = EXCLUDED.body_hash",
    ),
    (
        Which::DeleteRegistration,
        "DELETE FROM clouddriver_accounts WHERE account = $1",
    ),
    (
        Which::PutAgentToken,
        "INSERT INTO agent_tokens (id, record, sha256) VALUES ($1, $2, $3) \
         ON CONFLICT (id) DO UPDATE SET record = EXCLUDED.record, sha256 = EXCLUDED.sha256",
    ),
    (
        Which::DeleteAgentToken,
        "DELETE FROM agent_tokens WHERE id = $1",
    ),
    (
        Which::PutIdentity,
        "INSERT INTO agent_identities (identity, record) VALUES ($1, $2) \
         ON CONFLICT (identity) DO UPDATE SET record = EXCLUDED.record",
    ),
    (
        Which::PutBinding,
        "INSERT INTO account_bindings (account, binding) VALUES ($1, $2) \
         ON CONFLICT (account) DO UPDATE SET binding = EXCLUDED.binding",
    ),
    (
        Which::DeleteBinding,
        "DELETE FROM account_bindings WHERE account = $1",
    ),
    (
        Which::PutIdentityState,
        "INSERT INTO agent_identity_states (identity, record) VALUES ($1, $2) \
         ON CONFLICT (identity) DO UPDATE SET record = EXCLUDED.record",
    ),
    (
        Which::PutDynamicAccount,
        "INSERT INTO dynamic_accounts (account, record) VALUES ($1, $2) \
         ON CONFLICT (account) DO UPDATE SET record = EXCLUDED.record",
    ),
    (
        Which::DeleteDynamicAccount,
        "DELETE FROM dynamic_accounts WHERE account = $1",
    ),
];

/// The batch statements, prepared once per connection (pipelined: one round trip).
#[derive(Clone)]
pub(super) struct Statements(Vec<Statement>);

impl Statements {
    pub(super) async fn prepare(client: &Client) -> Result<Self> {
        let statements =
            futures::future::try_join_all(SQL.iter().map(|(_, sql)| client.prepare(sql)))
                .await
                .map_err(pg("prepare"))?;
        Ok(Statements(statements))
    }

    pub(super) fn get(&self, which: Which) -> &Statement {
        // SQL lists every `Which` in declaration order.
        &self.0[which as usize]
    }
}

type Param = Box<dyn ToSql + Sync + Send>;

fn text(s: &str) -> Param {
    Box::new(s.to_string())
}

fn bytes(b: Vec<u8>) -> Param {
    Box::new(b)
}

fn json<T: serde::Serialize>(value: &T) -> Param {
    bytes(serde_json::to_vec(value).unwrap_or_default())
}

/// The statements (and their parameters) that make one change.
pub(super) fn encode(op: &StoreOp) -> Vec<(Which, Vec<Param>)> {
    let one = |which, params| vec![(which, params)];
    match op {
        StoreOp::PutAccount { account, record } => {
            one(Which::PutAccount, vec![text(account), json(record)])
        }
        StoreOp::DeleteAccount { account } => [
            Which::DeleteAccount,
            Which::DeleteKinds,
            Which::DeleteObjects,
            Which::DeleteResumes,
        ]
        .into_iter()
        .map(|which| (which, vec![text(account)]))
        .collect(),
        StoreOp::PutKind { account, info } => one(
            Which::PutKind,
            vec![text(account), text(&info.key().storage_key()), json(info)],
        ),
        StoreOp::PutObject {
            account,
            kind,
            object,
        } => one(
            Which::PutObject,
            vec![
                text(account),
                text(&kind.storage_key()),
                text(&object.uid),
                bytes(encode_object(object)),
            ],
        ),
        StoreOp::DeleteObject { account, kind, uid } => one(
            Which::DeleteObject,
            vec![text(account), text(&kind.storage_key()), text(uid)],
        ),
        StoreOp::PutResume {
            account,
            kind,
            watch_namespace,
            resource_version,
        } => one(
            Which::PutResume,
            vec![
                text(account),
                text(&kind.storage_key()),
                text(watch_namespace),
                text(resource_version),
            ],
        ),
        StoreOp::DeleteResume {
            account,
            kind,
            watch_namespace,
        } => one(
            Which::DeleteResume,
            vec![
                text(account),
                text(&kind.storage_key()),
                text(watch_namespace),
            ],
        ),
        StoreOp::PutToken { record } => one(
            Which::PutToken,
            vec![text(&record.id), json(record), text(&record.sha256)],
        ),
        StoreOp::DeleteToken { id } => one(Which::DeleteToken, vec![text(id)]),
        StoreOp::PutMeta { key, value } => one(Which::PutMeta, vec![text(key), text(value)]),
        StoreOp::PutRegistration { account, body_hash } => {
            one(Which::PutRegistration, vec![text(account), text(body_hash)])
        }
        StoreOp::DeleteRegistration { account } => {
            one(Which::DeleteRegistration, vec![text(account)])
        }
        StoreOp::PutAgentToken { record } => one(
            Which::PutAgentToken,
            vec![text(&record.id), json(record), text(&record.sha256)],
        ),
        StoreOp::DeleteAgentToken { id } => one(Which::DeleteAgentToken, vec![text(id)]),
        StoreOp::PutEnrolledIdentity { record } => one(
            Which::PutIdentity,
            vec![text(&record.identity), json(record)],
        ),
        StoreOp::PutBinding { account, binding } => {
            one(Which::PutBinding, vec![text(account), json(binding)])
        }
        StoreOp::DeleteBinding { account } => one(Which::DeleteBinding, vec![text(account)]),
        StoreOp::PutIdentityState { record } => one(
            Which::PutIdentityState,
            vec![text(&record.identity), json(record)],
        ),
        StoreOp::PutDynamicAccount { record } => one(
            Which::PutDynamicAccount,
            vec![text(&record.spec.name), json(record)],
        ),
        StoreOp::DeleteDynamicAccount { account } => {
            one(Which::DeleteDynamicAccount, vec![text(account)])
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_statement_is_at_its_index() {
        for (i, (which, _)) in SQL.iter().enumerate() {
            assert_eq!(*which as usize, i);
        }
        assert_eq!(SQL.len(), Which::DeleteDynamicAccount as usize + 1);
    }
}
