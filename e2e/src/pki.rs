//! Certificates and keys for one local control plane: a CA, the apiserver's serving
//! certificate, an admin client certificate in `system:masters`, and the ServiceAccount
//! token signing key. Everything is made fresh per control plane and never leaves its
//! run directory. The PKI is `scale-agent-testkit`'s (the hub's tests use it too); its
//! [`CertificateError`] becomes this crate's [`Error::Certificate`](crate::Error::Certificate).

pub use scale_agent_testkit::pki::{
    CertificateAuthority, CertificateError, CertifiedKey, signing_key_pair_pem,
};
