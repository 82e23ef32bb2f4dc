//! Run-time CPU detection: which instruction-set levels the kernels may use here.

use std::fmt;
use std::str::FromStr;
use std::sync::OnceLock;

use crate::error::Error;

/// An instruction-set level a kernel is compiled for. Each level above `Scalar` is only
/// usable when [`IsaLevel::is_supported`] says so; kernels check this when they are built.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum IsaLevel {
    /// Portable Rust, no intrinsics.
    Scalar,
    /// AVX2 (+ FMA, POPCNT, F16C): `vpmaddubsw`, nibble-table popcount.
    Avx2,
    /// AVX-512 F/BW/VL with VNNI (`vpdpbusd`) and VPOPCNTDQ (and F16C).
    Avx512,
}

impl IsaLevel {
    pub const ALL: [IsaLevel; 3] = [IsaLevel::Scalar, IsaLevel::Avx2, IsaLevel::Avx512];

    pub fn name(self) -> &'static str {
        match self {
            IsaLevel::Scalar => "scalar",
            IsaLevel::Avx2 => "avx2",
            IsaLevel::Avx512 => "avx512",
        }
    }

    /// Whether this CPU can run kernels of this level (detected once, then cached).
    pub fn is_supported(self) -> bool {
        let f = features();
        match self {
            IsaLevel::Scalar => true,
            IsaLevel::Avx2 => f.avx2,
            IsaLevel::Avx512 => f.avx512,
        }
    }

    /// The best level this CPU supports.
    pub fn best() -> IsaLevel {
        *IsaLevel::ALL.iter().rev().find(|l| l.is_supported()).unwrap_or(&IsaLevel::Scalar)
    }

    /// The CPU features that a kernel at this level uses, for reports.
    pub fn feature_names(self) -> &'static [&'static str] {
        match self {
            IsaLevel::Scalar => &[],
            IsaLevel::Avx2 => &["avx2", "fma", "popcnt", "f16c"],
            IsaLevel::Avx512 => &["avx512f", "avx512bw", "avx512vl", "avx512vnni", "avx512vpopcntdq", "f16c"],
        }
    }

    /// For tests: whether this level runs here. Where the CPU lacks it, a test skips (printing
    /// why), unless `BITNET_REQUIRE_ISA` ([`required_for_tests`]) requires this level: then this
    /// panics, so a machine that has the level never passes by skipping it.
    pub fn testable(self) -> bool {
        match self.unsupported_reason() {
            None => true,
            Some(why) => {
                if required_for_tests().is_some_and(|r| self <= r) {
                    panic!("{REQUIRE_ISA_VAR}={}: {why}", required_for_tests().unwrap());
                }
                eprintln!("skipped at {self}: {why}");
                false
            }
        }
    }

    /// Why this level cannot run here, or `None` when it can.
    pub fn unsupported_reason(self) -> Option<String> {
        if self.is_supported() {
            return None;
        }
        let missing: Vec<&str> = self.feature_names().iter().copied().filter(|f| !detected(f)).collect();
        Some(format!("this CPU lacks {} (needed by the {} kernels)", missing.join(", "), self.name()))
    }
}

impl fmt::Display for IsaLevel {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

impl FromStr for IsaLevel {
    type Err = Error;
    fn from_str(s: &str) -> Result<Self, Error> {
        IsaLevel::ALL.iter().copied().find(|l| l.name() == s).ok_or_else(|| Error::UnknownName {
            what: "ISA level",
            got: s.to_string(),
            expected: "scalar, avx2, avx512".into(),
        })
    }
}

/// The environment variable naming the ISA level tests must run (see [`required_for_tests`]).
pub const REQUIRE_ISA_VAR: &str = "BITNET_REQUIRE_ISA";

/// The level `BITNET_REQUIRE_ISA` names (`scalar`, `avx2` or `avx512`): tests must run it and
/// every level below it, and fail where this CPU seems to lack one instead of skipping.
/// `.ci/run` sets it from `/proc/cpuinfo`'s flags, independently of this module's detection,
/// so neither a detection bug nor a CI machine without the level passes quietly. Unset: none.
/// A value that names no level panics (tests only read it).
pub fn required_for_tests() -> Option<IsaLevel> {
    let v = std::env::var(REQUIRE_ISA_VAR).ok().filter(|v| !v.is_empty())?;
    Some(v.parse().unwrap_or_else(|e| panic!("{REQUIRE_ISA_VAR}={v}: {e}")))
}

#[derive(Debug, Clone, Copy)]
struct Features {
    avx2: bool,
    avx512: bool,
}

fn features() -> Features {
    static F: OnceLock<Features> = OnceLock::new();
    *F.get_or_init(|| Features {
        avx2: IsaLevel::Avx2.feature_names().iter().all(|f| detected(f)),
        avx512: IsaLevel::Avx512.feature_names().iter().all(|f| detected(f)),
    })
}

#[cfg(target_arch = "x86_64")]
fn detected(feature: &str) -> bool {
    match feature {
        "avx2" => is_x86_feature_detected!("avx2"),
        "fma" => is_x86_feature_detected!("fma"),
        "popcnt" => is_x86_feature_detected!("popcnt"),
        "f16c" => is_x86_feature_detected!("f16c"),
        "avx512f" => is_x86_feature_detected!("avx512f"),
        "avx512bw" => is_x86_feature_detected!("avx512bw"),
        "avx512vl" => is_x86_feature_detected!("avx512vl"),
        "avx512vnni" => is_x86_feature_detected!("avx512vnni"),
        "avx512vpopcntdq" => is_x86_feature_detected!("avx512vpopcntdq"),
        _ => false,
    }
}

#[cfg(not(target_arch = "x86_64"))]
fn detected(_feature: &str) -> bool {
    false
}

/// Every feature of interest with whether it was detected, for system fingerprints.
pub fn detected_features() -> Vec<(&'static str, bool)> {
    ["avx2", "fma", "popcnt", "f16c", "avx512f", "avx512bw", "avx512vl", "avx512vnni", "avx512vpopcntdq"]
        .iter()
        .map(|f| (*f, detected(f)))
        .collect()
}

/// The CPU's identity from CPUID: vendor string, display family and model (extended fields
/// folded in, as the vendors' manuals define them) and stepping. Several machine kinds report
/// the same brand string, and their figures differ widely (Zen 4 runs 512-bit operations on
/// 256-bit units), so reports record this too.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CpuId {
    pub vendor: String,
    pub family: u32,
    pub model: u32,
    pub stepping: u32,
}

impl CpuId {
    /// This CPU's identity (read once), or `None` off x86-64.
    pub fn current() -> Option<&'static CpuId> {
        static ID: OnceLock<Option<CpuId>> = OnceLock::new();
        ID.get_or_init(read_cpuid).as_ref()
    }

    /// The core microarchitecture of an AMD CPU, from its family and, in family 0x19, its
    /// model ranges (Zen 3: 0x00–0x0F, 0x20–0x2F, 0x40–0x5F; Zen 4: 0x10–0x1F, 0x60–0x7F,
    /// 0xA0–0xAF), so a VM that hides AVX-512 does not turn a Zen 4 into a Zen 3. Family 0x17
    /// is Zen or Zen 2, 0x1A Zen 5. `None` for other vendors, families and models.
    pub fn microarchitecture(&self) -> Option<&'static str> {
        if self.vendor != "AuthenticAMD" {
            return None;
        }
        match (self.family, self.model) {
            (0x17, _) => Some("zen/zen2"),
            (0x19, 0x00..=0x0F | 0x20..=0x2F | 0x40..=0x5F) => Some("zen3"),
            (0x19, 0x10..=0x1F | 0x60..=0x7F | 0xA0..=0xAF) => Some("zen4"),
            (0x1A, _) => Some("zen5"),
            _ => None,
        }
    }
}

/// Whether this CPU runs 512-bit vector operations as two 256-bit halves (AMD Zen 4): there a
/// zmm `vpdpbusd` costs what two ymm ones do, so AVX-512 kernels gain little over AVX2 ones of
/// fewer operations (see `KernelFamily::default_form`). Mobile Zen 5 parts also have 256-bit
/// units but are not told apart from the server ones here (false for them).
pub fn avx512_on_256_bit_units() -> bool {
    CpuId::current().is_some_and(|c| c.microarchitecture() == Some("zen4"))
}

#[cfg(target_arch = "x86_64")]
fn read_cpuid() -> Option<CpuId> {
    use std::arch::x86_64::__cpuid;
    // SAFETY: CPUID exists on every x86-64 CPU, and leaves 0 and 1 on every one. (`__cpuid`
    // is a safe function from Rust 1.94 on; the workspace builds from 1.89.)
    #[allow(unused_unsafe)]
    let (l0, l1) = unsafe { (__cpuid(0), __cpuid(1)) };
    let vendor: Vec<u8> = [l0.ebx, l0.edx, l0.ecx].iter().flat_map(|r| r.to_le_bytes()).collect();
    let base_family = (l1.eax >> 8) & 0xF;
    let family = if base_family == 0xF { base_family + ((l1.eax >> 20) & 0xFF) } else { base_family };
    let base_model = (l1.eax >> 4) & 0xF;
    let model =
        if base_family == 0x6 || base_family == 0xF { base_model | ((l1.eax >> 16) & 0xF) << 4 } else { base_model };
    Some(CpuId { vendor: String::from_utf8_lossy(&vendor).into_owned(), family, model, stepping: l1.eax & 0xF })
}

#[cfg(not(target_arch = "x86_64"))]
fn read_cpuid() -> Option<CpuId> {
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn scalar_always_supported_and_names_round_trip() {
        assert!(IsaLevel::Scalar.is_supported());
        for l in IsaLevel::ALL {
            assert_eq!(l.name().parse::<IsaLevel>().unwrap(), l);
            assert_eq!(l.is_supported(), l.unsupported_reason().is_none());
        }
        assert!(matches!("sse".parse::<IsaLevel>(), Err(Error::UnknownName { .. })));
    }

    /// Every level `BITNET_REQUIRE_ISA` requires is detected (the whole check where `.ci/run`
    /// sets it; without it, only that detection and `testable` agree).
    #[test]
    fn required_isa_levels_are_detected() {
        for l in IsaLevel::ALL {
            if required_for_tests().is_some_and(|r| l <= r) {
                assert!(l.is_supported(), "{REQUIRE_ISA_VAR} requires {l}: {}", l.unsupported_reason().unwrap());
                assert!(l.testable());
            } else if l.is_supported() {
                assert!(l.testable());
            }
        }
    }

    /// CPUID agrees with what the kernel read from it into /proc/cpuinfo.
    #[cfg(all(target_arch = "x86_64", target_os = "linux"))]
    #[test]
    fn cpuid_matches_proc_cpuinfo() {
        let info = std::fs::read_to_string("/proc/cpuinfo").unwrap();
        let field = |name: &str| {
            info.lines()
                .find(|l| l.split(':').next().is_some_and(|k| k.trim() == name))
                .and_then(|l| l.split_once(':'))
                .map(|(_, v)| v.trim().to_string())
                .unwrap()
        };
        let id = CpuId::current().unwrap();
        assert_eq!(id.vendor, field("vendor_id"));
        assert_eq!(id.family.to_string(), field("cpu family"));
        assert_eq!(id.model.to_string(), field("model"));
        assert_eq!(id.stepping.to_string(), field("stepping"));
    }

    #[test]
    fn microarchitecture_by_family() {
        let amd = |family, model| CpuId { vendor: "AuthenticAMD".into(), family, model, stepping: 0 };
        assert_eq!(amd(0x1A, 0x02).microarchitecture(), Some("zen5"));
        for (model, want) in
            [(0x01, "zen3"), (0x21, "zen3"), (0x50, "zen3"), (0x11, "zen4"), (0x61, "zen4"), (0xA0, "zen4")]
        {
            assert_eq!(amd(0x19, model).microarchitecture(), Some(want), "model {model:#x}");
        }
        assert_eq!(amd(0x19, 0x90).microarchitecture(), None);
        assert_eq!(amd(0x17, 0x31).microarchitecture(), Some("zen/zen2"));
        assert_eq!(amd(0x15, 0x02).microarchitecture(), None);
        let intel = CpuId { vendor: "GenuineIntel".into(), family: 6, model: 0x8F, stepping: 8 };
        assert_eq!(intel.microarchitecture(), None);
    }
}
