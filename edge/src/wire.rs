//! Frames of core's protocol codec on QUIC streams: the agent wire, the
//! same code and limit the region uses (`gshare_core::net`).

pub use gshare_core::net::{read_frame, write_frame, write_frame_more, WireError, BAD_FRAME};
