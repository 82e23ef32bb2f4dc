//! `bitnet-trace`: where the time of a BitNet token goes.
//!
//! Runs a prefill and decode steps of a `bitnet-engine` model with its per-stage spans on and
//! writes folded stacks and a flamegraph (`inferno`), a Chrome trace-event timeline, a summary
//! (JSON and a table) with hardware or software counters (`perf-event`), and optionally a
//! sampling profile (`pprof`) and a heap profile (`dhat`) of the same run — with cross-checks
//! between them, so the numbers can be trusted.
//!
//! - [`spans`]: the engine's recorders, collected and named;
//! - [`folded`]: folded stacks and flamegraphs (and differential ones);
//! - [`chrome`]: the timeline;
//! - [`counters`]: perf counters with a clear fallback;
//! - [`profile`]: the sampling profile and its function shares;
//! - [`summary`]: the summary and its consistency checks;
//! - [`overhead`]: what the spans themselves cost;
//! - [`run`]: the whole traced run and its output directory.

pub mod chrome;
pub mod counters;
pub mod folded;
pub mod overhead;
pub mod profile;
pub mod run;
pub mod spans;
pub mod summary;

pub use run::{run_trace, TraceOptions};
