//! Reading the PEM files the TLS flags name, checked when the flags are read so that a wrong
//! file fails at once, naming the flag and the file.

use std::path::Path;

use rustls::pki_types::{CertificateDer, PrivateKeyDer, pem::PemObject as _};

use crate::error::{HubError, Result};

/// Reads the PEM file `flag` names and checks it holds at least one certificate, so a wrong
/// file fails here, naming the flag, rather than later in rustls with "no root trust anchors".
pub(super) fn read_certs(flag: &'static str, path: &Path) -> Result<Vec<u8>> {
    let pem = read_tls_file(flag, path)?;
    let certs = CertificateDer::pem_slice_iter(&pem)
        .collect::<std::result::Result<Vec<_>, _>>()
        .map_err(|e| tls_file_error(flag, path, format!("not valid PEM ({e})")))?;
    if certs.is_empty() {
        return Err(tls_file_error(
            flag,
            path,
            format!(
                "no certificate in the file: point {flag} at a PEM file with a \"BEGIN CERTIFICATE\" block"
            ),
        ));
    }
    Ok(pem)
}

/// Reads the PEM file `flag` names and checks it holds a private key.
pub(super) fn read_key(flag: &'static str, path: &Path) -> Result<Vec<u8>> {
    let pem = read_tls_file(flag, path)?;
    PrivateKeyDer::from_pem_slice(&pem).map_err(|e| {
        tls_file_error(
            flag,
            path,
            format!("no private key in the file ({e}): point {flag} at the PEM private key"),
        )
    })?;
    Ok(pem)
}

fn read_tls_file(flag: &'static str, path: &Path) -> Result<Vec<u8>> {
    std::fs::read(path).map_err(|e| tls_file_error(flag, path, format!("cannot be read: {e}")))
}

fn tls_file_error(flag: &'static str, path: &Path, problem: String) -> HubError {
    HubError::TlsFile {
        flag,
        path: path.to_path_buf(),
        problem,
    }
}
