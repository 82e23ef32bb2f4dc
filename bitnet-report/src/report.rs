//! The versioned benchmark report: one `Report` type, serialized as JSON, documented field by
//! field in `reports/README.md` and published as a JSON Schema (`reports/schema.json`)
//! generated from this type.

use std::collections::BTreeMap;

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use crate::roofline::Roofline;
use crate::stats::{Latency, Stat};
use crate::system::System;

/// Bumped whenever a field changes meaning or a required field is added.
pub const SCHEMA_VERSION: u32 = 1;

/// A `bitnet-bench` report.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct Report {
    /// Version of this format (see `SCHEMA_VERSION`).
    pub schema_version: u32,
    /// False if the sweep was interrupted (or is still running): `results` holds the
    /// combinations that finished.
    pub complete: bool,
    /// When the sweep started, RFC 3339 UTC.
    pub created_at: String,
    /// The program that measured (or the peer a report was imported from).
    pub tool: Tool,
    /// The machine it ran on.
    pub system: System,
    /// The model measured.
    pub model: ModelInfo,
    /// Repetitions, lengths and seed of the sweep.
    pub settings: Settings,
    /// The memory read bandwidth decode is measured against.
    pub roofline: Roofline,
    /// One entry per finished combination, in sweep order.
    pub results: Vec<BenchResult>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct Tool {
    /// `bitnet-bench`, or the peer a report was imported from (e.g. `llama-bench`).
    pub name: String,
    pub version: String,
    /// Commit the tool was built from; null when unknown.
    pub git_commit: Option<String>,
    /// Whether the build had uncommitted changes to tracked files; null when unknown.
    pub git_dirty: Option<bool>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct ModelInfo {
    /// Preset name or the GGUF's model name.
    pub name: String,
    /// `preset (synthetic ...)` or `GGUF file PATH`.
    pub source: String,
    /// Parameters (weights) in all.
    pub params: u64,
    /// Bytes of all weights as held in memory.
    pub weight_bytes: u64,
    /// Format of the linear layers (i2, tq2_0, tq1_0, bitplanes).
    pub weight_format: String,
    /// The FFN gating that ran (`silu` or `relu2`); absent in imported reports.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ffn_activation: Option<String>,
    /// Which rule chose it: `metadata key K`, `architecture A`, `--ffn-activation` or `preset`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ffn_activation_source: Option<String>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct Settings {
    /// Runs per combination discarded before measuring.
    pub warmup: usize,
    /// Measured runs per combination.
    pub repeat: usize,
    /// Decode steps per run.
    pub max_new_tokens: usize,
    /// Seed of synthetic weights and prompts.
    pub seed: u64,
    /// Tokens in the KV cache when decoding began, where that is not the context length: an
    /// imported llama-bench tg test decodes from a cache of its `-d` depth (0 unless `-d` was
    /// given), whatever its pp test's prompt. Absent in bitnet-bench's own reports, whose runs
    /// decode right after a prompt of `context_length` tokens.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub decode_depth: Option<usize>,
}

/// One combination's measurements.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct BenchResult {
    pub config: Config,
    /// Prompt processing.
    pub prefill: Prefill,
    /// Token generation after the prompt.
    pub decode: Decode,
    /// Bytes held.
    pub memory: Memory,
    /// Quality cost of the KV precision against f32 KV; null when not measured.
    pub quality: Option<Quality>,
    /// Share of decode time per stage (with `--trace`); null otherwise.
    pub stages: Option<BTreeMap<String, StageShare>>,
    /// Counters per decode step (with `--counters`), summed over threads; null otherwise.
    pub counters: Option<BTreeMap<String, f64>>,
}

/// What identifies a combination (results of two reports are paired on all of it).
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct Config {
    /// Model name (as in `model.name`).
    pub model: String,
    /// Kernel family (i2s, tq2, tq1, xnor).
    pub kernel: String,
    /// ISA level (scalar, avx2, avx512).
    pub isa: String,
    /// Sequences decoded in lock-step.
    pub batch: usize,
    /// Prompt tokens prefilled per sequence before decoding.
    pub context_length: usize,
    /// KV cache precision (f32, f16, bf16, fp8, int8, int4, int2).
    pub kv_precision: String,
    /// Threads in all.
    pub threads: usize,
}

impl std::fmt::Display for Config {
    /// `model kernel/isa B=1 ctx=128 kv=f16 t=2`, as tables and messages name a combination.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "{} {}/{} B={} ctx={} kv={} t={}",
            self.model, self.kernel, self.isa, self.batch, self.context_length, self.kv_precision, self.threads
        )
    }
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct Prefill {
    /// batch × context_length prompt tokens / prefill seconds, one sample per run.
    pub tokens_per_sec: Stat,
    /// Time to first token: prefill of every sequence's prompt plus choosing the first token.
    pub ttft_ms: Stat,
    /// Multiply-adds of a run's prefill: every prompt token through the linear layers, and
    /// the LM head once per sequence (for its last position); absent where unknown.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub macs: u64,
    /// Prefill's share of the int8 compute peak: `macs` ÷ the median prefill time ÷ the
    /// roofline section's `int8_peak_gmacs` for the same ISA and threads; absent where there is
    /// no peak (scalar kernels, older and imported reports).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub compute_fraction: Option<f64>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct Decode {
    /// batch × steps / decode seconds, one sample per run.
    pub tokens_per_sec: Stat,
    /// Inter-token latency: the time of each decode step (all sequences advance one token).
    pub latency_ms: Latency,
    /// Bytes read per decode step (weights once for the whole batch, plus every sequence's
    /// KV cache at its mean position) divided by the batch size.
    pub bytes_per_token: u64,
    /// Bytes read per decode step, the mean over the run's steps (step i attends over
    /// context_length + i + 1 cached positions).
    pub bytes_per_step: u64,
    /// Decode's share of the read bandwidth: the median of `step_fractions`; in reports
    /// without them, bytes_per_step × steps per second (median) / the roofline section's
    /// bandwidth for the same threads.
    pub roofline_fraction: f64,
    /// The roofline pass's probes (GB/s, same threads, 128 MiB each), one right after each of
    /// its decode steps. The bandwidth of a shared machine can jump between levels every few
    /// seconds, so a probe seconds away from a step says little about it.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub probes_gbps: Vec<f64>,
    /// Each roofline-pass step's bytes (bytes_per_step with that step's own KV positions) ÷ its
    /// time ÷ the probe right after it.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub step_fractions: Vec<f64>,
    /// The median of each roofline pass's step fractions, one pass per measured run: the
    /// independent samples `bitnet-diff` compares (one run's steps are not independent).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub pass_fractions: Vec<f64>,
    /// Multiply-adds of a decode step: every weight of the linear layers and the LM head once
    /// per sequence (attention's float work is not counted); absent where unknown.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub macs_per_step: u64,
    /// Decode's share of the int8 compute peak: macs_per_step × steps per second (median)
    /// ÷ the roofline section's `int8_peak_gmacs` for the same ISA and threads. Batch decode
    /// is bound by it as batch-1 decode is by the bandwidth; absent where there is no peak
    /// (scalar kernels, older and imported reports). The `tq1` lookup forms and `xnor`
    /// (AND and popcount) multiply nothing: their figure is what an int8 kernel would need
    /// to match them, not a share of arithmetic used.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub compute_fraction: Option<f64>,
}

fn is_zero(v: &u64) -> bool {
    *v == 0
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct Memory {
    /// Bytes of all weights as loaded, without kernel repacks (`repack_bytes`).
    pub weight_bytes: u64,
    /// Exact bytes of the KV cache of this combination.
    pub kv_cache_bytes: u64,
    /// Peak resident set size of the process so far (VmHWM); null where unreadable.
    pub peak_rss_bytes: Option<u64>,
    /// Bytes the combination's kernels hold beside the weights, made from them at load: the
    /// `tq1` `lut` form's lookup repack, the AVX2 `tq2` kernel's copy of the codes, and from
    /// batch 2 at AVX-512 a Q6_K LM head's copy in 16-row groups; 0 for the others (absent from
    /// older and imported reports).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub repack_bytes: Option<u64>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct Quality {
    /// Mean KL(p_f32 ‖ p_this) of next-token distributions over the positions (nats).
    pub kl_divergence: f64,
    /// Fraction of positions whose most likely next token matches f32 KV's.
    pub top1_agreement: f64,
    /// Positions compared (a teacher-forced prompt; at most the measuring model's context).
    pub positions: usize,
    /// What the figures were measured on: `text` (a real model's own tokenizer on
    /// `--quality-text`, or on the committed trained model's held-out text for a preset's
    /// sweep), or `synthetic` (random token ids, or a preset's random weights):
    /// synthetic figures exercise the KV precisions' code but estimate no model's quality, so
    /// they are shown as `synthetic` and never gated.
    #[serde(default = "synthetic")]
    pub source: String,
    /// The model the figures were measured on when it is not the report's (`--quality-model`,
    /// or the committed trained model for a preset's sweep): its file name.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub model: Option<String>,
    /// The text file (name, bytes and the first 16 hex digits of its SHA-256), for `text`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub text: Option<String>,
    /// Perplexity of the text's next tokens over the positions with f32 KV, and with this
    /// precision (`text` only).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub perplexity_f32: Option<f64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub perplexity: Option<f64>,
}

fn synthetic() -> String {
    "synthetic".into()
}

impl Quality {
    /// Whether the figures estimate a real model's quality (and may be gated).
    pub fn is_real(&self) -> bool {
        self.source == "text"
    }
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct StageShare {
    /// Nanoseconds per decode step, summed over threads.
    pub ns: f64,
    /// Of all stage time.
    pub share: f64,
}

/// The JSON Schema of [`Report`], as committed in `reports/schema.json`.
pub fn schema_json() -> String {
    let schema = schemars::schema_for!(Report);
    serde_json::to_string_pretty(&schema).expect("a schema serializes") + "\n"
}

/// What a report's `model.source` says about the weights, without where the file was: a
/// preset's description as it is (it names the synthetic format and seed), a file by its name
/// alone, so that one GGUF reached by two paths (or on two machines) is one source.
pub fn source_identity(source: &str) -> String {
    for prefix in SOURCE_FILE_PREFIXES {
        if let Some(path) = source.strip_prefix(prefix) {
            return format!("{prefix}{}", file_name(path));
        }
    }
    source.to_string()
}

/// How `model.source` names a GGUF file: ours, and an imported llama-bench run's.
const SOURCE_FILE_PREFIXES: [&str; 2] = ["GGUF file ", "llama-bench on "];

fn file_name(path: &str) -> String {
    std::path::Path::new(path).file_name().map_or(path.into(), |n| n.to_string_lossy().into_owned())
}

/// The name of the GGUF file a report's `model.source` ran (ours or llama-bench's), without
/// its directory; `None` for a preset. Reports of two tools on one file share it.
pub fn source_gguf_name(source: &str) -> Option<String> {
    SOURCE_FILE_PREFIXES.iter().find_map(|p| source.strip_prefix(p)).map(file_name)
}
