//! The persistence vocabulary: one change to persist. The pure books (cache, registry,
//! tokens, agent tokens, dynamic accounts) push these as the effects of their mutations, and
//! the store's backends write them, one transaction per batch.

use std::sync::Arc;

use crate::{
    dynamic_accounts::DynamicAccountRecord,
    object::{CachedObject, KindInfo, KindKey},
    records::{
        AccountBinding, AccountRecord, AgentIdentityState, AgentTokenRecord, EnrolledIdentity,
        TokenRecord,
    },
};

/// One change to persist.
#[derive(Clone, Debug)]
pub enum StoreOp {
    PutAccount {
        account: String,
        record: AccountRecord,
    },
    DeleteAccount {
        account: String,
    },
    PutKind {
        account: String,
        info: KindInfo,
    },
    PutObject {
        account: String,
        kind: KindKey,
        /// Shared with the cache.
        object: Arc<CachedObject>,
    },
    DeleteObject {
        account: String,
        kind: KindKey,
        uid: String,
    },
    PutResume {
        account: String,
        kind: KindKey,
        watch_namespace: String,
        resource_version: String,
    },
    DeleteResume {
        account: String,
        kind: KindKey,
        watch_namespace: String,
    },
    PutToken {
        record: TokenRecord,
    },
    DeleteToken {
        id: String,
    },
    PutMeta {
        key: String,
        value: String,
    },
    PutRegistration {
        account: String,
        body_hash: String,
    },
    DeleteRegistration {
        account: String,
    },
    PutAgentToken {
        record: AgentTokenRecord,
    },
    DeleteAgentToken {
        id: String,
    },
    PutEnrolledIdentity {
        record: EnrolledIdentity,
    },
    PutBinding {
        account: String,
        binding: AccountBinding,
    },
    /// An admin released an orphaned account's binding (the name is free to bind again).
    DeleteBinding {
        account: String,
    },
    /// An admin disabled or enabled an identity, or denied one of its certificates.
    PutIdentityState {
        record: AgentIdentityState,
    },
    PutDynamicAccount {
        record: DynamicAccountRecord,
    },
    DeleteDynamicAccount {
        account: String,
    },
}

impl StoreOp {
    /// Ops that must be on disk before the hub answers (a token it showed to someone, the
    /// key that derives tokens): their batch is committed durably.
    pub fn needs_durability(&self) -> bool {
        matches!(
            self,
            StoreOp::PutToken { .. }
                | StoreOp::DeleteToken { .. }
                | StoreOp::PutMeta { .. }
                | StoreOp::PutAgentToken { .. }
                | StoreOp::DeleteAgentToken { .. }
                | StoreOp::PutEnrolledIdentity { .. }
                | StoreOp::PutBinding { .. }
                | StoreOp::DeleteBinding { .. }
                | StoreOp::PutIdentityState { .. }
                | StoreOp::PutDynamicAccount { .. }
                | StoreOp::DeleteDynamicAccount { .. }
        )
    }
}
