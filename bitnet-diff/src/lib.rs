//! `bitnet-diff`: statistically sound comparison of `bitnet-bench` reports for CI gating.
//!
//! - [`compare`](mod@compare): pairing by configuration and the per-metric decision;
//! - [`stats`]: the seeded bootstrap, Welch's test and the functions they need;
//! - [`render`]: text, Markdown and JSON.

pub mod compare;
pub mod perplexity;
pub mod render;
pub mod stats;

pub use compare::{compare, Comparison, Verdict};
