//! The simulated network: every message between replicas, agents and
//! clients goes through [`SimNet`], which draws its fate (delay, loss,
//! duplication) from the run's seeded random source and honours the
//! nemesis's partitions and crashed nodes. Reordering follows from the
//! independent delays of messages in flight at once.

use std::collections::{BTreeMap, BTreeSet};
use std::hash::{Hash, Hasher};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use gshare_core::rng::Rng;
use gshare_raft_store::TypeConfig;
use gshare_region::peer_link::{LinkError, PeerTransport};
use gshare_region::wire::{PeerReply, PeerRequest};
use openraft::Raft;

/// A node of the simulation: replicas are 1..=R, agents 100+, clients 1000+.
pub type NodeId = u64;

/// How the network treats messages right now (the nemesis changes it).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Weather {
    /// Probability that one message is lost.
    pub loss: f64,
    /// Probability that a request is delivered twice.
    pub dup: f64,
    /// One-way delay, uniform in `[min, max]` ms.
    pub delay_ms: (u64, u64),
}

impl Weather {
    /// A healthy data-centre network: 0.2–2 ms, nothing lost.
    pub const CALM: Weather = Weather {
        loss: 0.0,
        dup: 0.0,
        delay_ms: (0, 2),
    };
}

/// Counts of what the network did, for the report.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct NetCounts {
    /// Messages sent (each hop).
    pub sent: u64,
    /// Lost to the weather.
    pub lost: u64,
    /// Dropped by a partition or a crashed end.
    pub cut: u64,
    /// Requests delivered a second time.
    pub duplicated: u64,
}

struct NetState {
    rng: Rng,
    weather: Weather,
    /// Directed links that deliver nothing.
    cut: BTreeSet<(NodeId, NodeId)>,
    /// Nodes that are up; a crashed node receives and sends nothing.
    down: BTreeSet<NodeId>,
    /// The running Raft of each replica, by its QUIC address.
    rafts: BTreeMap<String, (NodeId, Option<Raft<TypeConfig>>)>,
    counts: NetCounts,
    /// A digest of every decision the simulation made, in order: two runs
    /// of one seed must end with the same value.
    trace: std::collections::hash_map::DefaultHasher,
    /// Milliseconds of simulated time at the start, as a Unix time.
    epoch_ms: u64,
    start: tokio::time::Instant,
}

/// The network of one simulated run (cheap to clone).
#[derive(Clone)]
pub struct SimNet {
    st: Arc<Mutex<NetState>>,
}

impl std::fmt::Debug for SimNet {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SimNet").finish_non_exhaustive()
    }
}

/// What happens to one message.
#[derive(Debug, Clone, Copy)]
struct Fate {
    delay: Duration,
    lost: bool,
    dup: Option<Duration>,
}

impl SimNet {
    /// A calm network whose random choices follow from `seed`.
    pub fn new(seed: u64, epoch_ms: u64) -> SimNet {
        SimNet {
            st: Arc::new(Mutex::new(NetState {
                rng: Rng::new(seed),
                weather: Weather::CALM,
                cut: BTreeSet::new(),
                down: BTreeSet::new(),
                rafts: BTreeMap::new(),
                counts: NetCounts::default(),
                trace: std::collections::hash_map::DefaultHasher::new(),
                epoch_ms,
                start: tokio::time::Instant::now(),
            })),
        }
    }

    fn lock(&self) -> MutexGuard<'_, NetState> {
        self.st.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Draws from the run's random source (the one source of every choice).
    pub fn below(&self, n: u64) -> u64 {
        self.lock().rng.below(n.max(1))
    }

    /// A uniform draw in `[0, 1)`.
    pub fn unit(&self) -> f64 {
        self.lock().rng.unit()
    }

    /// Adds `event` to the run's digest.
    pub fn note(&self, event: impl Hash) {
        let mut st = self.lock();
        let t = st.start.elapsed().as_micros();
        t.hash(&mut st.trace);
        event.hash(&mut st.trace);
    }

    /// The run's digest so far.
    pub fn digest(&self) -> u64 {
        self.lock().trace.finish()
    }

    /// What the network did so far.
    pub fn counts(&self) -> NetCounts {
        self.lock().counts
    }

    /// Simulated milliseconds since the run began.
    pub fn elapsed_ms(&self) -> u64 {
        u64::try_from(self.lock().start.elapsed().as_millis()).unwrap_or(u64::MAX)
    }

    /// Simulated microseconds since the run began.
    pub fn elapsed_us(&self) -> u64 {
        u64::try_from(self.lock().start.elapsed().as_micros()).unwrap_or(u64::MAX)
    }

    /// The simulated wall clock (Unix ms), plus `skew_ms` for a drifting node.
    pub fn unix_ms(&self, skew_ms: i64) -> u64 {
        let st = self.lock();
        let t = st.epoch_ms + u64::try_from(st.start.elapsed().as_millis()).unwrap_or(0);
        t.saturating_add_signed(skew_ms)
    }

    /// Sets the weather.
    pub fn set_weather(&self, w: Weather) {
        self.lock().weather = w;
    }

    /// Cuts (or heals) the link `from → to`.
    pub fn set_cut(&self, from: NodeId, to: NodeId, cut: bool) {
        let mut st = self.lock();
        if cut {
            st.cut.insert((from, to));
        } else {
            st.cut.remove(&(from, to));
        }
    }

    /// Heals every partition and calms the weather.
    pub fn heal(&self) {
        let mut st = self.lock();
        st.cut.clear();
        st.weather = Weather::CALM;
    }

    /// Marks `node` crashed (`true`) or up again.
    pub fn set_down(&self, node: NodeId, down: bool) {
        let mut st = self.lock();
        if down {
            st.down.insert(node);
        } else {
            st.down.remove(&node);
        }
    }

    /// Whether `node` is up.
    pub fn is_up(&self, node: NodeId) -> bool {
        !self.lock().down.contains(&node)
    }

    /// Registers the Raft now running on replica `id` at `addr` (`None`: crashed).
    pub fn set_raft(&self, id: NodeId, addr: &str, raft: Option<Raft<TypeConfig>>) {
        self.lock().rafts.insert(addr.to_string(), (id, raft));
    }

    /// The Raft running at `addr`, if its replica is up.
    pub fn raft_at(&self, addr: &str) -> Option<(NodeId, Raft<TypeConfig>)> {
        let st = self.lock();
        let (id, raft) = st.rafts.get(addr)?;
        if st.down.contains(id) {
            return None;
        }
        raft.clone().map(|r| (*id, r))
    }

    fn fate(&self, from: NodeId, to: NodeId, may_dup: bool) -> Fate {
        let mut st = self.lock();
        st.counts.sent += 1;
        let w = st.weather;
        let (lo, hi) = w.delay_ms;
        let span = hi.saturating_sub(lo) * 1000 + 1;
        let delay = Duration::from_micros(lo * 1000 + st.rng.below(span));
        let lost = w.loss > 0.0 && st.rng.unit() < w.loss;
        let dup = if may_dup && w.dup > 0.0 && st.rng.unit() < w.dup {
            Some(Duration::from_micros(st.rng.below(span * 4)))
        } else {
            None
        };
        if lost {
            st.counts.lost += 1;
        }
        if dup.is_some() {
            st.counts.duplicated += 1;
        }
        (from, to, delay.as_micros() as u64, lost, dup.is_some()).hash(&mut st.trace);
        Fate { delay, lost, dup }
    }

    fn passes(&self, from: NodeId, to: NodeId) -> bool {
        let mut st = self.lock();
        let ok =
            !st.down.contains(&from) && !st.down.contains(&to) && !st.cut.contains(&(from, to));
        if !ok {
            st.counts.cut += 1;
        }
        ok
    }

    /// Carries one message `from → to`: waits its delay and says whether it
    /// arrived (`false`: lost, cut, or an end is down). Never returns early
    /// for a lost message: the sender learns of a loss only by its timeout.
    pub async fn hop(&self, from: NodeId, to: NodeId) -> bool {
        let f = self.fate(from, to, false);
        tokio::time::sleep(f.delay).await;
        !f.lost && self.passes(from, to)
    }

    /// One replica-to-replica call, answered by the target's Raft through
    /// the same function the QUIC server uses (`answer_raft`).
    async fn call(&self, from: NodeId, addr: &str, req: &PeerRequest) -> Result<PeerReply, String> {
        let Some((to, _)) = self.raft_at(addr) else {
            // Down or unknown: the request goes nowhere; the caller times out.
            std::future::pending::<()>().await;
            unreachable!("pending never resolves")
        };
        let f = self.fate(from, to, true);
        tokio::time::sleep(f.delay).await;
        if f.lost || !self.passes(from, to) {
            std::future::pending::<()>().await;
        }
        let Some((_, raft)) = self.raft_at(addr) else {
            std::future::pending::<()>().await;
            unreachable!("pending never resolves")
        };
        // Every request and reply crosses the replicas' codec (bincode), as on QUIC.
        let copy = || -> Result<PeerRequest, String> {
            let bytes = gshare_raft_store::encode(req).map_err(|e| e.to_string())?;
            gshare_raft_store::decode(&bytes).map_err(|e| e.to_string())
        };
        // Only Raft's own messages are duplicated (a copy answered later,
        // its reply thrown away: Raft must shrug off a stale duplicate). A
        // forwarded write is never: QUIC streams do not re-deliver, and the
        // proposer's forward is one request whose loss is an unknown outcome.
        let raft_rpc = matches!(
            req,
            PeerRequest::Append(_) | PeerRequest::Vote(_) | PeerRequest::Snapshot(_)
        );
        if let Some(extra) = f.dup.filter(|_| raft_rpc) {
            let (net, raft, req) = (self.clone(), raft.clone(), copy()?);
            tokio::spawn(async move {
                tokio::time::sleep(extra).await;
                if net.passes(from, to) && net.is_up(to) {
                    let clock = net.clone();
                    let _ = gshare_region::quic_server::answer_raft(&raft, req, move || {
                        clock.unix_ms(0)
                    })
                    .await;
                }
            });
        }
        let clock = self.clone();
        let reply =
            gshare_region::quic_server::answer_raft(&raft, copy()?, move || clock.unix_ms(0))
                .await
                .map_err(|other| format!("not a Raft request: {other:?}"))?;
        let bytes = gshare_raft_store::encode(&reply).map_err(|e| e.to_string())?;
        let reply: PeerReply = gshare_raft_store::decode(&bytes).map_err(|e| e.to_string())?;
        let back = self.fate(to, from, false);
        tokio::time::sleep(back.delay).await;
        if back.lost || !self.passes(to, from) {
            std::future::pending::<()>().await;
        }
        Ok(reply)
    }
}

/// One replica's view of the network: its calls to the others.
#[derive(Debug, Clone)]
pub struct SimLinks {
    /// The network.
    pub net: SimNet,
    /// The calling node.
    pub from: NodeId,
}

impl PeerTransport for SimLinks {
    async fn call(
        &self,
        addr: &str,
        req: &PeerRequest,
        ttl: Duration,
    ) -> Result<PeerReply, LinkError> {
        // Lost messages surface as timeouts, never `Unreachable`: openraft
        // backs off on `Unreachable` in an unbiased `tokio::select!`, whose
        // choice between two ready branches tokio draws from an unseedable
        // source (without `--cfg tokio_unstable`), which would break replay.
        match tokio::time::timeout(ttl, self.net.call(self.from, addr, req)).await {
            Ok(Ok(reply)) => Ok(reply),
            Ok(Err(detail)) => Err(LinkError::Call {
                addr: addr.to_string(),
                source: gshare_core::net::WireError::Stream(detail),
            }),
            Err(_) => Err(LinkError::Timeout {
                addr: addr.to_string(),
            }),
        }
    }
}
