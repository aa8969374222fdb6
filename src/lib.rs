//! servetune: finds the fastest serving configuration of an LLM engine on the node it runs on.
//!
//! This crate is the whole program; `main.rs` only parses the command line and calls in here.
//! See ARCHITECTURE.md for the map of modules and their invariants.

pub mod api;
pub mod bench;
pub mod cli;
pub mod daemon;
pub mod demo;
pub mod engine;
#[cfg(feature = "mock")]
pub mod mock;
pub mod report;
pub mod setup;
pub mod signals;
pub mod space;
pub mod store;
pub mod telemetry;
pub mod tokenizer;
pub mod tune;
pub mod util;
