//! `bitnet-bench` as a library: the binary only parses flags and prints.
//!
//! Today it holds the kernel sweep (the engine-kernels issue's measurement job); the full model
//! sweep with its versioned report comes with the bench issue.

pub mod kernel_sweep;
pub mod model_cmds;
