//! `gshare-edge`: the node agent.
//!
//! One agent runs on every GPU node, in center and edge pools alike. It
//! registers its node with the region, receives the instances placed on it
//! and the tenants' token digests, and serves invocations on its own HTTP
//! ingress with core's deadline-aware executor (the same code the serving
//! simulator runs).
//!
//! ```text
//!   tenants ──HTTP──▶ ingress ──▶ NodeAgent (NodeExecutor) ──▶ GpuActor × n, InstanceActor × f
//!                                      ▲
//!   region replicas ──QUIC + mTLS──▶ RegionLink (register, heartbeat, assignments, tokens)
//! ```
//!
//! Also here: the `process` runtime driver (function servers as
//! supervised OS processes) and the usage journal (sled, exactly-once
//! batches) of issue 7.

pub mod agent;
pub mod gpu;
pub mod ingress;
pub mod journal;
pub mod metrics;
pub mod region_link;
pub mod runtime;
pub mod tls;
pub mod token;
pub mod wal;
pub mod wire;
