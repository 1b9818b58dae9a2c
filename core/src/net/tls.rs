//! Helpers the binaries' TLS set-up shares (feature `net`): the name a
//! certificate is issued for, and the rustls configs of HTTPS listeners
//! (the replicas' API, the agents' ingress) and of clients that trust only
//! the operator's CA. The ring provider throughout (never the process-wide
//! default, which panics when two providers are linked).
//!
//! `gsharectl certs issue --name <node>` writes the name as the
//! certificate's subject common name; an agent is the node its certificate
//! names. Both the agent (its own certificate against its config, at start)
//! and the region (the peer certificate of a registering agent against the
//! node it claims) compare with [`certificate_name`].

use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};
use std::path::{Path, PathBuf};
use std::sync::Arc;

/// A certificate or key file could not be used.
#[derive(Debug, thiserror::Error)]
pub enum TlsFileError {
    /// A file could not be read.
    #[error("{path}: {source}")]
    Io {
        /// The file.
        path: PathBuf,
        /// Why.
        source: std::io::Error,
    },
    /// A file holds no usable PEM item.
    #[error("{path}: not a usable PEM {what}: {detail}")]
    Pem {
        /// The file.
        path: PathBuf,
        /// What was expected in it.
        what: &'static str,
        /// Why.
        detail: String,
    },
    /// rustls refused the material.
    #[error("TLS configuration: {0}")]
    Rustls(#[from] rustls::Error),
}

fn read(path: &Path) -> Result<Vec<u8>, TlsFileError> {
    std::fs::read(path).map_err(|source| TlsFileError::Io {
        path: path.to_path_buf(),
        source,
    })
}

fn pem(path: &Path, what: &'static str, detail: impl std::fmt::Display) -> TlsFileError {
    TlsFileError::Pem {
        path: path.to_path_buf(),
        what,
        detail: detail.to_string(),
    }
}

fn provider() -> Arc<rustls::crypto::CryptoProvider> {
    Arc::new(rustls::crypto::ring::default_provider())
}

/// The certificates of a PEM file (at least one).
pub fn read_certificates(path: &Path) -> Result<Vec<CertificateDer<'static>>, TlsFileError> {
    let chain = CertificateDer::pem_slice_iter(&read(path)?)
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| pem(path, "certificate", e))?;
    if chain.is_empty() {
        return Err(pem(path, "certificate", "no certificate found"));
    }
    Ok(chain)
}

/// The HTTPS server config of an HTTP listener: TLS 1.2 or 1.3, no client
/// certificates (callers authenticate with bearer tokens), ALPN `http/1.1`.
pub fn http_server_config(cert: &Path, key: &Path) -> Result<rustls::ServerConfig, TlsFileError> {
    let chain = read_certificates(cert)?;
    let key_der =
        PrivateKeyDer::from_pem_slice(&read(key)?).map_err(|e| pem(key, "private key", e))?;
    let mut tls = rustls::ServerConfig::builder_with_provider(provider())
        .with_safe_default_protocol_versions()?
        .with_no_client_auth()
        .with_single_cert(chain, key_der)?;
    tls.alpn_protocols = vec![b"http/1.1".to_vec()];
    Ok(tls)
}

/// The HTTPS client config that trusts only the CA certificates in `ca`
/// (PEM), with no client certificate.
pub fn http_client_config(ca: &Path) -> Result<rustls::ClientConfig, TlsFileError> {
    let mut roots = rustls::RootCertStore::empty();
    for c in read_certificates(ca)? {
        roots.add(c)?;
    }
    let mut tls = rustls::ClientConfig::builder_with_provider(provider())
        .with_safe_default_protocol_versions()?
        .with_root_certificates(roots)
        .with_no_client_auth();
    tls.alpn_protocols = vec![b"http/1.1".to_vec()];
    Ok(tls)
}

/// Checks that the first certificate of the PEM file `cert` is issued for
/// `node` (an agent at start, against its config).
pub fn check_certificate_file(cert: &Path, node: &str) -> Result<(), String> {
    let chain = read_certificates(cert).map_err(|e| e.to_string())?;
    check_certificate_names(&chain[0], node).map_err(|e| format!("{}: {e}", cert.display()))
}

/// A certificate whose name cannot be read.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum CertNameError {
    /// The bytes are not an X.509 certificate.
    #[error("not an X.509 certificate: {0}")]
    Malformed(String),
    /// The subject has no common name, or more than one, or one that is not text.
    #[error("the certificate's subject has no single common name (issued by `gsharectl certs issue --name <node>`?)")]
    NoCommonName,
}

/// The subject common name of a DER-encoded certificate.
pub fn certificate_name(der: &[u8]) -> Result<String, CertNameError> {
    let (_, cert) = x509_parser::parse_x509_certificate(der)
        .map_err(|e| CertNameError::Malformed(e.to_string()))?;
    let mut names = cert.subject().iter_common_name();
    let first = names.next().ok_or(CertNameError::NoCommonName)?;
    if names.next().is_some() {
        return Err(CertNameError::NoCommonName);
    }
    first
        .as_str()
        .map(str::to_string)
        .map_err(|_| CertNameError::NoCommonName)
}

/// Checks that the certificate `der` is issued for `node`; the error says
/// both names.
pub fn check_certificate_names(der: &[u8], node: &str) -> Result<(), String> {
    match certificate_name(der) {
        Ok(name) if name == node => Ok(()),
        Ok(name) => Err(format!(
            "the certificate is issued for {name:?}, not for node {node:?} \
             (issue one with `gsharectl certs issue --name {node}`)"
        )),
        Err(e) => Err(format!("node {node:?}: {e}")),
    }
}

/// The files of `files` (paths relative to `base`) that cannot be opened,
/// each as an issue at the key that names it; a missing TLS file says
/// which `gsharectl certs` command makes it.
pub fn missing_files(
    base: &Path,
    files: &[&crate::config::FileRef],
) -> Vec<crate::config::ConfigIssue> {
    files
        .iter()
        .filter_map(|f| {
            let p = base.join(&f.path);
            match std::fs::metadata(&p) {
                Ok(_) => None,
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                    Some(f.issue(format!("{} does not exist{}", p.display(), f.tls_hint())))
                }
                Err(e) => Some(f.issue(format!("{}: {e}", p.display()))),
            }
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn garbage_is_not_a_certificate() {
        assert!(matches!(
            certificate_name(b"not a certificate"),
            Err(CertNameError::Malformed(_))
        ));
        assert!(check_certificate_names(b"x", "n1").is_err());
    }
}
