//! Tenant tokens: the agent only ever holds their SHA-256 digests, computed
//! by the same function as the region's ([`token_digest`]).

pub use gshare_core::protocol::token_digest;
