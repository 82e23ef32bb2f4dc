//! Names of the stages a kernel's work is divided into, so time can be attributed.
//!
//! In the split kernel forms each stage is its own `#[inline(never)]` function
//! (`unpack_stage`, `dot_stage`, `xnor_stage`, `popcount_stage`; `ActivationBatch::quantize`
//! and `build_planes` for `quantize`), so a sampling profiler sees them as separate frames and a
//! span timer can wrap each call at tile granularity.

use std::fmt;

/// A stage of a matmul kernel.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum KernelStage {
    /// Activation quantization to int8 (and bit-plane packing for xnor).
    Quantize,
    /// Packed weights → int8/u8 code tile in L1 scratch.
    Unpack,
    /// int8 multiply-accumulate of codes with activations.
    Dot,
    /// AND/XNOR of weight planes with activation bit-planes.
    Xnor,
    /// Population counts of the xnor stage's output.
    Popcount,
}

impl KernelStage {
    pub const ALL: [KernelStage; 5] =
        [KernelStage::Quantize, KernelStage::Unpack, KernelStage::Dot, KernelStage::Xnor, KernelStage::Popcount];

    pub fn name(self) -> &'static str {
        match self {
            KernelStage::Quantize => "quantize",
            KernelStage::Unpack => "unpack",
            KernelStage::Dot => "dot",
            KernelStage::Xnor => "xnor",
            KernelStage::Popcount => "popcount",
        }
    }
}

impl fmt::Display for KernelStage {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}
