//! The serving simulator (work in progress).
