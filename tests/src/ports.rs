//! Loopback ports for the processes a test starts, picked below the
//! kernel's ephemeral range.
//!
//! A port found free by binding port 0 and letting it go is itself
//! ephemeral: until the process it is meant for binds it, any socket bound
//! to port 0 (a fault proxy's, a proxy's per-client socket, a client's)
//! may take it, and that process then fails to start. A port below the
//! ephemeral range is never handed out for port 0, and this process hands
//! each one out once.

use std::collections::BTreeSet;
use std::net::{SocketAddr, TcpListener, UdpSocket};
use std::sync::Mutex;

/// Ports handed out by this process.
static HANDED: Mutex<BTreeSet<u16>> = Mutex::new(BTreeSet::new());

/// Lowest port picked.
const FLOOR: u16 = 10_000;

/// The first port of the kernel's ephemeral range (Linux's default when
/// it cannot be read).
fn ephemeral_floor() -> u16 {
    std::fs::read_to_string("/proc/sys/net/ipv4/ip_local_port_range")
        .ok()
        .and_then(|s| s.split_whitespace().next()?.parse().ok())
        .unwrap_or(32_768)
}

/// A free loopback port for UDP (`udp`) or TCP, below the ephemeral range,
/// not handed out before by this process; a port-0 pick where that range
/// leaves no room below it.
pub fn free(udp: bool) -> std::io::Result<SocketAddr> {
    let bind = |port: u16| -> std::io::Result<SocketAddr> {
        let at = SocketAddr::from(([127, 0, 0, 1], port));
        if udp {
            UdpSocket::bind(at)?.local_addr()
        } else {
            TcpListener::bind(at)?.local_addr()
        }
    };
    let top = ephemeral_floor();
    if top > FLOOR + 1_000 {
        let mut handed = HANDED.lock().unwrap_or_else(|p| p.into_inner());
        let span = u64::from(top - FLOOR);
        let start = random() % span;
        for k in 0..span {
            let port = FLOOR + ((start + k) % span) as u16;
            if handed.contains(&port) {
                continue;
            }
            if let Ok(addr) = bind(port) {
                handed.insert(port);
                return Ok(addr);
            }
        }
    }
    bind(0)
}

fn random() -> u64 {
    use std::hash::{BuildHasher, Hasher};
    std::collections::hash_map::RandomState::new()
        .build_hasher()
        .finish()
}
