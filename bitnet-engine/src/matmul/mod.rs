//! Ternary matrix × int8 activation kernels.
//!
//! Every kernel computes, for output rows `rows` of an N×K weight matrix and each of the B
//! activation vectors, `out[(r − rows.start) × B + b] = Σ_k w[r][k] × x_b[k]` with all scales
//! applied (output is row-major by output row, batch innermost, so a thread pool can give each
//! worker a contiguous slice of `out`).
//!
//! Families (`scalar`, `i2s`, `tq2`, `tq1`, `xnor`) × ISA levels (`scalar`, `avx2`, `avx512`) ×
//! forms (`fused`: unpack in registers; `split`: unpack a tile of rows into an L1-resident
//! scratch, then a separate dot stage). `scalar` is the oracle: plain loops over
//! [`PackedWeights::get`], the definition every other path must equal exactly.
//!
//! ## Float semantics (shared by every path, so results are bit-identical)
//! - Tensor-scaled formats (I2, bit-planes, binary): `isum as f32 * w_scale * x_scale`.
//! - Block-scaled formats (TQ2_0, TQ1_0): `acc = Σ_blocks f64(d) × f64(isum_block)`, then
//!   `acc as f32 * x_scale`. Each term is exact in f64 (11-bit × 16-bit), so the sum is exact —
//!   and therefore independent of summation order — whenever a row's block scales lie within a
//!   factor of about 2^20 of one another, which holds for every quantizer output (d = block

/// The split dot stage's one-row pass over several tokens at an ISA (`dot_codes_tokens`): one token is
/// `$one(codes, tokens)`; 2 to 8 tokens run `$n::<T>(codes, tokens, out)` with T a constant, so
/// that the accumulators stay in registers.
#[cfg(target_arch = "x86_64")]
macro_rules! dot_codes_by_token_count {
    ($one:ident, $n:ident, $codes:expr, $tokens:expr, $out:expr) => {
        match $out.len() {
            1 => $out[0] = $one($codes, $tokens),
            2 => $n::<2>($codes, $tokens, $out),
            3 => $n::<3>($codes, $tokens, $out),
            4 => $n::<4>($codes, $tokens, $out),
            5 => $n::<5>($codes, $tokens, $out),
            6 => $n::<6>($codes, $tokens, $out),
            7 => $n::<7>($codes, $tokens, $out),
            _ => $n::<8>($codes, $tokens, $out),
        }
    };
}

pub mod head;
mod portable;
mod scalar;
mod scratch;
#[cfg(target_arch = "x86_64")]
mod x86_avx2;
#[cfg(target_arch = "x86_64")]
mod x86_avx512;

use std::fmt;
use std::ops::Range;
use std::str::FromStr;

use crate::activations::ActivationBatch;
use crate::aligned::AlignedBytes;
use crate::cpu::IsaLevel;
use crate::error::{Error, Result};
use crate::formats::{PackedWeights, WeightFormat};
use crate::instrument::SplitTicks;
#[cfg(target_arch = "x86_64")]
use crate::simd::x86_avx2::Avx2;
#[cfg(target_arch = "x86_64")]
use crate::simd::x86_avx512::Avx512;
use crate::simd::PrefetchRange;

pub use head::{head_matmul, int8_rows_matmul, q6k_groups_matmul, q6k_groups_used, q6k_rows_matmul};
pub(crate) use scratch::TokenTables;
pub use scratch::{KernelScratch, ScratchNeeds};

/// A kernel family: one algorithm, implemented at several ISA levels.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum KernelFamily {
    /// The oracle: plain loops, obviously right. Reads any format.
    Scalar,
    /// Unpack I2 2-bit codes to int8, then int8 multiply-accumulate.
    I2s,
    /// The same on llama.cpp's TQ2_0 blocks.
    Tq2,
    /// The same on llama.cpp's TQ1_0 (base-3) blocks.
    Tq1,
    /// Bit-serial: AND of weight planes with activation bit-planes, then population count.
    Xnor,
}

impl KernelFamily {
    pub const ALL: [KernelFamily; 5] =
        [KernelFamily::Scalar, KernelFamily::I2s, KernelFamily::Tq2, KernelFamily::Tq1, KernelFamily::Xnor];

    pub fn name(self) -> &'static str {
        match self {
            KernelFamily::Scalar => "scalar",
            KernelFamily::I2s => "i2s",
            KernelFamily::Tq2 => "tq2",
            KernelFamily::Tq1 => "tq1",
            KernelFamily::Xnor => "xnor",
        }
    }

    /// Whether this family reads weights of `format`.
    pub fn accepts(self, format: WeightFormat) -> bool {
        match self {
            KernelFamily::Scalar => true,
            KernelFamily::I2s => format == WeightFormat::I2,
            KernelFamily::Tq2 => format == WeightFormat::Tq2_0,
            KernelFamily::Tq1 => format == WeightFormat::Tq1_0,
            KernelFamily::Xnor => matches!(format, WeightFormat::BitPlanes | WeightFormat::Binary),
        }
    }

    /// The ternary format this family is built for.
    pub fn native_format(self) -> WeightFormat {
        match self {
            KernelFamily::Scalar | KernelFamily::I2s => WeightFormat::I2,
            KernelFamily::Tq2 => WeightFormat::Tq2_0,
            KernelFamily::Tq1 => WeightFormat::Tq1_0,
            KernelFamily::Xnor => WeightFormat::BitPlanes,
        }
    }

    /// ISA levels this family is implemented for.
    pub fn isa_levels(self) -> &'static [IsaLevel] {
        match self {
            KernelFamily::Scalar => &[IsaLevel::Scalar],
            _ => &IsaLevel::ALL,
        }
    }

    /// The form [`Kernel::best`] uses at `isa`: the faster one, as measured on the 2B4T shapes.
    /// Fused everywhere but portable `tq1`: there the fused form decodes each block into a
    /// stack buffer and reads it straight back — the loads then wait on store forwarding from
    /// narrower stores — so the split form (a whole tile decoded before the dot stage) is
    /// faster. The AVX2 and AVX-512 `tq1` kernels extract digits in registers and have no such
    /// buffer, so fused beats split there. On AVX2 `tq1` looks sums up instead (`lut`: faster
    /// than fused for one token on Zen 3, and no slower for batches). At AVX-512 it depends on
    /// the core ([`cpu::avx512_on_256_bit_units`](crate::cpu::avx512_on_256_bit_units)): Zen 4
    /// runs a zmm `vpdpbusd` as two 256-bit halves, and there the lookup forms beat the fused
    /// `vpdpbusd` kernel for one token and for eight (`perm` ahead of `lut`), so `perm` where
    /// the CPU has VBMI and GFNI (every Zen 4), else `lut`. Cores with full-width AVX-512
    /// (Zen 5, where the fused kernel reads most of the bandwidth) keep the fused form, which
    /// the lookup forms have not been measured against there. Figures: docs/perf-notes.md.
    pub fn default_form(self, isa: IsaLevel) -> KernelForm {
        match (self, isa) {
            (KernelFamily::Tq1, IsaLevel::Scalar) => KernelForm::Split,
            (KernelFamily::Tq1, IsaLevel::Avx2) => KernelForm::Lut,
            #[cfg(target_arch = "x86_64")]
            (KernelFamily::Tq1, IsaLevel::Avx512)
                if crate::cpu::avx512_on_256_bit_units() && x86_avx512::perm_supported() =>
            {
                KernelForm::Perm
            }
            (KernelFamily::Tq1, IsaLevel::Avx512) if crate::cpu::avx512_on_256_bit_units() => KernelForm::Lut,
            _ => KernelForm::Fused,
        }
    }

    /// Forms this family is implemented in.
    pub fn forms(self) -> &'static [KernelForm] {
        match self {
            KernelFamily::Scalar => &[KernelForm::Fused],
            KernelFamily::Tq1 => &KernelForm::ALL,
            _ => &[KernelForm::Fused, KernelForm::Split],
        }
    }
}

impl fmt::Display for KernelFamily {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

impl FromStr for KernelFamily {
    type Err = Error;
    fn from_str(s: &str) -> Result<Self> {
        KernelFamily::ALL.iter().copied().find(|f| f.name() == s).ok_or_else(|| Error::UnknownName {
            what: "kernel family",
            got: s.to_string(),
            expected: KernelFamily::ALL.map(|f| f.name()).join(", "),
        })
    }
}

/// How a kernel arranges its stages.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum KernelForm {
    /// Unpack and multiply in registers, no intermediate buffer (the default of every family
    /// but `tq1` at the portable and AVX2 levels and on Zen 4: see
    /// [`KernelFamily::default_form`]).
    Fused,
    /// `unpack` a tile of rows into an L1-resident scratch, then `dot` (or `xnor`, then
    /// `popcount`), as separate non-inlined stages — so their costs can be told apart.
    Split,
    /// `tq1` only: look sums up instead of decoding weights. The TQ1_0 matrix is repacked (on
    /// first use, or by `Weights::prepare_repacks`) into groups of three weights as a 4-bit pattern
    /// index and a sign bit (1.67 bits per weight), each token gets a table of the 14 pattern
    /// sums per group of three activations, and `vpshufb` does 32 lookups at once (see
    /// `formats::tq1_lut`).
    Lut,
    /// `tq1` only, at the portable level and at AVX-512 with VBMI and GFNI: look sums up in
    /// 32-entry tables with `vpermb`. Each group of three weights is one 5-bit code (pattern
    /// index and sign, 1.67 bits per weight), and each token's table holds every pattern sum
    /// and its negation, so a lookup is one `vpermb` and one add for 32 rows (see
    /// `formats::tq1_perm`).
    Perm,
}

impl KernelForm {
    pub const ALL: [KernelForm; 4] = [KernelForm::Fused, KernelForm::Split, KernelForm::Lut, KernelForm::Perm];
    pub fn name(self) -> &'static str {
        match self {
            KernelForm::Fused => "fused",
            KernelForm::Split => "split",
            KernelForm::Lut => "lut",
            KernelForm::Perm => "perm",
        }
    }
}

impl fmt::Display for KernelForm {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

impl FromStr for KernelForm {
    type Err = Error;
    fn from_str(s: &str) -> Result<Self> {
        KernelForm::ALL.iter().copied().find(|f| f.name() == s).ok_or_else(|| Error::UnknownName {
            what: "kernel form",
            got: s.to_string(),
            expected: KernelForm::ALL.map(|f| f.name()).join(", "),
        })
    }
}

/// Bytes of the split form's unpacked-code tile: small enough to stay in a 32 KiB L1d beside
/// the activations being read.
pub const TILE_BYTES: usize = 16 * 1024;

/// Rows per block of a matmul shared out between threads ([`Kernel::row_block`]): a multiple
/// of every kernel's row tile but the `perm` form's.
pub const ROW_BLOCK: usize = 16;

/// Most tokens a matmul of the `lut` form reads through lookup tables ([`Kernel::for_batch`]).
pub const LUT_MAX_BATCH: usize = 8;

/// A runnable kernel: a family at an ISA level in a form. Only constructible when this CPU
/// supports the ISA level, so running it is always sound.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Kernel {
    family: KernelFamily,
    isa: IsaLevel,
    form: KernelForm,
}

impl Kernel {
    /// The kernel, if this machine can run it; otherwise `Error::Unsupported` saying why.
    pub fn new(family: KernelFamily, isa: IsaLevel, form: KernelForm) -> Result<Self> {
        if !family.isa_levels().contains(&isa) {
            return Err(Error::Unsupported(format!(
                "kernel family '{family}' has no {isa} path (it has: {})",
                family.isa_levels().iter().map(|l| l.name()).collect::<Vec<_>>().join(", ")
            )));
        }
        if !family.forms().contains(&form) {
            return Err(Error::Unsupported(format!("kernel family '{family}' has no {form} form")));
        }
        if let Some(why) = isa.unsupported_reason() {
            return Err(Error::Unsupported(why));
        }
        if form == KernelForm::Perm {
            match isa {
                IsaLevel::Scalar => {}
                #[cfg(target_arch = "x86_64")]
                IsaLevel::Avx512 if x86_avx512::perm_supported() => {}
                IsaLevel::Avx512 => {
                    return Err(Error::Unsupported(
                        "the perm form needs AVX-512 VBMI (vpermb) and GFNI, which this CPU lacks".into(),
                    ))
                }
                _ => {
                    return Err(Error::Unsupported(format!(
                        "the perm form has no {isa} path (it has: scalar, avx512 with VBMI and GFNI)"
                    )))
                }
            }
        }
        Ok(Self { family, isa, form })
    }

    /// The fastest path of `family` on this CPU (best ISA level, the family's default form).
    pub fn best(family: KernelFamily) -> Self {
        let isa = family.isa_levels().iter().rev().copied().find(|l| l.is_supported()).unwrap_or(IsaLevel::Scalar);
        Self { family, isa, form: family.default_form(isa) }
    }

    /// The fastest kernel for weights of `format`.
    pub fn best_for(format: WeightFormat) -> Self {
        let family = match format {
            WeightFormat::I2 => KernelFamily::I2s,
            WeightFormat::Tq2_0 => KernelFamily::Tq2,
            WeightFormat::Tq1_0 => KernelFamily::Tq1,
            WeightFormat::BitPlanes | WeightFormat::Binary => KernelFamily::Xnor,
        };
        Self::best(family)
    }

    /// The kernel that runs `w`: `forced`, or the best for its format.
    #[inline]
    pub fn for_weights(forced: Option<Kernel>, w: &PackedWeights) -> Kernel {
        forced.unwrap_or_else(|| Self::best_for(w.format()))
    }

    /// The kernel that runs a batch of `batch` tokens: itself, except the `lut` form above
    /// [`LUT_MAX_BATCH`] tokens, which runs the same family's fused form. A lookup table is per
    /// token and its build and reads cost per token; the fused kernel decodes each row's digits
    /// once for the whole batch. On Zen 3 `lut` led at 8 tokens, was level or behind from 12 to
    /// 16 depending on the shape, and the fused kernel led at 128, so the limit is 8 (measured
    /// before and after the lut's batched epilogue went into vectors: docs/perf-notes.md).
    pub fn for_batch(self, batch: usize) -> Kernel {
        if self.uses_lut() && batch > LUT_MAX_BATCH {
            Kernel { form: KernelForm::Fused, ..self }
        } else {
            self
        }
    }

    /// The scratch this kernel grows on first use ([`KernelScratch`]), over calls of 1 to `batch`
    /// tokens of up to `padded_cols` columns whose rows have one scale each (every BitNet
    /// tensor). A matrix whose rows mix block scales runs a slower path that may grow the
    /// reordered buffer again, once per new largest batch.
    pub fn scratch_needs(self, padded_cols: usize, batch: usize) -> ScratchNeeds {
        let blocks = padded_cols.div_ceil(crate::formats::QK_K);
        let row_order = portable::tq1_row_chunks(blocks) * portable::TQ1_DIGIT_BLOCK;
        // The lookup forms run lookups (tables of up to LUT_MAX_BATCH tokens) up to
        // LUT_MAX_BATCH tokens and the fused form above: the fused form's needs for
        // LUT_MAX_BATCH + 1 ..= batch tokens.
        let tables = match self.form {
            KernelForm::Lut if self.uses_lut() => crate::formats::tq1_lut::lut_table_bytes(padded_cols),
            KernelForm::Perm if self.uses_perm() => crate::formats::tq1_perm::perm_table_bytes(padded_cols),
            _ => 0,
        } * batch.min(LUT_MAX_BATCH);
        let none = ScratchNeeds { tables, ..ScratchNeeds::default() };
        let fused_from = if self.uses_lut() { LUT_MAX_BATCH + 1 } else { 1 };
        if batch < fused_from || self.form == KernelForm::Split {
            return none;
        }
        match (self.family, self.isa) {
            #[cfg(target_arch = "x86_64")]
            (KernelFamily::Tq1, IsaLevel::Avx2) => ScratchNeeds {
                // Up to one token group: activations in row-stream digit order per token; more:
                // the decoded row block.
                reordered: if fused_from < x86_avx2::codes::UNPACK_MIN_BATCH {
                    batch.min(x86_avx2::codes::UNPACK_MIN_BATCH - 1) * row_order
                } else {
                    0
                },
                unpacked: if batch >= x86_avx2::codes::UNPACK_MIN_BATCH {
                    x86_avx2::codes::unpacked_scratch_bytes(padded_cols)
                } else {
                    0
                },
                tables,
            },
            // One token: row-stream digit order; up to two token groups: per-block digit order
            // for each token; more: the repacked row block.
            #[cfg(target_arch = "x86_64")]
            (KernelFamily::Tq1, IsaLevel::Avx512) => {
                let digits = batch.min(x86_avx512::tq1::TQ1_REPACK_MIN_BATCH - 1);
                ScratchNeeds {
                    reordered: match (fused_from, digits) {
                        (f, _) if f >= x86_avx512::tq1::TQ1_REPACK_MIN_BATCH => 0,
                        (1, 1) => row_order,
                        _ => (digits * blocks * portable::TQ1_DIGIT_BLOCK).max(row_order),
                    },
                    unpacked: if batch >= x86_avx512::tq1::TQ1_REPACK_MIN_BATCH {
                        x86_avx512::tq1::tq1_repack_scratch_bytes(padded_cols)
                    } else {
                        0
                    },
                    tables,
                }
            }
            // One token: the activations in the codes' lane order.
            (KernelFamily::Tq2, IsaLevel::Avx512) => ScratchNeeds { reordered: padded_cols, ..none },
            _ => none,
        }
    }

    /// Rows per block when a matmul's rows are shared out between threads: a multiple of this
    /// kernel's row tile, so that no tile straddles two blocks (a kernel computes a partly
    /// covered tile whole and drops the rows outside its range). [`ROW_BLOCK`], or the `perm`
    /// form's 32-row tiles for the batches it runs (at 16, a tile split between two blocks was
    /// computed whole on both sides).
    pub fn row_block(&self) -> usize {
        if self.uses_perm() {
            crate::formats::tq1_perm::PERM_TILE_ROWS
        } else {
            ROW_BLOCK
        }
    }

    /// Whether this kernel reads TQ1_0 weights through a table-lookup repack and tables of
    /// the tokens (the `lut` and `perm` forms; up to [`LUT_MAX_BATCH`] tokens).
    pub fn uses_lut(&self) -> bool {
        self.family == KernelFamily::Tq1 && matches!(self.form, KernelForm::Lut | KernelForm::Perm)
    }

    /// Whether those are the `perm` form's 32-entry ones (`formats::tq1_perm`) rather than the
    /// `lut` form's (`formats::tq1_lut`).
    pub fn uses_perm(&self) -> bool {
        self.family == KernelFamily::Tq1 && self.form == KernelForm::Perm
    }

    /// Whether this kernel reads TQ2_0 weights through their codes without scales
    /// ([`Tq2Matrix::codes`](crate::formats::Tq2Matrix::codes)) where a matrix has rows of one
    /// scale: the fused AVX2 kernel, at every batch size.
    pub fn uses_tq2_codes(&self) -> bool {
        self.family == KernelFamily::Tq2 && self.isa == IsaLevel::Avx2 && self.form == KernelForm::Fused
    }

    /// Makes what this kernel reads beside `w` (the `lut` form's repack, the fused AVX2 tq2
    /// kernel's code copy), so that the first call does not pay for it.
    pub fn prepare(&self, w: &PackedWeights) {
        match w {
            PackedWeights::Tq1(m) if self.uses_perm() => {
                m.perm();
            }
            PackedWeights::Tq1(m) if self.uses_lut() => {
                m.lut();
            }
            PackedWeights::Tq2(m) if self.uses_tq2_codes() => {
                m.codes();
            }
            _ => {}
        }
    }

    /// Whether [`Kernel::prepare`] has nothing left to make for `w`.
    pub fn prepared(&self, w: &PackedWeights) -> bool {
        match w {
            PackedWeights::Tq1(m) if self.uses_perm() => m.perm_made(),
            PackedWeights::Tq1(m) if self.uses_lut() => m.lut_made(),
            PackedWeights::Tq2(m) if self.uses_tq2_codes() => m.codes_made(),
            _ => true,
        }
    }

    /// Bytes of memory this kernel holds beside `w` (made or not): the `lut` form's repack, the
    /// fused AVX2 tq2 kernel's code copy.
    pub fn repack_bytes(&self, w: &PackedWeights) -> usize {
        match w {
            PackedWeights::Tq1(_) if self.uses_perm() => {
                crate::formats::tq1_perm::perm_matrix_bytes(w.rows(), w.cols())
            }
            PackedWeights::Tq1(_) if self.uses_lut() => crate::formats::tq1_lut::lut_matrix_bytes(w.rows(), w.cols()),
            PackedWeights::Tq2(m) if self.uses_tq2_codes() => m.codes_byte_len(),
            _ => 0,
        }
    }

    /// Bytes this kernel reads to use every weight of `w` once: the repack's for the `lut`
    /// form (when the matrix has one); for the fused AVX2 tq2 kernel, the codes of rows of one
    /// scale and the blocks of the others; the matrix's own otherwise.
    pub fn bytes_read(&self, w: &PackedWeights) -> usize {
        match w {
            PackedWeights::Tq1(m) if self.uses_perm() => m.perm().map_or(m.byte_len(), |p| p.byte_len()),
            PackedWeights::Tq1(m) if self.uses_lut() => m.lut().map_or(m.byte_len(), |l| l.byte_len()),
            PackedWeights::Tq2(m) if self.uses_tq2_codes() => {
                let (uniform, rows) = (m.uniform_row_count(), m.rows());
                (uniform * m.codes_byte_len() + (rows - uniform) * m.byte_len()) / rows
            }
            _ => w.byte_len(),
        }
    }

    /// What this kernel streams of `w` from output row `row` on, to the end of the array it
    /// reads (the `lut` or `perm` repack of a TQ1_0 matrix, from the tile of the row; a TQ2_0
    /// matrix's code copy where the fused AVX2 kernel reads it; else the packed rows); for
    /// prefetch hints only. A repack or code copy not made yet gives nothing: this never
    /// makes one.
    pub fn stream_from(&self, w: &PackedWeights, row: usize) -> PrefetchRange {
        if row >= w.rows() {
            return PrefetchRange::EMPTY;
        }
        // Arrays of equal-sized rows: row r starts at r / rows of the array.
        let rows_of = |all: PrefetchRange| all.window(all.len() / w.rows().max(1) * row, usize::MAX);
        match w {
            PackedWeights::Tq1(m) if self.uses_perm() => match m.perm_made().then(|| m.perm()).flatten() {
                Some(p) => PrefetchRange::of(p.bytes()).window(p.tile_offset(row), usize::MAX),
                None => PrefetchRange::EMPTY,
            },
            PackedWeights::Tq1(m) if self.uses_lut() => match m.lut_made().then(|| m.lut()).flatten() {
                Some(l) => PrefetchRange::of(l.bytes()).window(l.tile_offset(row), usize::MAX),
                None => PrefetchRange::EMPTY,
            },
            PackedWeights::Tq2(m) if self.uses_tq2_codes() && !m.codes_made() => PrefetchRange::EMPTY,
            // No copy where no row has one scale: the kernel reads the blocks.
            PackedWeights::Tq2(m) if self.uses_tq2_codes() && m.codes().is_some() => {
                m.codes().map_or(PrefetchRange::EMPTY, |c| rows_of(PrefetchRange::of(c)))
            }
            PackedWeights::Tq2(m) => rows_of(PrefetchRange::of(m.blocks())),
            PackedWeights::Tq1(m) => rows_of(PrefetchRange::of(m.blocks())),
            PackedWeights::I2(m) => PrefetchRange::of(m.bytes()).window(m.row_bytes() * row, usize::MAX),
            PackedWeights::BitPlanes(m) => rows_of(PrefetchRange::of(m.all_words())),
            PackedWeights::Binary(m) => rows_of(PrefetchRange::of(m.all_words())),
        }
    }

    /// Every kernel this machine can run.
    pub fn all_supported() -> Vec<Kernel> {
        let mut v = Vec::new();
        for family in KernelFamily::ALL {
            for &isa in family.isa_levels() {
                for &form in family.forms() {
                    if let Ok(k) = Kernel::new(family, isa, form) {
                        v.push(k);
                    }
                }
            }
        }
        v
    }

    pub fn family(&self) -> KernelFamily {
        self.family
    }
    pub fn isa(&self) -> IsaLevel {
        self.isa
    }
    pub fn form(&self) -> KernelForm {
        self.form
    }

    /// `family/isa/form`, e.g. `i2s/avx512/fused`.
    pub fn name(&self) -> String {
        format!("{}/{}/{}", self.family, self.isa, self.form)
    }

    /// Checks that the arguments fit this kernel (cheap; no allocation unless they do not).
    pub fn check(&self, w: &PackedWeights, x: &ActivationBatch, rows: &Range<usize>, out: &[f32]) -> Result<()> {
        if !self.family.accepts(w.format()) {
            return Err(Error::Unsupported(format!(
                "kernel family '{}' cannot read {} weights (it reads {})",
                self.family,
                w.format(),
                self.family.native_format()
            )));
        }
        if x.cols() != w.cols() {
            return Err(Error::Shape(format!("weights have K = {} but activations have K = {}", w.cols(), x.cols())));
        }
        if rows.start > rows.end || rows.end > w.rows() {
            return Err(Error::Shape(format!("row range {rows:?} is outside 0..{}", w.rows())));
        }
        if out.len() != rows.len() * x.batch() {
            return Err(Error::Shape(format!(
                "output needs {} rows × {} tokens = {} floats, got {}",
                rows.len(),
                x.batch(),
                rows.len() * x.batch(),
                out.len()
            )));
        }
        if self.family == KernelFamily::Xnor && !x.planes_ready() {
            return Err(Error::Shape(
                "the xnor kernels need activation bit-planes: call ActivationBatch::build_planes first".into(),
            ));
        }
        Ok(())
    }

    /// `out[(r − rows.start) × B + b] = Σ_k w[r][k] × x_b[k]` (scaled). See the module docs.
    pub fn matmul(
        &self,
        w: &PackedWeights,
        x: &ActivationBatch,
        rows: Range<usize>,
        out: &mut [f32],
        scratch: &mut KernelScratch,
    ) -> Result<()> {
        self.check(w, x, &rows, out)?;
        if rows.is_empty() {
            return Ok(());
        }
        scratch.ensure(x.padded_cols());
        if self.family == KernelFamily::Scalar {
            scalar::matmul(w, x, rows, out);
            return Ok(());
        }
        // The form that runs this batch: the one place the lut form's batch limit applies.
        let ran = self.for_batch(x.batch());
        match self.isa {
            IsaLevel::Scalar => portable::matmul(ran.form, w, x, rows, out, scratch),
            #[cfg(target_arch = "x86_64")]
            IsaLevel::Avx2 => x86_avx2::matmul(
                Avx2::new().expect("Kernel::new checked AVX2 support"),
                ran.form,
                w,
                x,
                rows,
                out,
                scratch,
            ),
            #[cfg(target_arch = "x86_64")]
            IsaLevel::Avx512 => x86_avx512::matmul(
                Avx512::new().expect("Kernel::new checked AVX-512 support"),
                ran.form,
                w,
                x,
                rows,
                out,
                scratch,
            ),
            #[cfg(not(target_arch = "x86_64"))]
            _ => unreachable!("Kernel::new only accepts the scalar level off x86-64"),
        }
        Ok(())
    }
}

/// One stage of a split kernel, run alone by [`Kernel::run_stage_alone`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum SplitStage {
    Unpack,
    Dot,
    Xnor,
    Popcount,
}

impl SplitStage {
    pub fn name(self) -> &'static str {
        match self {
            SplitStage::Unpack => "unpack",
            SplitStage::Dot => "dot",
            SplitStage::Xnor => "xnor",
            SplitStage::Popcount => "popcount",
        }
    }

    /// The two stages of the split form of `family`.
    pub fn of(family: KernelFamily) -> [SplitStage; 2] {
        match family {
            KernelFamily::Xnor => [SplitStage::Xnor, SplitStage::Popcount],
            _ => [SplitStage::Unpack, SplitStage::Dot],
        }
    }
}

impl Kernel {
    /// Runs one stage of this kernel's split form alone over `rows`, so hardware counters can
    /// be read around a single stage (reading them inside the kernel, per tile, would cost more
    /// than the tile). `out` receives meaningless values for `dot`/`popcount` (see
    /// `portable::stage_alone`); the returned checksum keeps the work from being optimised out.
    pub fn run_stage_alone(
        &self,
        stage: SplitStage,
        w: &PackedWeights,
        x: &ActivationBatch,
        rows: Range<usize>,
        out: &mut [f32],
        scratch: &mut KernelScratch,
    ) -> Result<u64> {
        let split = Kernel { form: KernelForm::Split, ..*self };
        split.check(w, x, &rows, out)?;
        if self.family == KernelFamily::Scalar || !SplitStage::of(self.family).contains(&stage) {
            return Err(Error::Unsupported(format!("kernel {} has no {} stage", self.family, stage.name())));
        }
        if rows.is_empty() {
            return Ok(0);
        }
        scratch.ensure(x.padded_cols());
        Ok(match self.isa {
            IsaLevel::Scalar => portable::stage_alone(portable::Portable, stage, w, x, rows, out, scratch),
            #[cfg(target_arch = "x86_64")]
            IsaLevel::Avx2 => portable::stage_alone(
                Avx2::new().expect("Kernel::new checked AVX2 support"),
                stage,
                w,
                x,
                rows,
                out,
                scratch,
            ),
            #[cfg(target_arch = "x86_64")]
            IsaLevel::Avx512 => portable::stage_alone(
                Avx512::new().expect("Kernel::new checked AVX-512 support"),
                stage,
                w,
                x,
                rows,
                out,
                scratch,
            ),
            #[cfg(not(target_arch = "x86_64"))]
            _ => unreachable!("Kernel::new only accepts the scalar level off x86-64"),
        })
    }
}

impl fmt::Display for Kernel {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.name())
    }
}

/// Final scaling of the tensor-scaled formats (shared by every path: see module docs).
#[inline(always)]
pub(crate) fn finish_tensor(isum: i32, w_scale: f32, x_scale: f32) -> f32 {
    isum as f32 * w_scale * x_scale
}

/// Final scaling of the block-scaled formats (see module docs).
#[inline(always)]
pub(crate) fn finish_blocks(acc: f64, x_scale: f32) -> f32 {
    acc as f32 * x_scale
}

/// Per-row scaling of an unpacked tile: one scale per tensor, or the f16 scale of each
/// 256-weight block of each row.
#[derive(Clone, Copy)]
pub(crate) enum TileScales<'a> {
    Tensor(f32),
    Tq2(&'a crate::formats::Tq2Matrix),
    Tq1(&'a crate::formats::Tq1Matrix),
}

impl TileScales<'_> {
    /// f64 scale of block `blk` of weight row `row` (block-scaled formats only).
    #[inline(always)]
    pub(crate) fn block_d(&self, row: usize, blk: usize) -> f64 {
        match self {
            TileScales::Tensor(_) => unreachable!("tensor-scaled tile has no block scales"),
            TileScales::Tq2(m) => m.row(row)[blk].d.to_f64(),
            TileScales::Tq1(m) => m.row(row)[blk].d.to_f64(),
        }
    }

    /// Whether every block of weight row `row` has the same scale (every BitNet tensor's rows),
    /// so that the row's dot product may be scaled once instead of block by block.
    #[inline(always)]
    pub(crate) fn row_uniform(&self, row: usize) -> bool {
        match self {
            TileScales::Tensor(_) => true,
            TileScales::Tq2(m) => m.row_has_uniform_scale(row),
            TileScales::Tq1(m) => m.row_has_uniform_scale(row),
        }
    }
}

/// Weight bytes of a row block of the batched tiles ([`batched_tiles`]). The first token
/// group reads the block from memory, the later groups find it in L2 (1 MiB on Zen 5, 2 MiB
/// on Sapphire Rapids; 512 KiB on older cores).
pub(crate) const ROW_BLOCK_BYTES: usize = 128 * 1024;

/// The first bytes of rows `r..r+R` (`row(i)`: row i's) and of tokens `b0..b0+G`'s activations,
/// for the register tiles of every ISA. Plain loops, not `array::from_fn`, whose closures are
/// not always inlined into a kernel.
#[inline(always)]
pub(crate) fn tile_pointers<const R: usize, const G: usize>(
    row: impl Fn(usize) -> *const u8,
    r: usize,
    x: &ActivationBatch,
    b0: usize,
) -> ([*const u8; R], [*const u8; G]) {
    let (mut src, mut xs) = ([std::ptr::null(); R], [std::ptr::null(); G]);
    for (i, s) in src.iter_mut().enumerate() {
        *s = row(r + i);
    }
    for (g, p) in xs.iter_mut().enumerate() {
        *p = x.token(b0 + g).as_ptr() as *const u8;
    }
    (src, xs)
}

/// Calls `tile(r, rows_left, b0, g, first, out_r)` over rows × tokens of a batched (B > 1)
/// matmul: blocks of rows of about [`ROW_BLOCK_BYTES`]; in each block, the tokens in groups of
/// up to `TILE_TOKENS` (`first` for the first group, which streams the block from memory); in
/// each group, the rows from `r` on, `rows_left` (≤ `TILE_ROWS`) of them still in the block,
/// `out_r` the outputs from row `r` on (`out_r[i × batch + b]`). `tile` returns how many rows
/// it did.
///
/// Why blocks: with all 8 tokens in one pass, the tile needs 32 accumulators (or two rows per
/// pass and four code vectors per row, the kernel before this one), and a 6912-wide token
/// group of 8 is 55 KiB of activations, more than Zen 5's 48 KiB L1d, so every activation
/// load went to L2. Four tokens' activations stay in L1 and the block's rows are read from
/// memory once (measured faster on every 2B4T shape on Zen 5: docs/perf-notes.md).
#[inline(always)]
pub(crate) fn batched_tiles<const TILE_ROWS: usize, const TILE_TOKENS: usize>(
    rows: Range<usize>,
    row_bytes: usize,
    batch: usize,
    out: &mut [f32],
    mut tile: impl FnMut(usize, usize, usize, usize, bool, &mut [f32]) -> usize,
) {
    let block_rows = (ROW_BLOCK_BYTES / row_bytes.max(1)).max(TILE_ROWS) / TILE_ROWS * TILE_ROWS;
    let mut start = rows.start;
    while start < rows.end {
        let end = rows.end.min(start + block_rows);
        let mut b0 = 0;
        while b0 < batch {
            let g = TILE_TOKENS.min(batch - b0);
            let mut r = start;
            while r < end {
                r += tile(r, TILE_ROWS.min(end - r), b0, g, b0 == 0, &mut out[(r - rows.start) * batch..]);
            }
            b0 += g;
        }
        start = end;
    }
}

#[cfg(test)]
mod tests;
