//! The serving simulator: replays a trace (Alibaba GenAI, Azure LLM or
//! synthetic) through the very [`crate::executor::NodeExecutor`] the node
//! agent runs, under gshare's rules or a baseline's, and measures deadline
//! attainment, latency, GPU-hours, swaps, cold starts and what tenants are
//! billed.
//!
//! ```text
//!   ServingTrace ──┐
//!   ServingParams ─┼─▶ evaluate(policy, gpus | min-gpus) ─▶ simulate (engine) ─▶ RunReport
//!   RunSpec ───────┘          │ search_min_gpus: exponential + binary + verify
//!                             └─ bound: proven lower bounds (mandatory-part, memory-time,
//!                                compute-time) + central EDF estimate
//! ```
//!
//! Rules fixed so that no policy is favoured: a request's deadline is its
//! arrival + slack × its service time on a whole GPU; attainment is the
//! requests finished by their deadline ÷ all requests (rejected ones miss).

mod bound;
mod engine;
mod llm;
mod params;
mod policy;
mod report;
mod search;
mod synthetic;
mod trace;

pub use bound::{
    compute_time_min_gpus, demand_min_gpus, edf_simulate, ffd_memory_gpus, mandatory_min_gpus,
    memory_time_min_gpus, miss_budget, proven_min_gpus, BoundKind,
};
pub use engine::{deadline, simulate, RunSpec};
pub use llm::{LlmModel, LlmSpec};
pub use params::{ServingParams, ServingParamsError};
pub use policy::ServingPolicy;
pub use report::RunReport;
pub use search::{
    evaluate, search_min_gpus, GpuCount, GpuSearch, PolicyOutcome, MAX_GPUS, TARGET_ATTAINMENT,
    VERIFY_WINDOW,
};
pub use synthetic::SyntheticSpec;
pub use trace::{ServingTrace, TraceError, TraceFormat, TraceFunction, TraceRequest};
