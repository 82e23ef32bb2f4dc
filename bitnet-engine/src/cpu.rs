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
}
