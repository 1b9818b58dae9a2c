//! Operator config files: the topology of a region and its tenants.
//!
//! Both are TOML, parsed from a `&str` (no I/O here) with a file name for
//! messages. Parsing is strict and never stops at the first mistake: the
//! text is parsed into `toml`'s spanned tree, walked by a path-tracking
//! reader into raw structs, then validated into new types. Every problem of
//! a file comes back at once in one [`ConfigError`], each with its line and
//! column, key path and offending value:
//!
//! ```text
//!   topology.toml ─▶ Topology::from_toml ─▶ Topology { gpu_models, pools ─▶ nodes ─▶ GPUs,
//!                                                      cold start / swap costs, PriceList }
//!   tenants.toml  ─▶ Tenants::from_toml  ─▶ Tenants  { tenant ─▶ quota per pool kind }
//!                          │
//!                          └─▶ Err(ConfigError { file, issues: [ConfigIssue; N] })
//!                              "topology.toml:12:9: pools[1].nodes[0].gpus[0].model: unknown GPU model (...) (got \"H900\")"
//! ```
//!
//! The schema, units and the pricing rule are described in
//! `configs/README.md`; the pricing arithmetic lives in [`pricing`].

mod agent;
mod agent_file;
mod error;
mod file_ref;
mod function_file;
mod gpu_model;
mod loading;
mod names;
mod node;
mod pool;
pub mod pricing;
mod reader;
mod replica_file;
mod runtime_drivers;
mod tenants;
mod tenants_file;
mod topology;
mod topology_file;

pub use agent::{
    AgentConfig, AgentLoadCosts, AgentTls, GpuSource, HttpTls, JournalSync, NvmlFallback,
    SimulatedGpus,
};
pub use agent_file::{check_http_bind, DEFAULT_H2D_MIB_PER_S, DEFAULT_SWAP_SETUP_US};
pub use error::{ConfigError, ConfigIssue, IssueKind};
pub use file_ref::FileRef;
pub use function_file::{FunctionFile, FunctionFileLatency};
pub use gpu_model::GpuModel;
pub use loading::{transfer_us, ColdStart, SwapCost};
pub use names::{is_valid_name, replica_id, MAX_NAME_LEN};
pub use node::{GpuGroup, Node};
pub use pool::Pool;
pub use pricing::{charge, Charge, Money, Price, PriceList, PricingError, Usage};
pub use replica_file::{
    ReplicaFile, ReplicaFileError, ReplicaHttpTls, ReplicaPeer, ReplicaTls, TokenSource,
    DEFAULT_KEEP_LOGS, DEFAULT_SNAPSHOT_EVERY,
};
pub use runtime_drivers::{DriverKind, RuntimeDriverConfig, RuntimeDrivers, TemplateRef};
pub use tenants::{Tenant, Tenants};
pub use topology::{LegacyTopology, PoolCapacity, Topology};
