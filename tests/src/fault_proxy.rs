//! A UDP fault proxy for chaos tests: sits between agents and a region
//! replica (QUIC runs over UDP) and drops, delays or cuts traffic on command.
//!
//! ```text
//!   client A ─┐                    ┌─ session socket A ─┐
//!   client B ─┼─▶ front (addr()) ──┼─ session socket B ─┼──▶ upstream
//!             ◀──────── faults ToClient ◀───────────────┘   (faults ToUpstream on the way in)
//! ```
//!
//! Each client address gets its own socket towards the upstream, so replies
//! find their way back. Faults are set per direction at run time
//! ([`FaultProxy::set`], [`cut`](FaultProxy::cut), [`heal`](FaultProxy::heal)
//! …) and apply to the next datagram: `cut` drops everything, `drop_probability`
//! drops each datagram with a seeded generator (same seed, same datagrams
//! in the same order → same drops), `delay` holds each datagram that long
//! (FIFO per direction; lowering the delay can reorder in-flight datagrams,
//! as a real network may).
//!
//! Bounded: at most `max_sessions` client addresses (later ones are
//! dropped and counted) and `queue_datagrams` delayed datagrams per
//! direction (overflow is dropped and counted). Dropping the `FaultProxy`
//! stops all its tasks and closes its sockets. It needs a tokio runtime.

use gshare_core::rng::Rng;
use std::collections::HashMap;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::net::UdpSocket;
use tokio::sync::mpsc;
use tokio::task::AbortHandle;
use tokio::time::Instant;

/// Largest datagram forwarded.
const MAX_DATAGRAM: usize = 64 * 1024;

/// Which way a datagram travels.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Direction {
    /// From a client to the upstream.
    ToUpstream,
    /// From the upstream back to a client.
    ToClient,
}

impl Direction {
    fn index(self) -> usize {
        match self {
            Direction::ToUpstream => 0,
            Direction::ToClient => 1,
        }
    }
}

/// The faults applied to one direction.
#[derive(Debug, Clone, Copy, PartialEq, Default)]
pub struct Faults {
    /// Drop everything.
    pub cut: bool,
    /// Drop each datagram with this probability (0.0..=1.0).
    pub drop_probability: f64,
    /// Hold each datagram this long before forwarding it.
    pub delay: Duration,
}

/// Bounds of a proxy.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ProxyLimits {
    /// Most client addresses served at once.
    pub max_sessions: usize,
    /// Most delayed datagrams held per direction.
    pub queue_datagrams: usize,
}

impl Default for ProxyLimits {
    fn default() -> Self {
        Self {
            max_sessions: 256,
            queue_datagrams: 4096,
        }
    }
}

/// Counters of one direction.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct DirectionStats {
    /// Datagrams forwarded (after their delay).
    pub forwarded: u64,
    /// Datagrams dropped by `cut` or `drop_probability`.
    pub dropped: u64,
    /// Datagrams dropped because a bound was reached (queue or sessions).
    pub overflowed: u64,
}

#[derive(Default)]
struct Counters {
    /// Delayed datagrams held now (bounded by `queue_datagrams`).
    held: AtomicU64,
    forwarded: AtomicU64,
    dropped: AtomicU64,
    overflowed: AtomicU64,
}

struct Control {
    faults: Mutex<[Faults; 2]>,
    rng: Mutex<Rng>,
    counters: [Counters; 2],
    tasks: Mutex<Vec<AbortHandle>>,
    sessions: Mutex<HashMap<SocketAddr, Arc<UdpSocket>>>,
    limits: ProxyLimits,
}

/// What to do with one datagram.
enum Verdict {
    Drop,
    Now,
    After(Duration),
}

impl Control {
    fn verdict(&self, dir: Direction) -> Verdict {
        let f = self.faults.lock().unwrap_or_else(|p| p.into_inner())[dir.index()];
        let counters = &self.counters[dir.index()];
        if f.cut {
            counters.dropped.fetch_add(1, Ordering::Relaxed);
            return Verdict::Drop;
        }
        if f.drop_probability > 0.0 {
            let draw = self.rng.lock().unwrap_or_else(|p| p.into_inner()).unit();
            if draw < f.drop_probability {
                counters.dropped.fetch_add(1, Ordering::Relaxed);
                return Verdict::Drop;
            }
        }
        if f.delay.is_zero() {
            Verdict::Now
        } else {
            Verdict::After(f.delay)
        }
    }

    fn track(&self, handle: AbortHandle) {
        self.tasks
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .push(handle);
    }
}

/// A datagram waiting out its delay.
struct Held {
    at: Instant,
    socket: Arc<UdpSocket>,
    to: Option<SocketAddr>,
    data: Vec<u8>,
}

/// A running UDP fault proxy; dropping it stops it.
pub struct FaultProxy {
    addr: SocketAddr,
    upstream: SocketAddr,
    control: Arc<Control>,
}

impl std::fmt::Debug for FaultProxy {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("FaultProxy")
            .field("addr", &self.addr)
            .field("upstream", &self.upstream)
            .finish()
    }
}

fn unspecified_like(addr: SocketAddr) -> SocketAddr {
    let ip = match addr.ip() {
        IpAddr::V4(ip) if ip.is_loopback() => IpAddr::V4(Ipv4Addr::LOCALHOST),
        IpAddr::V4(_) => IpAddr::V4(Ipv4Addr::UNSPECIFIED),
        IpAddr::V6(ip) if ip.is_loopback() => IpAddr::V6(Ipv6Addr::LOCALHOST),
        IpAddr::V6(_) => IpAddr::V6(Ipv6Addr::UNSPECIFIED),
    };
    SocketAddr::new(ip, 0)
}

async fn send(held: &Held) {
    // A failed send is a lost datagram, as on a real network.
    let _ = match held.to {
        Some(to) => held.socket.send_to(&held.data, to).await,
        None => held.socket.send(&held.data).await,
    };
}

impl FaultProxy {
    /// Starts a proxy on a free loopback port forwarding to `upstream`.
    pub async fn start(upstream: SocketAddr, seed: u64) -> std::io::Result<Self> {
        Self::start_with(
            unspecified_like(upstream),
            upstream,
            seed,
            ProxyLimits::default(),
        )
        .await
    }

    /// Starts a proxy listening on `listen` (port 0: any free port).
    pub async fn start_with(
        listen: SocketAddr,
        upstream: SocketAddr,
        seed: u64,
        limits: ProxyLimits,
    ) -> std::io::Result<Self> {
        let front = Arc::new(UdpSocket::bind(listen).await?);
        let addr = front.local_addr()?;
        let control = Arc::new(Control {
            faults: Mutex::new([Faults::default(); 2]),
            rng: Mutex::new(Rng::new(seed)),
            counters: Default::default(),
            tasks: Mutex::new(Vec::new()),
            sessions: Mutex::new(HashMap::new()),
            limits,
        });
        let mut queues = Vec::new();
        for dir in [Direction::ToUpstream, Direction::ToClient] {
            let (tx, mut rx) = mpsc::unbounded_channel::<Held>();
            let c = control.clone();
            let task = tokio::spawn(async move {
                while let Some(held) = rx.recv().await {
                    tokio::time::sleep_until(held.at).await;
                    send(&held).await;
                    let counters = &c.counters[dir.index()];
                    counters.held.fetch_sub(1, Ordering::Relaxed);
                    counters.forwarded.fetch_add(1, Ordering::Relaxed);
                }
            });
            control.track(task.abort_handle());
            queues.push(tx);
        }
        let to_client = queues.pop().expect("two queues");
        let to_upstream = queues.pop().expect("two queues");
        let c = control.clone();
        let task = tokio::spawn(front_loop(c, front, upstream, to_upstream, to_client));
        control.track(task.abort_handle());
        Ok(Self {
            addr,
            upstream,
            control,
        })
    }

    /// Where clients send (instead of the upstream).
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// The address traffic is forwarded to.
    pub fn upstream(&self) -> SocketAddr {
        self.upstream
    }

    /// Sets the faults of one direction.
    pub fn set(&self, dir: Direction, faults: Faults) {
        self.control
            .faults
            .lock()
            .unwrap_or_else(|p| p.into_inner())[dir.index()] = faults;
    }

    /// The faults of one direction.
    pub fn faults(&self, dir: Direction) -> Faults {
        self.control
            .faults
            .lock()
            .unwrap_or_else(|p| p.into_inner())[dir.index()]
    }

    fn update_both(&self, f: impl Fn(&mut Faults)) {
        let mut all = self
            .control
            .faults
            .lock()
            .unwrap_or_else(|p| p.into_inner());
        all.iter_mut().for_each(f);
    }

    /// Drops all traffic, both directions.
    pub fn cut(&self) {
        self.update_both(|f| f.cut = true);
    }

    /// Removes every fault, both directions.
    pub fn heal(&self) {
        self.update_both(|f| *f = Faults::default());
    }

    /// Drops each datagram with probability `p`, both directions.
    pub fn set_drop_probability(&self, p: f64) {
        self.update_both(|f| f.drop_probability = p.clamp(0.0, 1.0));
    }

    /// Delays each datagram by `d`, both directions.
    pub fn set_delay(&self, d: Duration) {
        self.update_both(|f| f.delay = d);
    }

    /// Counters of one direction.
    pub fn stats(&self, dir: Direction) -> DirectionStats {
        let c = &self.control.counters[dir.index()];
        DirectionStats {
            forwarded: c.forwarded.load(Ordering::Relaxed),
            dropped: c.dropped.load(Ordering::Relaxed),
            overflowed: c.overflowed.load(Ordering::Relaxed),
        }
    }

    /// Client addresses being served.
    pub fn sessions(&self) -> usize {
        self.control
            .sessions
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .len()
    }
}

impl Drop for FaultProxy {
    fn drop(&mut self) {
        for t in self
            .control
            .tasks
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .drain(..)
        {
            t.abort();
        }
        self.control
            .sessions
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clear();
    }
}

fn dispatch(
    control: &Control,
    dir: Direction,
    queue: &mpsc::UnboundedSender<Held>,
    socket: &Arc<UdpSocket>,
    to: Option<SocketAddr>,
    data: &[u8],
) -> Option<Held> {
    let at = match control.verdict(dir) {
        Verdict::Drop => return None,
        Verdict::Now => Instant::now(),
        Verdict::After(d) => Instant::now() + d,
    };
    let held = Held {
        at,
        socket: socket.clone(),
        to,
        data: data.to_vec(),
    };
    if at <= Instant::now() {
        return Some(held);
    }
    let counters = &control.counters[dir.index()];
    let limit = control.limits.queue_datagrams as u64;
    let admitted = counters
        .held
        .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |h| {
            (h < limit).then_some(h + 1)
        })
        .is_ok();
    if !admitted || queue.send(held).is_err() {
        counters.overflowed.fetch_add(1, Ordering::Relaxed);
    }
    None
}

async fn front_loop(
    control: Arc<Control>,
    front: Arc<UdpSocket>,
    upstream: SocketAddr,
    to_upstream: mpsc::UnboundedSender<Held>,
    to_client: mpsc::UnboundedSender<Held>,
) {
    let mut buf = vec![0u8; MAX_DATAGRAM];
    loop {
        let Ok((n, client)) = front.recv_from(&mut buf).await else {
            // ICMP-induced errors on some platforms: keep serving.
            tokio::time::sleep(Duration::from_millis(5)).await;
            continue;
        };
        let existing = control
            .sessions
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .get(&client)
            .cloned();
        let session = match existing {
            Some(s) => s,
            None => {
                let full = control
                    .sessions
                    .lock()
                    .unwrap_or_else(|p| p.into_inner())
                    .len()
                    >= control.limits.max_sessions;
                if full {
                    control.counters[Direction::ToUpstream.index()]
                        .overflowed
                        .fetch_add(1, Ordering::Relaxed);
                    continue;
                }
                let Ok(sock) = UdpSocket::bind(unspecified_like(upstream)).await else {
                    continue;
                };
                if sock.connect(upstream).await.is_err() {
                    continue;
                }
                let sock = Arc::new(sock);
                control
                    .sessions
                    .lock()
                    .unwrap_or_else(|p| p.into_inner())
                    .insert(client, sock.clone());
                let task = tokio::spawn(session_loop(
                    control.clone(),
                    sock.clone(),
                    front.clone(),
                    client,
                    to_client.clone(),
                ));
                control.track(task.abort_handle());
                sock
            }
        };
        if let Some(now) = dispatch(
            &control,
            Direction::ToUpstream,
            &to_upstream,
            &session,
            None,
            &buf[..n],
        ) {
            send(&now).await;
            control.counters[Direction::ToUpstream.index()]
                .forwarded
                .fetch_add(1, Ordering::Relaxed);
        }
    }
}

async fn session_loop(
    control: Arc<Control>,
    upstream_sock: Arc<UdpSocket>,
    front: Arc<UdpSocket>,
    client: SocketAddr,
    to_client: mpsc::UnboundedSender<Held>,
) {
    let mut buf = vec![0u8; MAX_DATAGRAM];
    loop {
        // Errors (e.g. ICMP port unreachable while the upstream is down)
        // are transient: the upstream may come back.
        let Ok(n) = upstream_sock.recv(&mut buf).await else {
            tokio::time::sleep(Duration::from_millis(5)).await;
            continue;
        };
        if let Some(now) = dispatch(
            &control,
            Direction::ToClient,
            &to_client,
            &front,
            Some(client),
            &buf[..n],
        ) {
            send(&now).await;
            control.counters[Direction::ToClient.index()]
                .forwarded
                .fetch_add(1, Ordering::Relaxed);
        }
    }
}
