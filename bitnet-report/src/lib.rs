//! The report `bitnet-bench` writes and `bitnet-diff` reads, as a crate of its own so that
//! reading, checking and comparing reports needs no engine.
//!
//! - [`report`]: the versioned JSON report type and its schema; [`report_fields`]: its field
//!   reference (reports/README.md) made from the schema;
//! - [`stats`]: summaries of samples ([`stats::Stat`], [`stats::Latency`], percentiles);
//! - [`roofline`]: the roofline section and the fractions derived from it;
//! - [`mod@load`]: parsing and checking a report file; [`mod@merge`]: pooling runs of one build;
//! - [`system`]: the machine fingerprint's fields; [`perplexity`]: the perplexity result;
//! - [`files`]: writing output files atomically; [`html`]: self-contained pages in one style,
//!   [`svg`]: their charts;
//!   [`error`]: what can go wrong.
//!
//! Raw samples are the single source of truth: a `Stat` or `Latency` is built from its samples
//! and keeps no other state, and the fractions derived from them ([`report::Report::refresh_derived`])
//! are recomputed when a report is loaded or merged; the summaries in the JSON are output only.

pub mod error;
pub mod files;
pub mod html;
pub mod load;
pub mod merge;
pub mod perplexity;
pub mod report;
pub mod report_fields;
pub mod roofline;
pub mod stats;
pub mod svg;
pub mod system;

pub use error::ReportError;
pub use load::{load, parse};
pub use merge::merge;
pub use report::{BenchResult, Config, Report, SCHEMA_VERSION};
pub use stats::{Latency, Stat};
