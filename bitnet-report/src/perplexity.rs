//! The result `bitnet-bench perplexity --json` writes (`reports/perplexity.schema.json`):
//! llama-perplexity's figures, the running estimate and the KL comparison against a base run.

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use crate::error::Result;
use crate::load::{typed, validate_against};

/// Version of [`PerplexityResult`]'s JSON (`reports/perplexity.schema.json`).
pub const SCHEMA_VERSION: u32 = 1;

/// One running estimate, printed after each chunk.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct ChunkEstimate {
    /// 1-based chunk number.
    pub chunk: usize,
    /// PPL over all chunks so far.
    pub perplexity: f64,
    /// Its standard error (null while fewer than 2 tokens are scored).
    pub standard_error: Option<f64>,
    /// Mean NLL of this chunk alone.
    pub chunk_nll_mean: f64,
    /// Seconds this chunk's evaluation took.
    pub seconds: f64,
}

/// The model a run measured.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct ModelId {
    /// The model's name (GGUF `general.name`, else the file stem).
    pub name: String,
    /// The `--model` file's name (no directory).
    pub file: String,
    /// Its length in bytes.
    pub file_bytes: u64,
    pub vocab: usize,
    /// FFN activation the run used (silu, relu2).
    pub ffn_activation: String,
    /// Kernel of the linear layers.
    pub kernel: String,
    /// KV cache precision.
    pub kv: String,
    pub threads: usize,
}

/// The text a run scored.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct TextId {
    /// The `--text` file's name (no directory).
    pub file: String,
    /// Its length in bytes.
    pub bytes: u64,
    /// SHA-256 of its bytes, lowercase hex (as `sha256sum` prints it).
    pub sha256: String,
    /// Tokens it encodes to (with BOS where the vocabulary adds one).
    pub tokens: usize,
}

/// `--kl-ref`: this run against a saved reference run.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct KlReport {
    /// The base file's name.
    pub base_file: String,
    /// `"full"`: KL over the whole vocabulary; `"top-K + rest"`: over the base's K most likely
    /// tokens and one bucket for the rest of the mass (a lower bound of the full KL).
    pub kl_support: String,
    /// Positions compared.
    pub positions: usize,
    /// PPL of the base run over the same positions, and its standard error.
    pub base_perplexity: f64,
    pub base_standard_error: f64,
    /// mean ln(PPL(this)/PPL(base)).
    pub ln_ppl_ratio: f64,
    /// KL(base ‖ this) per position, in nats: mean, its standard error, and quantiles.
    pub kl_mean: f64,
    pub kl_standard_error: f64,
    pub kl_median: f64,
    pub kl_p10: f64,
    pub kl_p90: f64,
    pub kl_p99: f64,
    pub kl_max: f64,
    /// Fraction of positions where this run's most likely token is the base's.
    pub same_top: f64,
    pub same_top_standard_error: f64,
    /// Δp = p(this, right token) − p(base, right token): mean, standard error, RMS.
    pub delta_p_mean: f64,
    pub delta_p_standard_error: f64,
    pub delta_p_rms: f64,
    pub delta_p_rms_standard_error: f64,
}

/// What `bitnet-bench perplexity --json` writes.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct PerplexityResult {
    pub schema_version: u32,
    /// exp(mean NLL) over the scored tokens (null if nothing was scored).
    pub perplexity: Option<f64>,
    /// llama.cpp's standard error of the PPL (null with fewer than 2 scored tokens).
    pub standard_error: Option<f64>,
    /// Mean negative log-likelihood (nats) of the scored tokens.
    pub nll_mean: Option<f64>,
    /// Chunks evaluated, and how many the text holds.
    pub chunks: usize,
    pub chunks_available: usize,
    /// Tokens per chunk; the first `ctx/2` give context only.
    pub ctx: usize,
    /// Rows per forward call.
    pub batch: usize,
    /// Tokens scored: `chunks × (ctx − ctx/2 − 1)`.
    pub tokens_scored: usize,
    /// Tokens fed to the model: `chunks × ctx`.
    pub tokens_evaluated: usize,
    /// Seconds of evaluation (forward passes and scoring, without loading and tokenizing).
    pub eval_seconds: f64,
    /// tokens_evaluated / eval_seconds.
    pub tokens_per_sec: f64,
    /// Whether each chunk starts with BOS (the vocabulary adds one), and its id.
    pub add_bos: bool,
    pub bos: Option<u32>,
    pub model: ModelId,
    pub text: TextId,
    /// The running estimate after each chunk.
    pub running: Vec<ChunkEstimate>,
    /// False when interrupted: the numbers cover the chunks in `running` only.
    pub complete: bool,
    /// Present with `--kl-ref`.
    pub kl: Option<KlReport>,
}

/// The JSON Schema of [`PerplexityResult`], as committed in `reports/perplexity.schema.json`.
pub fn schema_json() -> String {
    let schema = schemars::schema_for!(PerplexityResult);
    serde_json::to_string_pretty(&schema).expect("a schema serializes") + "\n"
}

/// Validates a JSON value against [`schema_json`].
pub fn validate_schema(value: &serde_json::Value, file: &str) -> Result<()> {
    validate_against(&schema_json(), "perplexity", value, file)
}

/// Parses a perplexity result named `file` in messages: the schema, then the typed structure.
pub fn parse(text: &str, file: &str) -> Result<PerplexityResult> {
    let value: serde_json::Value =
        serde_json::from_str(text).map_err(|error| crate::error::ReportError::Json { file: file.into(), error })?;
    validate_schema(&value, file)?;
    typed(text, file)
}

/// Reads and checks a perplexity result file.
pub fn load(path: &std::path::Path) -> Result<PerplexityResult> {
    let text =
        std::fs::read_to_string(path).map_err(|error| crate::error::ReportError::Read { path: path.into(), error })?;
    parse(&text, &path.display().to_string())
}
