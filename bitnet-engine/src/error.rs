//! The engine's one error type.

use thiserror::Error;

/// Everything that can go wrong in `bitnet-engine`. Messages name the value and what was expected.
#[derive(Debug, Error, Clone, PartialEq)]
pub enum Error {
    /// A shape argument does not fit (wrong length, zero size, K not allowed by a format, ...).
    #[error("shape error: {0}")]
    Shape(String),
    /// A value outside a format's domain (e.g. a weight that is not -1, 0 or +1).
    #[error("invalid value: {0}")]
    Value(String),
    /// The requested kernel family / ISA / form cannot run here or on these weights.
    #[error("unsupported: {0}")]
    Unsupported(String),
    /// A malformed or truncated file (the message names the file, key or tensor).
    #[error("{0}")]
    Format(String),
    /// A name (family, ISA, form) that the engine does not know.
    #[error("unknown {what} '{got}'; expected one of: {expected}")]
    UnknownName { what: &'static str, got: String, expected: String },
}

pub type Result<T> = std::result::Result<T, Error>;
