//! One running replica: sled store, openraft, QUIC endpoint, write path.
//!
//! ```text
//!   ReplicaConfig ──▶ Replica::start
//!                       ├─ gshare_raft_store::open(data_dir/raft)
//!                       ├─ quinn::Endpoint (server: mTLS, client: same certs)
//!                       ├─ openraft::Raft (QuicNetwork over PeerLinks)
//!                       ├─ quic_server::serve (answers peers)
//!                       ├─ Proposer (batches writes, forwards to the leader)
//!                       └─ Scheduler (leader-only placement worker, `crate::scheduler`)
//! ```

use std::collections::{BTreeMap, BTreeSet};
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use gshare_raft_store::{ReplicaNode, StateReader, TypeConfig};
use openraft::error::{InitializeError, RaftError};
use openraft::{Config, Raft, SnapshotPolicy};

use crate::config::ReplicaConfig;
use crate::network::QuicNetwork;
use crate::peer_link::PeerLinks;
use crate::proposer::Proposer;
use crate::quic_server::{self, QuicCounters};
use crate::scheduler::Scheduler;
use crate::tls::{self, TlsError, TlsPaths};

/// A replica could not start or act.
#[derive(Debug, thiserror::Error)]
pub enum ReplicaError {
    /// The data directory could not be created or opened.
    #[error("data dir {path}: {detail}")]
    Store {
        /// The directory.
        path: String,
        /// What failed.
        detail: String,
    },
    /// Certificates are unusable.
    #[error(transparent)]
    Tls(#[from] TlsError),
    /// The QUIC endpoint could not bind.
    #[error("cannot bind QUIC on {addr}: {source}")]
    Bind {
        /// The address.
        addr: SocketAddr,
        /// The socket error.
        source: std::io::Error,
    },
    /// openraft refused its configuration or failed fatally.
    #[error("raft: {0}")]
    Raft(String),
}

/// What `--init` did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum InitOutcome {
    /// A new cluster was initialized with the configured members.
    Initialized,
    /// This replica already belongs to a cluster; nothing was changed.
    AlreadyInitialized,
}

/// Where a replica listens and how it proves who it is.
#[derive(Debug, Clone)]
pub struct ReplicaSpec {
    /// Raft id.
    pub id: u64,
    /// QUIC listen address.
    pub raft_addr: SocketAddr,
    /// HTTP address advertised to peers (the server is started separately).
    pub http_addr: SocketAddr,
    /// Data directory.
    pub data_dir: std::path::PathBuf,
    /// Certificates.
    pub tls: TlsPaths,
    /// Applied entries between two snapshots.
    pub snapshot_every: u64,
    /// Log entries kept behind the last snapshot.
    pub keep_logs: u64,
    /// The leader's node liveness graces.
    pub liveness: gshare_core::state::LivenessRules,
    /// The leader's autoscaler constants (`[autoscale]`).
    pub autoscale: gshare_core::autoscale::Params,
}

impl From<&ReplicaConfig> for ReplicaSpec {
    fn from(c: &ReplicaConfig) -> Self {
        ReplicaSpec {
            id: c.id,
            raft_addr: c.raft_addr,
            http_addr: c.http_addr,
            data_dir: c.data_dir.clone(),
            tls: c.tls.clone(),
            snapshot_every: c.snapshot_every,
            keep_logs: c.keep_logs,
            liveness: c.liveness,
            autoscale: c.autoscale,
        }
    }
}

/// A running replica.
#[derive(Clone)]
pub struct Replica {
    /// Raft id.
    pub id: u64,
    /// This replica's address card.
    pub node: ReplicaNode,
    /// openraft handle.
    pub raft: Raft<TypeConfig>,
    /// Read access to applied state.
    pub state: StateReader,
    /// The write path.
    pub proposer: Proposer,
    /// QUIC server counters.
    pub counters: Arc<QuicCounters>,
    /// Node agents connected to this replica.
    pub agents: crate::agents::AgentHub,
    /// Placement: evaluations → plans → Raft entries (acts while this replica leads).
    pub scheduler: Scheduler,
    endpoint: quinn::Endpoint,
}

impl std::fmt::Debug for Replica {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Replica")
            .field("id", &self.id)
            .field("node", &self.node)
            .finish_non_exhaustive()
    }
}

/// openraft settings of the region: ~1 s failover, snapshots every
/// `snapshot_every` applied entries keeping `keep_logs` entries behind them.
pub fn raft_config(snapshot_every: u64, keep_logs: u64) -> Result<Config, ReplicaError> {
    Config {
        cluster_name: "gshare-region".into(),
        heartbeat_interval: 100,
        election_timeout_min: 500,
        election_timeout_max: 1000,
        max_payload_entries: 256,
        snapshot_policy: SnapshotPolicy::LogsSinceLast(snapshot_every),
        max_in_snapshot_log_to_keep: keep_logs,
        snapshot_max_chunk_size: 1 << 20,
        ..Default::default()
    }
    .validate()
    .map_err(|e| ReplicaError::Raft(e.to_string()))
}

fn transport() -> quinn::TransportConfig {
    let mut t = quinn::TransportConfig::default();
    t.max_concurrent_bidi_streams(4096u32.into());
    // A dead peer is noticed after 2 s of silence; until then a write
    // forwarded to it waits. Keep-alives keep quiet links open.
    t.keep_alive_interval(Some(Duration::from_millis(400)));
    if let Ok(idle) = quinn::IdleTimeout::try_from(Duration::from_secs(2)) {
        t.max_idle_timeout(Some(idle));
    }
    t
}

impl Replica {
    /// Opens the store, binds QUIC and starts Raft. Must run inside a tokio runtime.
    pub async fn start(spec: &ReplicaSpec) -> Result<Replica, ReplicaError> {
        Self::start_with_clock(spec, gshare_core::clock::SystemClock::shared()).await
    }

    /// [`Replica::start`] with the clock the replica reads (the leader's
    /// command stamps, the scheduler, the API, the agents' hub): a
    /// `ManualClock` in tests.
    pub async fn start_with_clock(
        spec: &ReplicaSpec,
        clock: gshare_core::clock::SharedClock,
    ) -> Result<Replica, ReplicaError> {
        let raft_dir = spec.data_dir.join("raft");
        std::fs::create_dir_all(&raft_dir).map_err(|e| ReplicaError::Store {
            path: raft_dir.display().to_string(),
            detail: e.to_string(),
        })?;
        let (log, sm) = gshare_raft_store::open(&raft_dir).map_err(|e| ReplicaError::Store {
            path: raft_dir.display().to_string(),
            detail: e.to_string(),
        })?;
        let state = sm.reader();

        let transport = Arc::new(transport());
        let mut server = tls::server_config(&spec.tls)?;
        server.transport_config(transport.clone());
        let mut client = tls::client_config(&spec.tls)?;
        client.transport_config(transport);
        let mut endpoint = quinn::Endpoint::server(server, spec.raft_addr).map_err(|source| {
            ReplicaError::Bind {
                addr: spec.raft_addr,
                source,
            }
        })?;
        endpoint.set_default_client_config(client);
        let links = PeerLinks::new(endpoint.clone());

        let config = Arc::new(raft_config(spec.snapshot_every, spec.keep_logs)?);
        let raft = Raft::new(spec.id, config, QuicNetwork::new(links.clone()), log, sm)
            .await
            .map_err(|e| ReplicaError::Raft(e.to_string()))?;
        let counters = Arc::new(QuicCounters::default());
        // One clock for the leader's stamps, the scheduler, the API and the
        // agents' hub.
        let proposer = Proposer::start(raft.clone(), links.clone(), clock.clone());
        let agents = crate::agents::AgentHub::new(proposer.clone(), state.clone(), clock)
            .with_metrics(raft.metrics())
            .with_peers(spec.id, links.clone());
        let scheduler = Scheduler::start(
            spec.id,
            raft.clone(),
            state.clone(),
            proposer.clone(),
            links,
        );
        scheduler.watch_liveness(agents.clone(), spec.liveness);
        scheduler.watch_load(agents.clone(), spec.autoscale);
        scheduler.watch_migrations(agents.clone());
        agents.watch_cut_off();
        tokio::spawn(quic_server::serve(
            endpoint.clone(),
            raft.clone(),
            counters.clone(),
            agents.clone(),
            scheduler.clone(),
        ));
        Ok(Replica {
            id: spec.id,
            node: ReplicaNode {
                raft_addr: spec.raft_addr.to_string(),
                http_addr: spec.http_addr.to_string(),
            },
            raft,
            state,
            proposer,
            counters,
            agents,
            scheduler,
            endpoint,
        })
    }

    /// Initializes a new cluster of `members` unless this replica already
    /// belongs to one (then nothing changes).
    pub async fn initialize(
        &self,
        members: BTreeMap<u64, ReplicaNode>,
    ) -> Result<InitOutcome, ReplicaError> {
        if self
            .raft
            .is_initialized()
            .await
            .map_err(|e| ReplicaError::Raft(e.to_string()))?
        {
            return Ok(InitOutcome::AlreadyInitialized);
        }
        match self.raft.initialize(members).await {
            Ok(()) => Ok(InitOutcome::Initialized),
            Err(RaftError::APIError(InitializeError::NotAllowed(_))) => {
                Ok(InitOutcome::AlreadyInitialized)
            }
            Err(e) => Err(ReplicaError::Raft(e.to_string())),
        }
    }

    /// The voter ids of the current membership.
    pub fn voters(&self) -> BTreeSet<u64> {
        self.raft
            .metrics()
            .borrow()
            .membership_config
            .membership()
            .voter_ids()
            .collect()
    }

    /// Stops Raft and closes the QUIC endpoint.
    pub async fn shutdown(&self) {
        let _ = self.raft.shutdown().await;
        self.endpoint.close(quinn::VarInt::from_u32(0), b"shutdown");
    }
}
