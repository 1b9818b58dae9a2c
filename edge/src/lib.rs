//! `gshare-edge`: the node agent (DESIGN.md §2, §8).
//!
//! This part holds the `process` runtime driver (function servers as
//! supervised OS processes) and the usage journal (sled, exactly-once
//! batches).

pub mod journal;
pub mod runtime;
