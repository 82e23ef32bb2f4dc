//! GGUF files: parsing (bounds-checked, from a memory map), loading BitNet models, and the
//! ggml types involved.

pub mod load;
pub mod reader;
pub mod source;
pub mod types;
pub mod writer;

use std::path::Path;

use crate::error::{Error, Result};
use crate::model::forward::Model;

pub use reader::{GgufFile, TensorDesc, Value};
pub use source::ModelSource;
pub use types::GgmlType;
pub use writer::save_model;

/// Memory-maps `path`, parses it and builds the model. Errors name the file.
pub fn load_model(path: &Path) -> Result<Model> {
    with_parsed(path, |parsed| {
        let stem = path.file_stem().map(|s| s.to_string_lossy().into_owned()).unwrap_or_default();
        load::model_from_gguf(parsed, &stem)
    })
}

/// The hyperparameters in `path`'s metadata, without loading the weights.
pub fn read_config(path: &Path) -> Result<crate::model::ModelConfig> {
    with_parsed(path, |parsed| {
        let stem = path.file_stem().map(|s| s.to_string_lossy().into_owned()).unwrap_or_default();
        load::config_from_gguf(parsed, &stem)
    })
}

/// Maps and parses `path`, then runs `f` on it; errors from either name the file.
pub(crate) fn with_parsed<T>(path: &Path, f: impl FnOnce(&GgufFile<'_>) -> Result<T>) -> Result<T> {
    let ctx = |e: Error| Error::Format(format!("{}: {e}", path.display()));
    let file = std::fs::File::open(path).map_err(|e| Error::Format(format!("{}: cannot open: {e}", path.display())))?;
    // SAFETY: the map is read-only and private to this process; it stays valid while `map`
    // lives (all weights are copied out before it is dropped). If another process truncates
    // the file meanwhile, reads may fault (SIGBUS) — the usual caveat of mapping files, shared
    // with llama.cpp.
    let map = unsafe { memmap2::Mmap::map(&file) }
        .map_err(|e| Error::Format(format!("{}: cannot map: {e}", path.display())))?;
    let parsed = GgufFile::parse(&map).map_err(ctx)?;
    f(&parsed).map_err(ctx)
}
