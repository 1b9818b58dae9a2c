//! Runtime drivers: what runs a function instance.

pub mod process;
