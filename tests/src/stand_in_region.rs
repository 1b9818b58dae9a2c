//! A stand-in region replica for agent tests: a quinn server with an
//! operator CA of its own that speaks core's agent protocol. It accepts
//! agents (mutual TLS, ALPN `gshare-agent/1`), answers `Register` with
//! `Registered`, `Usage` with `UsageAck`, everything else with `Ack`, keeps what the agents
//! report in the replica's own [`AgentReports`] (latest heartbeat, swap
//! counts), and hands each registered connection to the test, which pushes
//! assignments and tokens or forwards invocations on it.

use gshare_core::model::GpuId;
use gshare_core::protocol::{
    AgentMessage, AgentMessageV1, FunctionLoad, RegionMessage, RegionMessageV1, AGENT_ALPN,
};
use gshare_core::state::InstanceId;
use gshare_edge::wire::{read_frame, write_frame};
use gshare_region::agents::AgentReports;
use rcgen::{CertificateParams, DnType, IsCa, Issuer, KeyPair};
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};
use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use tokio::sync::mpsc;

/// A test CA.
pub struct Ca {
    /// Its issuer.
    pub issuer: Issuer<'static, KeyPair>,
    /// Its certificate (PEM).
    pub pem: String,
}

/// A fresh CA.
pub fn new_ca() -> Ca {
    let key = KeyPair::generate().unwrap();
    let mut p = CertificateParams::new(Vec::<String>::new()).unwrap();
    p.is_ca = IsCa::Ca(rcgen::BasicConstraints::Unconstrained);
    p.distinguished_name.push(DnType::CommonName, "test CA");
    let cert = p.self_signed(&key).unwrap();
    let pem = cert.pem();
    Ca {
        issuer: Issuer::new(p, key),
        pem,
    }
}

/// A certificate + key (PEM) for `name`, valid for localhost and 127.0.0.1.
pub fn issue(ca: &Ca, name: &str) -> (String, String) {
    let key = KeyPair::generate().unwrap();
    let mut p = CertificateParams::new(vec!["localhost".into(), "127.0.0.1".into()]).unwrap();
    p.distinguished_name.push(DnType::CommonName, name);
    let cert = p.signed_by(&key, &ca.issuer).unwrap();
    (cert.pem(), key.serialize_pem())
}

/// A stand-in replica: accepts agents, answers Register/Heartbeat/Swaps,
/// hands each registered connection to the test.
pub struct FakeRegion {
    /// Its endpoint (close it to kill the replica).
    pub endpoint: quinn::Endpoint,
    /// Its QUIC address.
    pub addr: SocketAddr,
    /// Connections of registered agents.
    pub registered: mpsc::UnboundedReceiver<quinn::Connection>,
    /// Handshakes or first streams refused.
    pub refused: Arc<AtomicU64>,
    /// What the agents reported (the replica's own bookkeeping).
    pub reports: Arc<AgentReports>,
    /// Every load entry the agents sent, in order (the replica keeps only
    /// the latest report; a test sums these to check the agent's counts).
    pub loads: Arc<Mutex<Vec<FunctionLoad>>>,
    /// Every slice release the agents asked for (instance, GPU), in
    /// order; each is acknowledged as committed.
    pub slice_releases: Arc<Mutex<Vec<(InstanceId, GpuId)>>>,
}

/// Starts a stand-in replica on a free loopback port (call inside an actix or tokio runtime).
pub fn fake_region(ca: &Ca) -> FakeRegion {
    let (cert, key) = issue(ca, "replica");
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let mut roots = rustls::RootCertStore::empty();
    roots
        .add(CertificateDer::from_pem_slice(ca.pem.as_bytes()).unwrap())
        .unwrap();
    let verifier = rustls::server::WebPkiClientVerifier::builder_with_provider(
        Arc::new(roots),
        provider.clone(),
    )
    .build()
    .unwrap();
    let mut tls = rustls::ServerConfig::builder_with_provider(provider)
        .with_protocol_versions(&[&rustls::version::TLS13])
        .unwrap()
        .with_client_cert_verifier(verifier)
        .with_single_cert(
            vec![CertificateDer::from_pem_slice(cert.as_bytes()).unwrap()],
            PrivateKeyDer::from_pem_slice(key.as_bytes()).unwrap(),
        )
        .unwrap();
    tls.alpn_protocols = vec![AGENT_ALPN.to_vec()];
    let crypto = quinn::crypto::rustls::QuicServerConfig::try_from(tls).unwrap();
    let server = quinn::ServerConfig::with_crypto(Arc::new(crypto));
    let endpoint = quinn::Endpoint::server(server, "127.0.0.1:0".parse().unwrap()).unwrap();
    let addr = endpoint.local_addr().unwrap();
    let (tx, registered) = mpsc::unbounded_channel();
    let refused = Arc::new(AtomicU64::new(0));
    let reports = Arc::new(AgentReports::default());
    let loads = Arc::new(Mutex::new(Vec::new()));
    let (ep, refused2, reports2) = (endpoint.clone(), refused.clone(), reports.clone());
    let loads2 = loads.clone();
    let slice_releases = Arc::new(Mutex::new(Vec::new()));
    let releases2 = slice_releases.clone();
    tokio::spawn(async move {
        while let Some(incoming) = ep.accept().await {
            let tx = tx.clone();
            let refused = refused2.clone();
            let reports = reports2.clone();
            let all_loads = loads2.clone();
            let releases = releases2.clone();
            tokio::spawn(async move {
                let Ok(conn) = incoming.await else {
                    refused.fetch_add(1, Ordering::SeqCst);
                    return;
                };
                loop {
                    let Ok((mut send, mut recv)) = conn.accept_bi().await else {
                        refused.fetch_add(1, Ordering::SeqCst);
                        return;
                    };
                    let Ok(msg) = read_frame::<AgentMessage>(&mut recv).await else {
                        return;
                    };
                    let AgentMessage::V1(msg) = msg;
                    let reply = match msg {
                        AgentMessageV1::Register(r)
                        | AgentMessageV1::RegisterGpus { register: r, .. }
                        | AgentMessageV1::RegisterWith { register: r, .. } => {
                            reports.registered(conn.stable_id(), &r);
                            let _ = tx.send(conn.clone());
                            RegionMessageV1::Registered {
                                next_seq: 1,
                                leader: 1,
                            }
                        }
                        AgentMessageV1::Heartbeat(h) => {
                            reports.heartbeat(h);
                            RegionMessageV1::Ack
                        }
                        AgentMessageV1::Loads {
                            agent,
                            at_ms,
                            loads,
                            dropped,
                        } => {
                            all_loads
                                .lock()
                                .unwrap_or_else(|p| p.into_inner())
                                .extend(loads.iter().cloned());
                            reports.loads(&agent, at_ms, loads, dropped);
                            RegionMessageV1::Ack
                        }
                        AgentMessageV1::SliceRelease { instance, gpu, .. } => {
                            releases
                                .lock()
                                .unwrap_or_else(|p| p.into_inner())
                                .push((instance, gpu));
                            RegionMessageV1::Ack
                        }
                        AgentMessageV1::Swaps { agent, events } => {
                            reports.swaps(&agent, &events);
                            RegionMessageV1::Ack
                        }
                        // Usage is acknowledged (and not kept): the agent
                        // removes it from its journal as after a real region.
                        AgentMessageV1::Usage { records, .. } => RegionMessageV1::UsageAck {
                            seqs: records.iter().map(|r| r.seq).collect(),
                        },
                        _ => RegionMessageV1::Ack,
                    };
                    let _ = write_frame(&mut send, &RegionMessage::v1(reply)).await;
                }
            });
        }
    });
    FakeRegion {
        endpoint,
        addr,
        registered,
        refused,
        reports,
        loads,
        slice_releases,
    }
}
