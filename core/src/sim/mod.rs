//! Trace-driven simulators.

pub mod serving;
