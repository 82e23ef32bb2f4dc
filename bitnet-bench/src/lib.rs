//! `bitnet-bench` as a library: the binary only parses flags and prints.
//!
//! - [`sweep`]: the model sweep (the main job) behind a measurement seam;
//! - [`stats`], [`report`]: statistics and the versioned JSON report with its schema;
//!   [`report_fields`]: its field reference (reports/README.md) made from the schema;
//! - [`output`]: table, Markdown, CSV; [`plots`]: SVG charts and an offline HTML page;
//! - [`system`]: the machine fingerprint; [`import`]: llama-bench JSON → our report;
//! - [`history`]: the SQLite run history (`--db`);
//! - [`kernel_sweep`]: the kernel-level sweep; [`model_cmds`]: `inspect` and `run`;
//! - [`perplexity`]: llama-perplexity's method and KL divergence against a saved base;
//! - [`trained`]: where the committed trained model and its held-out text are.

pub mod history;
pub mod import;
pub mod kernel_sweep;
pub mod listarg;
pub mod model_cmds;
pub mod output;
pub mod perplexity;
pub mod pipes;
pub mod plots;
pub mod report;
pub mod report_fields;
pub mod stats;
pub mod sweep;
pub mod system;
pub mod trained;
