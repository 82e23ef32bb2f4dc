//! Errors of reading, checking, merging and writing reports. Each names the file (or the
//! flag's file) and, where there is one, the JSON path of the field at fault.

use std::path::PathBuf;

#[derive(Debug, thiserror::Error)]
pub enum ReportError {
    #[error("{}: cannot read: {error}", path.display())]
    Read { path: PathBuf, error: std::io::Error },
    #[error("{}: cannot write: {error}", path.display())]
    Write { path: PathBuf, error: std::io::Error },
    #[error("{file}: not valid JSON: {error}")]
    Json { file: String, error: serde_json::Error },
    #[error("{file}: schema_version {found} is not supported (this tool reads {supported})")]
    Version { file: String, found: u64, supported: u32 },
    #[error("{file}: $.schema_version is missing or not a number")]
    NoVersion { file: String },
    /// The file does not match the JSON Schema (`what`: `report` or `perplexity`).
    #[error("{file}: at {at}: {message} (does not match the {what} schema)")]
    Schema { file: String, what: &'static str, at: String, message: String },
    /// A field's value cannot be what it says (a type, a count, a non-finite number).
    #[error("{file}: at {at}: {message}")]
    Field { file: String, at: String, message: String },
    /// Reports that cannot be pooled into one.
    #[error("{file}: {message}")]
    Merge { file: String, message: String },
}

pub type Result<T> = std::result::Result<T, ReportError>;
