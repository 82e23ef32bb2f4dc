//! The system fingerprint's fields: what the numbers were measured on. `bitnet-bench` fills
//! them in (it asks the engine which CPU this is); here they are data.

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct System {
    /// `model name` of /proc/cpuinfo.
    pub cpu_model: String,
    /// The CPU's CPUID identity (absent from older and imported reports): VMs may give several
    /// CPU generations one brand string, and their figures can differ a lot, so `cpu_model`
    /// alone does not tell two machines apart.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cpu_id: Option<CpuIdentity>,
    pub physical_cores: usize,
    pub logical_cpus: usize,
    /// ISA levels the chosen kernels used (e.g. `avx512`), then the CPU's relevant features.
    pub isa: Vec<String>,
    pub cpu_features: Vec<String>,
    pub l1d_kib: Option<u64>,
    pub l2_kib: Option<u64>,
    pub l3_kib: Option<u64>,
    pub memory_bytes: Option<u64>,
    pub os: String,
    pub kernel: String,
    /// cpufreq scaling governor of CPU 0, where readable.
    pub governor: Option<String>,
    /// Turbo/boost state, where readable.
    pub turbo: Option<String>,
    /// Transparent huge pages mode (`always`, `madvise` or `never`), where readable. The
    /// engine asks for huge pages for weights, KV cache and the bandwidth probe; under `never`
    /// they get 4 KiB pages, which stream more slowly (a TLB miss every 4 KiB).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub transparent_hugepage: Option<String>,
    /// Whether the engine asked for huge pages for those buffers: false when the run had
    /// `BITNET_HUGE_PAGES=0` in its environment (absent from older and imported reports).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub huge_pages_requested: Option<bool>,
    /// Whether worker threads were pinned to cores.
    pub pinned: bool,
    pub rustc: String,
}

/// Vendor, family, model and stepping as CPUID gives them (display family and model, the
/// numbers /proc/cpuinfo shows), and the microarchitecture where the family tells it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct CpuIdentity {
    pub vendor: String,
    pub family: u32,
    pub model: u32,
    pub stepping: u32,
    /// e.g. `zen4`; absent where family and model do not tell it (every non-AMD CPU).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub microarchitecture: Option<String>,
}

impl std::fmt::Display for CpuIdentity {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        if let Some(m) = &self.microarchitecture {
            write!(f, "{m}, ")?;
        }
        write!(f, "{} family {} model {} stepping {}", self.vendor, self.family, self.model, self.stepping)
    }
}
