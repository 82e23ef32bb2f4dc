//! The trained model committed in the repository's `models/` (see `models/README.md`): a small
//! BitNet b1.58 model with real weights and a tokenizer, and the held-out text it never saw.
//! A preset's random weights estimate no model's quality, so the sweep of a preset measures KV
//! quality on this model instead (the speed figures stay on the preset, whose size is real).
//!
//! Found through this crate's source directory at build time: a `bitnet-bench` built from the
//! repository finds it; one copied elsewhere falls back to random token ids on the preset, and
//! its `kl / top1` column says `synthetic`.

use std::path::PathBuf;

/// `models/` of the repository this binary was built from.
pub fn dir() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("..").join("models")
}

/// The model file in one of its layouts: `tq2_0`, `tq1_0` or `i2_s`.
pub fn model(layout: &str) -> PathBuf {
    dir().join(format!("rustdocs-bitnet-{layout}.gguf"))
}

/// The held-out evaluation text (never trained on).
pub fn heldout_text() -> PathBuf {
    dir().join("rustdocs-heldout.txt")
}

/// The model and text a preset's sweep measures KV quality on, when both files are there.
pub fn quality_default() -> Option<(PathBuf, PathBuf)> {
    let (m, t) = (model("i2_s"), heldout_text());
    (m.is_file() && t.is_file()).then_some((m, t))
}
