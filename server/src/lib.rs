//! durable-mcp: an MCP server whose long-running tools survive crashes, restarts and dropped
//! clients. See `ARCHITECTURE.md` for the map.

pub mod auth;
pub mod config;
pub mod counts;
pub mod engine;
pub mod heap;
pub mod http;
pub mod kinds;
pub mod mcp;
pub mod store;
pub mod streams;
pub mod telemetry;

/// The README's Rust examples, compiled and run as doctests so they stay true.
#[doc = include_str!("../../README.md")]
#[cfg(doctest)]
pub struct ReadmeDoctests;
