//! The operator's certificate authority and the mutual-TLS setup of QUIC.
//!
//! ```text
//!   gsharectl certs init  ──▶ <dir>/ca.pem, <dir>/ca.key
//!   gsharectl certs issue ──▶ <dir>/<name>.pem, <dir>/<name>.key  (signed by the CA)
//!   gshare-region         ──▶ QUIC server: requires a client certificate from the CA
//!                             QUIC client: presents its certificate, trusts only the CA
//!                             HTTPS API ([http_tls]): serves its certificate; forwards
//!                             to peers trust only the configured CA
//!   gsharectl --ca        ──▶ HTTPS client: trusts only that CA
//! ```
//!
//! Only TLS 1.3 and the ring provider are used (QUIC requires 1.3; ring avoids
//! the process-wide provider lookup that panics when two providers are linked).
//! The CA's distinguished name is fixed, so a node certificate can be issued
//! later from `ca.key` alone without parsing `ca.pem`.

use std::fs;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use rcgen::{
    BasicConstraints, CertificateParams, DnType, ExtendedKeyUsagePurpose, IsCa, Issuer, KeyPair,
    KeyUsagePurpose,
};
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};

/// ALPN protocol of replica-to-replica QUIC.
pub const ALPN: &[u8] = b"gshare-raft/1";

const CA_COMMON_NAME: &str = "gshare region CA";

/// A certificate or TLS setup problem.
#[derive(Debug, thiserror::Error)]
pub enum TlsError {
    /// A file could not be read or written.
    #[error("{path}: {source}")]
    Io {
        /// The file.
        path: PathBuf,
        /// The I/O error.
        source: std::io::Error,
    },
    /// A PEM file holds no usable item.
    #[error("{path}: not a usable PEM {what}: {detail}")]
    Pem {
        /// The file.
        path: PathBuf,
        /// What was expected in it.
        what: &'static str,
        /// The parser's complaint.
        detail: String,
    },
    /// The CA already exists; `init` does not overwrite it.
    #[error("{0} already exists; refusing to overwrite the CA")]
    CaExists(PathBuf),
    /// Certificate generation failed.
    #[error("certificate generation failed: {0}")]
    Generate(#[from] rcgen::Error),
    /// rustls refused the configuration.
    #[error("TLS configuration: {0}")]
    Rustls(#[from] rustls::Error),
    /// The client-certificate verifier could not be built.
    #[error("client verifier: {0}")]
    Verifier(#[from] rustls::server::VerifierBuilderError),
    /// quinn refused the rustls configuration.
    #[error("QUIC crypto: {0}")]
    Quic(String),
}

/// Paths of a replica's CA certificate, own certificate and own key.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TlsPaths {
    /// The operator's CA certificate (PEM).
    pub ca_cert: PathBuf,
    /// This replica's certificate (PEM).
    pub cert: PathBuf,
    /// This replica's private key (PEM).
    pub key: PathBuf,
}

fn ca_params() -> Result<CertificateParams, rcgen::Error> {
    let mut params = CertificateParams::new(Vec::<String>::new())?;
    params
        .distinguished_name
        .push(DnType::CommonName, CA_COMMON_NAME);
    params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    params.key_usages = vec![
        KeyUsagePurpose::KeyCertSign,
        KeyUsagePurpose::CrlSign,
        KeyUsagePurpose::DigitalSignature,
    ];
    Ok(params)
}

fn write_file(path: &Path, contents: &str, secret: bool) -> Result<(), TlsError> {
    let io = |source| TlsError::Io {
        path: path.to_path_buf(),
        source,
    };
    let mut opts = fs::OpenOptions::new();
    opts.write(true).create(true).truncate(true);
    #[cfg(unix)]
    if secret {
        use std::os::unix::fs::OpenOptionsExt;
        opts.mode(0o600);
    }
    #[cfg(not(unix))]
    let _ = secret;
    let mut f = opts.open(path).map_err(io)?;
    f.write_all(contents.as_bytes()).map_err(io)
}

fn read_to_string(path: &Path) -> Result<String, TlsError> {
    fs::read_to_string(path).map_err(|source| TlsError::Io {
        path: path.to_path_buf(),
        source,
    })
}

/// Creates a CA in `dir` (`ca.pem`, `ca.key`); refuses to overwrite one.
pub fn init_ca(dir: &Path) -> Result<(PathBuf, PathBuf), TlsError> {
    fs::create_dir_all(dir).map_err(|source| TlsError::Io {
        path: dir.to_path_buf(),
        source,
    })?;
    let cert_path = dir.join("ca.pem");
    let key_path = dir.join("ca.key");
    for p in [&cert_path, &key_path] {
        if p.exists() {
            return Err(TlsError::CaExists(p.clone()));
        }
    }
    let key = KeyPair::generate()?;
    let cert = ca_params()?.self_signed(&key)?;
    write_file(&key_path, &key.serialize_pem(), true)?;
    write_file(&cert_path, &cert.pem(), false)?;
    Ok((cert_path, key_path))
}

/// Issues a certificate for `name` signed by the CA in `dir`, valid for
/// `sans` (host names or IP addresses). Writes `<name>.pem` and `<name>.key`.
pub fn issue(dir: &Path, name: &str, sans: &[String]) -> Result<(PathBuf, PathBuf), TlsError> {
    let ca_key_path = dir.join("ca.key");
    let ca_key_pem = read_to_string(&ca_key_path)?;
    let ca_key = KeyPair::from_pem(&ca_key_pem).map_err(|e| TlsError::Pem {
        path: ca_key_path.clone(),
        what: "private key",
        detail: e.to_string(),
    })?;
    let issuer = Issuer::new(ca_params()?, ca_key);
    let mut params = CertificateParams::new(sans.to_vec())?;
    params.distinguished_name.push(DnType::CommonName, name);
    params.is_ca = IsCa::ExplicitNoCa;
    params.use_authority_key_identifier_extension = true;
    params.key_usages = vec![KeyUsagePurpose::DigitalSignature];
    params.extended_key_usages = vec![
        ExtendedKeyUsagePurpose::ServerAuth,
        ExtendedKeyUsagePurpose::ClientAuth,
    ];
    let key = KeyPair::generate()?;
    let cert = params.signed_by(&key, &issuer)?;
    let cert_path = dir.join(format!("{name}.pem"));
    let key_path = dir.join(format!("{name}.key"));
    write_file(&key_path, &key.serialize_pem(), true)?;
    write_file(&cert_path, &cert.pem(), false)?;
    Ok((cert_path, key_path))
}

/// The default SANs of a node certificate: its name, `localhost`, `127.0.0.1`.
pub fn default_sans(name: &str) -> Vec<String> {
    let mut sans = vec![
        name.to_string(),
        "localhost".to_string(),
        "127.0.0.1".to_string(),
    ];
    sans.dedup();
    sans
}

struct Loaded {
    roots: Arc<rustls::RootCertStore>,
    chain: Vec<CertificateDer<'static>>,
    key: PrivateKeyDer<'static>,
}

fn load(paths: &TlsPaths) -> Result<Loaded, TlsError> {
    let pem_err =
        |path: &Path, what: &'static str, e: rustls::pki_types::pem::Error| TlsError::Pem {
            path: path.to_path_buf(),
            what,
            detail: e.to_string(),
        };
    let ca_bytes = fs::read(&paths.ca_cert).map_err(|source| TlsError::Io {
        path: paths.ca_cert.clone(),
        source,
    })?;
    let mut roots = rustls::RootCertStore::empty();
    for c in CertificateDer::pem_slice_iter(&ca_bytes) {
        roots.add(c.map_err(|e| pem_err(&paths.ca_cert, "certificate", e))?)?;
    }
    if roots.is_empty() {
        return Err(TlsError::Pem {
            path: paths.ca_cert.clone(),
            what: "certificate",
            detail: "no certificate found".into(),
        });
    }
    let cert_bytes = fs::read(&paths.cert).map_err(|source| TlsError::Io {
        path: paths.cert.clone(),
        source,
    })?;
    let chain = CertificateDer::pem_slice_iter(&cert_bytes)
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| pem_err(&paths.cert, "certificate", e))?;
    let key_bytes = fs::read(&paths.key).map_err(|source| TlsError::Io {
        path: paths.key.clone(),
        source,
    })?;
    let key = PrivateKeyDer::from_pem_slice(&key_bytes)
        .map_err(|e| pem_err(&paths.key, "private key", e))?;
    Ok(Loaded {
        roots: Arc::new(roots),
        chain,
        key,
    })
}

fn provider() -> Arc<rustls::crypto::CryptoProvider> {
    Arc::new(rustls::crypto::ring::default_provider())
}

/// quinn server crypto: TLS 1.3, client certificates required from the CA.
pub fn server_config(paths: &TlsPaths) -> Result<quinn::ServerConfig, TlsError> {
    let l = load(paths)?;
    let verifier =
        rustls::server::WebPkiClientVerifier::builder_with_provider(l.roots, provider()).build()?;
    let mut tls = rustls::ServerConfig::builder_with_provider(provider())
        .with_protocol_versions(&[&rustls::version::TLS13])?
        .with_client_cert_verifier(verifier)
        .with_single_cert(l.chain, l.key)?;
    tls.alpn_protocols = vec![ALPN.to_vec(), gshare_core::protocol::AGENT_ALPN.to_vec()];
    let crypto = quinn::crypto::rustls::QuicServerConfig::try_from(tls)
        .map_err(|e| TlsError::Quic(e.to_string()))?;
    Ok(quinn::ServerConfig::with_crypto(Arc::new(crypto)))
}

/// quinn client crypto: trusts only the CA and presents this replica's certificate.
pub fn client_config(paths: &TlsPaths) -> Result<quinn::ClientConfig, TlsError> {
    let l = load(paths)?;
    let mut tls = rustls::ClientConfig::builder_with_provider(provider())
        .with_protocol_versions(&[&rustls::version::TLS13])?
        .with_root_certificates(l.roots)
        .with_client_auth_cert(l.chain, l.key)?;
    tls.alpn_protocols = vec![ALPN.to_vec()];
    let crypto = quinn::crypto::rustls::QuicClientConfig::try_from(tls)
        .map_err(|e| TlsError::Quic(e.to_string()))?;
    Ok(quinn::ClientConfig::new(Arc::new(crypto)))
}

pub use gshare_core::net::{http_client_config, http_server_config, TlsFileError};

/// The node a QUIC peer's certificate names (its subject common name), or
/// why there is none.
pub fn peer_name(conn: &quinn::Connection) -> Result<String, String> {
    let chain = conn
        .peer_identity()
        .and_then(|id| id.downcast::<Vec<CertificateDer<'static>>>().ok())
        .ok_or_else(|| "the peer presented no certificate".to_string())?;
    let leaf = chain
        .first()
        .ok_or_else(|| "the peer presented no certificate".to_string())?;
    gshare_core::net::certificate_name(leaf).map_err(|e| e.to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn init_refuses_overwrite_and_issue_builds_configs() {
        let dir = tempfile::tempdir().unwrap();
        init_ca(dir.path()).unwrap();
        assert!(matches!(init_ca(dir.path()), Err(TlsError::CaExists(_))));
        let (cert, key) = issue(dir.path(), "r1", &default_sans("r1")).unwrap();
        let paths = TlsPaths {
            ca_cert: dir.path().join("ca.pem"),
            cert,
            key,
        };
        server_config(&paths).unwrap();
        client_config(&paths).unwrap();
        http_server_config(&paths.cert, &paths.key).unwrap();
        http_client_config(&paths.ca_cert).unwrap();
        // The issued name is what the certificate names.
        let pem = fs::read(&paths.cert).unwrap();
        let der = CertificateDer::from_pem_slice(&pem).unwrap();
        assert_eq!(gshare_core::net::certificate_name(&der).unwrap(), "r1");
        assert!(gshare_core::net::check_certificate_names(&der, "r1").is_ok());
        let e = gshare_core::net::check_certificate_names(&der, "r2").unwrap_err();
        assert!(e.contains("\"r1\"") && e.contains("\"r2\""), "{e}");
        // A CA file without a certificate is refused by name.
        let e = http_client_config(&paths.key).unwrap_err();
        assert!(matches!(e, TlsFileError::Pem { .. }), "{e}");
        assert!(e.to_string().contains("r1.key"), "{e}");
    }

    #[test]
    fn missing_ca_key_names_the_file() {
        let dir = tempfile::tempdir().unwrap();
        let err = issue(dir.path(), "r1", &default_sans("r1")).unwrap_err();
        assert!(err.to_string().contains("ca.key"), "{err}");
    }
}
