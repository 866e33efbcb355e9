//! The task, checkpoint and event types that every part of durable-mcp speaks: the server
//! stores and serves them, the CLI prints them, the dashboard renders them.
//!
//! This crate is deliberately small and portable: serde, serde_json, schemars (the kinds'
//! parameter schemas) and chrono without a clock, so that it compiles for
//! `wasm32-unknown-unknown` as well as natively.

mod event_id;
pub mod form;
pub mod kinds;
pub mod results;
pub mod sse;
mod status;
mod task;

pub use event_id::{EventId, MalformedEventId};
pub use status::{Steer, TaskStatus, UnknownStatus};
pub use task::{
    CLIENT_ID_HEADER, CheckpointStats, LIST_AFTER_PARAM, Question, ServerStats, TASK_LIST_META_KEY,
    TASK_META_KEY, TaskInfo, TaskList, list_page_uri, list_uri, status_uri,
};

/// The schema crate the kinds' parameter types derive `JsonSchema` with (re-exported so that a
/// kind defined elsewhere uses the same version).
pub use schemars;
