//! Helpers shared by bitnet-bench's integration tests (`mod common;` in each).
// Each test binary compiles this module and uses a part of it.
#![allow(dead_code)]

use std::path::{Path, PathBuf};
use std::process::Command;

/// The `bitnet-bench` binary under test.
pub fn bench() -> Command {
    Command::new(env!("CARGO_BIN_EXE_bitnet-bench"))
}

/// The tiny preset (ReLU², random weights) saved as TQ2_0 in `dir`. Its minimal llama
/// vocabulary has `<s>`, `</s>` and the 256 byte tokens, so text tokenizes to bytes after
/// llama's leading `▁`.
pub fn tiny_gguf(dir: &Path) -> PathBuf {
    let file = dir.join("tiny.gguf");
    let out = bench()
        .args(["run", "--model", "tiny", "--format", "tq2_0", "--tokens", "1", "--n-predict", "1", "--save-gguf"])
        .arg(&file)
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    file
}

/// A fresh scratch directory named `<prefix>XXXXXX`, removed when dropped (pass or fail).
pub fn tmp(prefix: &str) -> tempfile::TempDir {
    tempfile::Builder::new().prefix(prefix).tempdir().unwrap()
}
