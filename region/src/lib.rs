//! `gshare-region`: a replica of the region and the operator CLI.
//!
//! ```text
//!   gshare-region --config r1.toml [--init]
//!   ┌──────────────────────────────────────────────────────────────┐
//!   │ http (actix-web) ─▶ Proposer ─▶ openraft ─▶ gshare-raft-store │
//!   │                        │           │          (sled)          │
//!   │                        ▼           ▼                          │
//!   │               PeerLinks / QuicNetwork ◀─▶ quic_server         │
//!   └────────────────────────────│──────────────────▲──────────────┘
//!                 QUIC + mutual TLS (operator's CA), bincode frames
//! ```
//!
//! `gsharectl` (in `cli`) creates certificates and changes membership.

pub mod agents;
pub mod api;
pub mod bootstrap;
pub mod cli;
pub mod config;
pub mod dashboard;
pub mod http;
pub mod http_client;
pub mod network;
pub mod peer_link;
pub mod proposer;
pub mod quic_server;
pub mod replica;
pub mod scheduler;
pub mod tls;
pub mod wire;
