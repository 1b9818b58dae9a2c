//! The agent's QUIC client crypto: TLS 1.3, trusts only the operator CA,
//! presents the agent's certificate (mutual TLS).

use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};
use std::path::{Path, PathBuf};
use std::sync::Arc;

use gshare_core::protocol::AGENT_ALPN;

/// Certificates could not be loaded.
#[derive(Debug, thiserror::Error)]
pub enum TlsError {
    /// A file could not be read.
    #[error("{path}: {source}")]
    Io {
        /// The file.
        path: PathBuf,
        /// Why.
        source: std::io::Error,
    },
    /// A file is not the PEM expected.
    #[error("{path}: {detail}")]
    Pem {
        /// The file.
        path: PathBuf,
        /// Why.
        detail: String,
    },
    /// rustls refused the material.
    #[error("tls: {0}")]
    Rustls(#[from] rustls::Error),
}

fn read(path: &Path) -> Result<Vec<u8>, TlsError> {
    std::fs::read(path).map_err(|source| TlsError::Io {
        path: path.to_path_buf(),
        source,
    })
}

fn pem(path: &Path, e: impl std::fmt::Display) -> TlsError {
    TlsError::Pem {
        path: path.to_path_buf(),
        detail: e.to_string(),
    }
}

/// The client config for `ca`, `cert`, `key` (PEM files).
pub fn client_config(ca: &Path, cert: &Path, key: &Path) -> Result<quinn::ClientConfig, TlsError> {
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let mut roots = rustls::RootCertStore::empty();
    for c in CertificateDer::pem_slice_iter(&read(ca)?) {
        roots.add(c.map_err(|e| pem(ca, e))?)?;
    }
    if roots.is_empty() {
        return Err(pem(ca, "no certificate found"));
    }
    let chain = CertificateDer::pem_slice_iter(&read(cert)?)
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| pem(cert, e))?;
    let key_der = PrivateKeyDer::from_pem_slice(&read(key)?).map_err(|e| pem(key, e))?;
    let mut tls = rustls::ClientConfig::builder_with_provider(provider)
        .with_protocol_versions(&[&rustls::version::TLS13])?
        .with_root_certificates(roots)
        .with_client_auth_cert(chain, key_der)?;
    tls.alpn_protocols = vec![AGENT_ALPN.to_vec()];
    let crypto =
        quinn::crypto::rustls::QuicClientConfig::try_from(tls).map_err(|e| TlsError::Pem {
            path: cert.to_path_buf(),
            detail: e.to_string(),
        })?;
    let mut config = quinn::ClientConfig::new(Arc::new(crypto));
    // A replica opens one stream per invocation it forwards, held for the
    // whole reply when it streams: room for as many as the replicas allow
    // themselves (quinn's default is 100, after which a forward waits).
    let mut transport = quinn::TransportConfig::default();
    transport.max_concurrent_bidi_streams(4096u32.into());
    config.transport_config(Arc::new(transport));
    Ok(config)
}
