//! `bitnet-bench` as a library: the binary only parses flags and prints.
//!
//! - [`sweep`]: the model sweep (the main job) behind a measurement seam;
//! - the report itself (types, schema, statistics, loading, merging) is `bitnet_report`'s;
//! - [`output`]: table, Markdown, CSV; [`page`]: the offline HTML report page; [`plots`]: its SVG charts;
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
pub mod page;
pub mod perplexity;
pub mod pipes;
pub mod plots;
pub mod sweep;
pub mod system;
pub mod trained;
