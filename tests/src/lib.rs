//! `gshare-tests`: black-box tests that run real `gshare-region` processes.
//!
//! ```text
//!   TestRegion::new(3)  ─▶ temp dir: certs/ (CA + r1..rN), rN.toml, data/rN
//!        │                  ports: free UDP (QUIC) and TCP (HTTP) ports chosen now
//!        ├─ start(id, init) ─▶ target/<profile>/gshare-region --config rN.toml [--init]
//!        ├─ kill9(id) / stop(id)
//!        └─ write / entries / status over HTTP (gshare_region::http_client)
//! ```
//!
//! [`FaultProxy`] (UDP) sits between QUIC peers and drops, delays or cuts
//! their traffic on command.
//!
//! The binaries are built on first use with `cargo build -p gshare-region
//! --bins` (same profile as the test), so `cargo test` alone suffices on a
//! clean checkout.

pub mod agent_proc;
pub mod api_calls;
pub mod binaries;
pub mod fault_proxy;
pub mod fuzz;
pub mod nemesis;
pub mod openai;
pub mod ports;
pub mod raw_http;
pub mod sim;
pub mod stand_in_region;
pub mod test_region;
pub mod up_process;

pub use api_calls::{call, json_of, until, AgentProcess};
pub use binaries::{binary, build_binaries};
pub use fault_proxy::{Direction, DirectionStats, FaultProxy, Faults, ProxyLimits};
pub use test_region::{ReplicaProc, TestRegion, TOKEN};
