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
//!   absmax). SIMD paths rely on this to sum in vector lanes.

/// Safe entry points `$name(token, args…)` that compile a portable Rust function (plain loops,
/// no intrinsics) with an ISA's target features enabled: the same IEEE operations in the same
/// order (Rust never fuses a multiply and an add on its own), so the same results as the
/// baseline build, with the compiler free to use wider vectors. The token proves the features.
#[cfg(target_arch = "x86_64")]
macro_rules! compiled_for {
    ($token:ty, $features:literal; $($name:ident($($arg:ident: $ty:ty),*) $(-> $ret:ty)? = $portable:path;)*) => {$(
        // The token adds an argument to the portable function's.
        #[allow(clippy::too_many_arguments)]
        pub(crate) fn $name(_t: $token, $($arg: $ty),*) $(-> $ret)? {
            #[target_feature(enable = $features)]
            unsafe fn compiled($($arg: $ty),*) $(-> $ret)? {
                $portable($($arg),*)
            }
            // SAFETY: the token proves the CPU has these features; the body is safe Rust.
            unsafe { compiled($($arg),*) }
        }
    )*};
}

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

mod portable;
mod scalar;
#[cfg(target_arch = "x86_64")]
mod x86_avx2;
#[cfg(target_arch = "x86_64")]
mod x86_avx512;
#[cfg(target_arch = "x86_64")]
mod x86_pipes;

use std::fmt;
use std::ops::Range;
use std::str::FromStr;

use crate::activations::ActivationBatch;
use crate::aligned::AlignedBytes;
use crate::cpu::IsaLevel;
use crate::error::{Error, Result};
use crate::formats::{PackedWeights, WeightFormat};
use crate::instrument::SplitTicks;
use crate::model::KvPrecision;

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
    /// buffer (AVX2, in cache: fused 1.5-2.3× split for 1, 2 and 8 tokens). On AVX2 `tq1`
    /// looks sums up instead (`lut`: 1.86× fused for one token on Zen 3, 2B4T shapes in cache,
    /// and no slower for batches). At AVX-512 it depends on the core
    /// ([`cpu::avx512_on_256_bit_units`](crate::cpu::avx512_on_256_bit_units)): Zen 4 runs a zmm
    /// `vpdpbusd` as two 256-bit halves, and there the lookup forms beat the fused `vpdpbusd`
    /// kernel (`bitnet-bench kernels`, 2B4T shapes, one thread, in cache: one token, GB/s, fused
    /// 17.3–20.5, `lut` 23.0–25.1, `perm` 32–35; eight tokens on 2560-wide rows, Mrow·tok/s,
    /// fused 45–46, `lut` 51–54, `perm` 69–70), so `perm` where the CPU has VBMI and GFNI (every
    /// Zen 4), else `lut`. Cores with full-width AVX-512 (Zen 5, where the fused kernel read
    /// 80–95% of the bandwidth) keep the fused form, which the lookup forms have not been
    /// measured against there.
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

/// Bytes of [`KernelScratch`]'s grown buffers one kernel reads ([`Kernel::scratch_needs`]).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct ScratchNeeds {
    /// Activations rearranged for the kernel (`KernelScratch::x_reordered`).
    pub reordered: usize,
    /// Decoded rows of a row block (`KernelScratch::unpacked`).
    pub unpacked: usize,
    /// The tokens' lookup tables of the `lut` and `perm` forms (`KernelScratch::tables`).
    pub tables: usize,
}

/// The tokens' tables a `lut` or `perm` kernel reads (built by [`KernelScratch::tables_of`]):
/// token b's are `bytes[b × stride..(b + 1) × stride]`.
#[derive(Debug, Clone, Copy)]
pub(crate) struct TokenTables<'a> {
    bytes: &'a [u8],
    stride: usize,
}

impl<'a> TokenTables<'a> {
    /// Token `b`'s tables.
    #[inline]
    pub(crate) fn token(&self, b: usize) -> &'a [u8] {
        &self.bytes[b * self.stride..(b + 1) * self.stride]
    }
}

/// Per-thread scratch of the kernels (the split forms' tiles, rearranged activations, decoded
/// rows, the lookup forms' tables). Grows on first use with a larger K; after that a matmul
/// allocates nothing.
#[derive(Debug, Clone)]
pub struct KernelScratch {
    /// Unpacked codes, `[tile_rows, padded_cols]`.
    codes: AlignedBytes,
    /// AND results of the xnor stage, `[8 planes, 2 (mask, sign), plane_words]`.
    words: Vec<u64>,
    /// Activations rearranged for the AVX-512 TQ1 and TQ2 kernels (TQ1 digit order,
    /// `[tokens, cols / 256, 320]` for up to eight tokens, or TQ2 lane order, `[cols]`); grown
    /// on first use for a batch size, so later calls allocate nothing.
    pub(crate) x_reordered: AlignedBytes,
    /// Decoded codes of a block of rows for the batched TQ1 kernels (repacked as I2 blocks:
    /// `x86_avx2::unpacked_scratch_bytes`, `x86_avx512::tq1_repack_scratch_bytes`); grown on
    /// first use.
    pub(crate) unpacked: AlignedBytes,
    /// The `lut` or `perm` tables of the tokens last given (`[tokens, table bytes]`, see
    /// [`KernelScratch::tables_of`]); grown on first use for a batch size.
    tables: AlignedBytes,
    /// Whose tables `tables` holds: the activations' stamp and the form.
    tables_of: Option<(u64, KernelForm)>,
    /// Time spent building tables since [`KernelScratch::take_table_ticks`] (when timing).
    table_ticks: u64,
    /// Whether split forms time their stages on sampled tiles (see [`crate::instrument`]).
    pub(crate) time_stages: bool,
    /// What the split forms measured since [`KernelScratch::take_split_ticks`].
    pub(crate) split_ticks: SplitTicks,
    /// Rotates which tiles the split forms time (see `portable::sample_positions`).
    pub(crate) sample_phase: usize,
}

impl Default for KernelScratch {
    fn default() -> Self {
        Self::new()
    }
}

impl KernelScratch {
    pub fn new() -> Self {
        Self {
            codes: AlignedBytes::zeroed(TILE_BYTES),
            words: Vec::new(),
            x_reordered: AlignedBytes::zeroed(0),
            unpacked: AlignedBytes::zeroed(0),
            tables: AlignedBytes::zeroed(0),
            tables_of: None,
            table_ticks: 0,
            time_stages: false,
            split_ticks: SplitTicks::default(),
            sample_phase: 0,
        }
    }

    /// Preallocates for activations of `padded_cols` columns.
    pub fn for_cols(padded_cols: usize) -> Self {
        let mut s = Self::new();
        s.ensure(padded_cols);
        s
    }

    /// Preallocates everything `kernels` would otherwise grow on first use, for calls of 1 to
    /// `batch` tokens of up to `padded_cols` columns ([`Kernel::scratch_needs`]). A state needs
    /// this: with work stealing a thread can meet a matrix (say, the FFN down projection's wider
    /// rows) for the first time long after warm-up, and growing then would allocate mid-decode.
    /// Only what these kernels read is made: a TQ2 model on AVX2 had held the TQ1 kernels'
    /// 128 KiB row block and a reordered-activation buffer of `batch` × 320 bytes per block
    /// on every thread.
    pub fn for_kernels(padded_cols: usize, batch: usize, kernels: impl IntoIterator<Item = Kernel>) -> Self {
        let mut s = Self::for_cols(padded_cols);
        let mut most = ScratchNeeds::default();
        for k in kernels {
            let need = k.scratch_needs(padded_cols, batch);
            most.reordered = most.reordered.max(need.reordered);
            most.unpacked = most.unpacked.max(need.unpacked);
            most.tables = most.tables.max(need.tables);
        }
        s.x_reordered = AlignedBytes::zeroed(most.reordered);
        s.unpacked = AlignedBytes::zeroed(most.unpacked);
        s.tables = AlignedBytes::zeroed(most.tables);
        s
    }

    /// Bytes of the grown buffers this scratch holds now (see [`Kernel::scratch_needs`]).
    pub fn held(&self) -> ScratchNeeds {
        ScratchNeeds { reordered: self.x_reordered.len(), unpacked: self.unpacked.len(), tables: self.tables.len() }
    }

    /// The `lut` (`form` = Lut) or `perm` (Perm) tables of every token of `x`, built here
    /// unless this scratch already holds them for these very values (`x.stamp()`): each
    /// thread builds its own, once per quantized activation, in its own cache. Built by the
    /// caller into the activations and read by every thread, they had taken 2.3× as long to
    /// write with two Zen 4 threads as with one (every line the other core had read must first
    /// be taken back from it) while the other thread waited. Grows the storage if
    /// `for_kernels` made no room for this batch.
    pub(crate) fn tables_of(&mut self, form: KernelForm, x: &ActivationBatch) -> TokenTables<'_> {
        let perm = form == KernelForm::Perm;
        let cols = x.cols();
        let stride = if perm {
            crate::formats::tq1_perm::perm_table_bytes(cols)
        } else {
            crate::formats::tq1_lut::lut_table_bytes(cols)
        };
        let bytes = x.batch() * stride;
        if self.tables_of != Some((x.stamp(), form)) {
            let t0 = if self.time_stages { crate::instrument::clock::now() } else { 0 };
            if self.tables.len() < bytes {
                self.tables = AlignedBytes::zeroed(bytes);
            }
            for b in 0..x.batch() {
                let dst = &mut self.tables.as_mut_slice()[b * stride..(b + 1) * stride];
                if perm {
                    build_perm_tables(&x.token(b)[..cols], dst);
                } else {
                    build_lut_tables(&x.token(b)[..cols], dst);
                }
            }
            self.tables_of = Some((x.stamp(), form));
            if self.time_stages {
                self.table_ticks += crate::instrument::clock::now() - t0;
            }
        }
        TokenTables { bytes: &self.tables.as_slice()[..bytes], stride }
    }

    /// Time the lookup forms spent building tables since the last call (and resets it);
    /// counted only while [`Self::set_time_stages`] is on.
    pub fn take_table_ticks(&mut self) -> u64 {
        std::mem::take(&mut self.table_ticks)
    }

    fn ensure(&mut self, padded_cols: usize) {
        if self.codes.len() < padded_cols {
            self.codes = AlignedBytes::zeroed(padded_cols);
        }
        let words = 16 * padded_cols / 64;
        if self.words.len() < words {
            self.words = vec![0; words];
        }
    }

    /// Makes the split forms time their two stages on every
    /// [`TIMED_TILE_EVERY`](crate::instrument::TIMED_TILE_EVERY)-th tile.
    pub fn set_time_stages(&mut self, on: bool) {
        self.time_stages = crate::instrument::ENABLED && on;
    }

    /// What the split forms measured since the last call (and resets it).
    pub fn take_split_ticks(&mut self) -> SplitTicks {
        std::mem::take(&mut self.split_ticks)
    }

    /// Rows per unpack tile for this K.
    pub fn tile_rows(&self, padded_cols: usize) -> usize {
        (self.codes.len() / padded_cols).max(1)
    }
}

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
    /// once for the whole batch. Zen 3, `bitnet-bench kernels`, TQ1 2B4T shapes, µs per call of
    /// q/o, k/v, gate/up, down (lut / fused), before the lut's batched epilogue was in vectors:
    /// B=8 661/710, 165/186, 1957/3100 (noisy), 2217/1959; B=16 1335/1186, 366/304, 5259/5295,
    /// 4443/3245; B=128 fused 1.4–2.2× ahead. Since the
    /// lut's batched epilogue is in vectors (Mrow·tok/s, lut / fused): B=8 q/o 43.8/30.9, down
    /// 15.3/11.9; B=12–16 q/o 39.6–42.6/35.1–37.9 but down 11.4–14.8/13.6–14.6 (noisy), so the
    /// limit stays at 8.
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
                reordered: if fused_from < x86_avx2::UNPACK_MIN_BATCH {
                    batch.min(x86_avx2::UNPACK_MIN_BATCH - 1) * row_order
                } else {
                    0
                },
                unpacked: if batch >= x86_avx2::UNPACK_MIN_BATCH {
                    x86_avx2::unpacked_scratch_bytes(padded_cols)
                } else {
                    0
                },
                tables,
            },
            // One token: row-stream digit order; up to two token groups: per-block digit order
            // for each token; more: the repacked row block.
            #[cfg(target_arch = "x86_64")]
            (KernelFamily::Tq1, IsaLevel::Avx512) => {
                let digits = batch.min(x86_avx512::TQ1_REPACK_MIN_BATCH - 1);
                ScratchNeeds {
                    reordered: match (fused_from, digits) {
                        (f, _) if f >= x86_avx512::TQ1_REPACK_MIN_BATCH => 0,
                        (1, 1) => row_order,
                        _ => (digits * blocks * portable::TQ1_DIGIT_BLOCK).max(row_order),
                    },
                    unpacked: if batch >= x86_avx512::TQ1_REPACK_MIN_BATCH {
                        x86_avx512::tq1_repack_scratch_bytes(padded_cols)
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
                x86_avx2::Avx2::new().expect("Kernel::new checked AVX2 support"),
                ran.form,
                w,
                x,
                rows,
                out,
                scratch,
            ),
            #[cfg(target_arch = "x86_64")]
            IsaLevel::Avx512 => x86_avx512::matmul(
                x86_avx512::Avx512::new().expect("Kernel::new checked AVX-512 support"),
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
                x86_avx2::Avx2::new().expect("Kernel::new checked AVX2 support"),
                stage,
                w,
                x,
                rows,
                out,
                scratch,
            ),
            #[cfg(target_arch = "x86_64")]
            IsaLevel::Avx512 => portable::stage_alone(
                x86_avx512::Avx512::new().expect("Kernel::new checked AVX-512 support"),
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

/// The shape checks of the LM-head matmuls: K matches the activations, `rows` lies inside the
/// matrix, and `out` has one value per row and token.
fn check_head_shape(
    what: &str,
    m_rows: usize,
    m_cols: usize,
    x: &ActivationBatch,
    rows: &Range<usize>,
    out_len: usize,
) -> Result<()> {
    if x.cols() != m_cols {
        return Err(Error::Shape(format!("{what} have K = {m_cols} but activations have K = {}", x.cols())));
    }
    if rows.end > m_rows || out_len != rows.len() * x.batch() {
        return Err(Error::Shape(format!(
            "{what}: rows {rows:?} of {m_rows} with {} tokens need {} outputs, got {out_len}",
            x.batch(),
            rows.len() * x.batch(),
        )));
    }
    Ok(())
}

/// `out[(r − rows.start) × B + b] = Σ_k E[r][k] × x_b[k]` for int8 rows `E` (the LM head), scaled
/// by the row's and the token's scales: `isum as f32 * row_scale * x_scale`. Uses the best ISA
/// level at or below `isa` that this CPU has; every level gives identical results.
pub fn int8_rows_matmul(
    isa: IsaLevel,
    m: &crate::formats::Int8Rows,
    x: &ActivationBatch,
    rows: Range<usize>,
    out: &mut [f32],
) -> Result<()> {
    check_head_shape("int8 rows", m.rows(), m.cols(), x, &rows, out.len())?;
    #[cfg(target_arch = "x86_64")]
    if isa >= IsaLevel::Avx512 {
        if let Some(t) = x86_avx512::Avx512::new() {
            x86_avx512::int8_rows(t, m, x, rows, out);
            return Ok(());
        }
    }
    #[cfg(target_arch = "x86_64")]
    if isa >= IsaLevel::Avx2 {
        if let Some(t) = x86_avx2::Avx2::new() {
            x86_avx2::int8_rows(t, m, x, rows, out);
            return Ok(());
        }
    }
    let _ = isa;
    let batch = x.batch();
    for (i, r) in rows.enumerate() {
        let codes = m.row_codes(r);
        for b in 0..batch {
            let isum: i32 =
                codes.iter().zip(x.token(b)).map(|(c, v)| *c as i32 * *v as i32).sum::<i32>() - 128 * x.sum(b);
            out[i * batch + b] = finish_tensor(isum, m.scale(r), x.scale(b));
        }
    }
    Ok(())
}

/// The LM head: `out[(r − rows.start) × B + b]` = row r of `m` · token b, in the head's own
/// format ([`int8_rows_matmul`] or [`q6k_rows_matmul`]).
pub fn head_matmul(
    isa: IsaLevel,
    m: &crate::formats::EmbeddingRows,
    x: &ActivationBatch,
    rows: Range<usize>,
    out: &mut [f32],
) -> Result<()> {
    match m {
        crate::formats::EmbeddingRows::Int8(m) => int8_rows_matmul(isa, m, x, rows, out),
        crate::formats::EmbeddingRows::Q6K(m) => q6k_rows_matmul(isa, m, x, rows, out),
    }
}

/// `out[(r − rows.start) × B + b]` = row r of a Q6_K matrix · token b: per 256-weight block the
/// exact integer `Σⱼ scaleⱼ · Σ (q − 32)·x` over its 16 sub-blocks, times the block's `d` in
/// f64, summed over blocks in order, then scaled by the token's scale (`finish_blocks`).
/// Uses the best ISA level at or below `isa` that this CPU has; every level gives identical
/// results. AVX-512 runs a VNNI kernel on two or more tokens, where the head is
/// compute-bound, once the 16-row groups are made ([`crate::formats::Q6kRows::prepare_groups`])
/// and the tokens' offsets built ([`ActivationBatch::build_q6k_offsets`]). One token (read at
/// the bus rate) and batches without them run the AVX2 code.
pub fn q6k_rows_matmul(
    isa: IsaLevel,
    m: &crate::formats::Q6kRows,
    x: &ActivationBatch,
    rows: Range<usize>,
    out: &mut [f32],
) -> Result<()> {
    check_q6k_shape("Q6_K rows", m.rows(), m.cols(), x, &rows, out.len())?;
    #[cfg(target_arch = "x86_64")]
    if let (Some(g), true) = (m.groups(), q6k_groups_used(isa, x.batch()) && x.q6k_offsets_ready()) {
        if let Some(t) = x86_avx512::Avx512::new() {
            x86_avx512::q6k_groups(t, g, x, rows, out);
            return Ok(());
        }
    }
    #[cfg(target_arch = "x86_64")]
    if isa >= IsaLevel::Avx2 {
        if let Some(t) = x86_avx2::Avx2::new() {
            x86_avx2::q6k_rows(t, m, x, rows, out);
            return Ok(());
        }
    }
    let _ = isa;
    q6k_rows_portable(m, x, rows, out);
    Ok(())
}

/// `out[(r − rows.start) × B + b]` = row r of a Q6_K matrix in 16-row groups · token b, with
/// the arithmetic of [`q6k_rows_matmul`] (and so its results, bit for bit). AVX-512 VNNI runs
/// its kernel once the tokens' offsets are built ([`ActivationBatch::build_q6k_offsets`]);
/// otherwise the portable loop.
pub fn q6k_groups_matmul(
    isa: IsaLevel,
    m: &crate::formats::Q6kRowGroups,
    x: &ActivationBatch,
    rows: Range<usize>,
    out: &mut [f32],
) -> Result<()> {
    check_q6k_shape("Q6_K row groups", m.rows(), m.cols(), x, &rows, out.len())?;
    #[cfg(target_arch = "x86_64")]
    if isa >= IsaLevel::Avx512 && x.q6k_offsets_ready() {
        if let Some(t) = x86_avx512::Avx512::new() {
            x86_avx512::q6k_groups(t, m, x, rows, out);
            return Ok(());
        }
    }
    let _ = isa;
    q6k_rows_portable(m, x, rows, out);
    Ok(())
}

/// [`check_head_shape`], and activations without padding columns (whole 256-weight blocks),
/// for both Q6_K layouts.
fn check_q6k_shape(
    what: &str,
    m_rows: usize,
    m_cols: usize,
    x: &ActivationBatch,
    rows: &Range<usize>,
    out_len: usize,
) -> Result<()> {
    check_head_shape(what, m_rows, m_cols, x, rows, out_len)?;
    if x.padded_cols() != m_cols {
        return Err(Error::Shape(format!(
            "{what} need unpadded activations ({} columns padded to {})",
            x.cols(),
            x.padded_cols()
        )));
    }
    Ok(())
}

/// A Q6_K matrix read weight by weight, in either layout: what the portable head loop reads.
pub(crate) trait Q6kWeights {
    fn blocks_per_row(&self) -> usize;
    fn code(&self, r: usize, c: usize) -> u8;
    fn sub_scale(&self, r: usize, c: usize) -> i8;
    fn block_scale(&self, r: usize, blk: usize) -> half::f16;
}

macro_rules! q6k_weights {
    ($t:ty) => {
        impl Q6kWeights for $t {
            fn blocks_per_row(&self) -> usize {
                <$t>::blocks_per_row(self)
            }
            fn code(&self, r: usize, c: usize) -> u8 {
                <$t>::code(self, r, c)
            }
            fn sub_scale(&self, r: usize, c: usize) -> i8 {
                <$t>::sub_scale(self, r, c)
            }
            fn block_scale(&self, r: usize, blk: usize) -> half::f16 {
                <$t>::block_scale(self, r, blk)
            }
        }
    };
}
q6k_weights!(crate::formats::Q6kRows);
q6k_weights!(crate::formats::Q6kRowGroups);

/// Whether [`q6k_rows_matmul`] at `isa` on `batch` tokens runs the AVX-512 kernel, which reads
/// the matrix's 16-row groups ([`crate::formats::Q6kRows::prepare_groups`]) and the tokens'
/// offsets ([`ActivationBatch::build_q6k_offsets`]): callers make them when this says so.
pub fn q6k_groups_used(isa: IsaLevel, batch: usize) -> bool {
    batch >= 2 && isa >= IsaLevel::Avx512 && IsaLevel::Avx512.is_supported()
}

/// The plain Q6_K × int8 loop that defines [`q6k_rows_matmul`]'s results.
pub(crate) fn q6k_rows_portable(m: &impl Q6kWeights, x: &ActivationBatch, rows: Range<usize>, out: &mut [f32]) {
    use crate::formats::QK_K;
    let batch = x.batch();
    for (i, r) in rows.enumerate() {
        for b in 0..batch {
            let xb = x.token(b);
            let mut acc = 0f64;
            for blk in 0..m.blocks_per_row() {
                let mut isum = 0i32;
                for j in 0..QK_K / 16 {
                    let c0 = blk * QK_K + 16 * j;
                    let sub: i32 = (c0..c0 + 16).map(|c| (m.code(r, c) as i32 - 32) * xb[c] as i32).sum();
                    isum += m.sub_scale(r, c0) as i32 * sub;
                }
                acc += m.block_scale(r, blk).to_f64() * isum as f64;
            }
            out[i * batch + b] = finish_blocks(acc, x.scale(b));
        }
    }
}

/// One ISA's register tile of the int8-row matmul: rows `r..r+R` × tokens `b0..b0+G`, writing
/// `out[i × batch + b]`. `STREAM`: the R rows (stored back to back) are asked for in L2 as one
/// ascending stream (`x86_avx2::prefetch_rows_l2`); otherwise each row's lines in L2 and L1.
#[cfg(target_arch = "x86_64")]
pub(crate) trait Int8Tile {
    unsafe fn tile<const R: usize, const G: usize, const STREAM: bool>(
        m: &crate::formats::Int8Rows,
        r: usize,
        x: &ActivationBatch,
        b0: usize,
        out: &mut [f32],
    );
}

/// The int8-row matmul over `rows` with an ISA's tiles, inlined into that ISA's
/// target-feature function.
///
/// One token: one row at a time, the rows (stored back to back) asked for in L2 as one ascending
/// stream 16 KiB ahead. Memory is the limit there, not compute. In the model on Zen 5 (one
/// thread, decode, three variants alternating), the LM head read: large (32002×1536) 28.7–32.2
/// GB/s with no software prefetch (the hardware prefetcher alone), 34.9–35.3 like this, 35.8–35.9
/// with two rows per pass in one stream; 2B4T (128256×2560) 33.2–33.3, 33.9–34.0 and 31.9–32.0.
/// (On Zen 4 no software prefetch had measured best: 22.4 → 25.6 GB/s against two rows with
/// per-row prefetches.)
/// More tokens: two rows per pass share every activation load, up to four tokens per tile.
#[cfg(target_arch = "x86_64")]
#[inline(always)]
pub(crate) unsafe fn int8_rows_tiled<T: Int8Tile>(
    m: &crate::formats::Int8Rows,
    x: &ActivationBatch,
    rows: Range<usize>,
    out: &mut [f32],
) {
    let batch = x.batch();
    debug_assert_eq!(m.stride(), x.padded_cols());
    if batch == 1 {
        for (i, r) in rows.enumerate() {
            T::tile::<1, 1, true>(m, r, x, 0, &mut out[i..]);
        }
        return;
    }
    let mut r = rows.start;
    while r < rows.end {
        let two = r + 2 <= rows.end;
        let o = &mut out[(r - rows.start) * batch..];
        let mut b0 = 0;
        while b0 < batch {
            let g = 4.min(batch - b0);
            match (two, g) {
                (true, 1) => T::tile::<2, 1, false>(m, r, x, b0, o),
                (true, 2) => T::tile::<2, 2, false>(m, r, x, b0, o),
                (true, 3) => T::tile::<2, 3, false>(m, r, x, b0, o),
                (true, _) => T::tile::<2, 4, false>(m, r, x, b0, o),
                (false, 1) => T::tile::<1, 1, false>(m, r, x, b0, o),
                (false, 2) => T::tile::<1, 2, false>(m, r, x, b0, o),
                (false, 3) => T::tile::<1, 3, false>(m, r, x, b0, o),
                (false, _) => T::tile::<1, 4, false>(m, r, x, b0, o),
            }
            b0 += g;
        }
        r += if two { 2 } else { 1 };
    }
}

/// Attention scores `out[p] = attention_dot(q, k_p) × scale` for `out.len()` keys stored as
/// rows of `q.len()` (f32 or f16). `attention_dot` is the fixed-order dot product of the
/// forward pass (16 lanes, a correctly rounded fused multiply-add per product, a fixed reduction
/// tree), so every ISA gives identical results.
/// `ahead` (the rows the next step reads; may be empty) is asked for in L2 a share at a time
/// while the keys are read, so that the memory keeps streaming under the arithmetic.
pub(crate) fn attention_scores<K: KeyElem>(q: &[f32], keys: &[K], scale: f32, out: &mut [f32], ahead: &[K]) {
    #[cfg(target_arch = "x86_64")]
    if let Some(t) = x86_avx512::Avx512::new() {
        return K::scores_avx512(t, q, keys, scale, out, ahead);
    }
    #[cfg(target_arch = "x86_64")]
    if let Some(t) = x86_avx2::Avx2::new() {
        return K::scores_avx2(t, q, keys, scale, out, ahead);
    }
    let _ = ahead;
    attention_scores_portable(q, keys, scale, out)
}

/// The portable scores: each key row converted to f32 as a whole (f16 with the slice
/// conversion, vectorized where the CPU has F16C; one value at a time, this loop had run 30×
/// slower than the AVX-512 kernel), then `attention_dot`.
fn attention_scores_portable<K: KeyElem>(q: &[f32], keys: &[K], scale: f32, out: &mut [f32]) {
    let hd = q.len();
    let mut row = [0f32; MAX_HEAD_DIM];
    for (p, o) in out.iter_mut().enumerate() {
        let kf = &mut row[..hd];
        K::row_to_f32(&keys[p * hd..(p + 1) * hd], kf);
        *o = crate::model::ops::attention_dot(q, kf) * scale;
    }
}

/// Scores of the `heads` query heads of one grouped-query group (`qs`: `heads` rows of hd) over
/// their shared keys: `out[g·n + p]` = [`attention_scores`] of head g (n = `out.len() / heads`),
/// bit for bit. With AVX-512 or AVX2 one pass over the keys serves up to four heads of the
/// group, so a KV head is read (and converted from f16) once per step instead of once per query
/// head.
pub(crate) fn attention_scores_group<K: KeyElem>(
    qs: &[f32],
    heads: usize,
    keys: &[K],
    scale: f32,
    out: &mut [f32],
    ahead: &[K],
) {
    let (hd, n) = (qs.len() / heads, out.len() / heads);
    #[cfg(target_arch = "x86_64")]
    if let Some(t) = x86_avx512::Avx512::new() {
        return K::scores_group_avx512(t, qs, heads, keys, scale, out, ahead);
    } else if let Some(t) = x86_avx2::Avx2::new() {
        return K::scores_group_avx2(t, qs, keys, scale, out, n, ahead);
    }
    // n.max(1): no positions is no scores to write (chunks of 0 would panic).
    for (g, (q, o)) in qs.chunks_exact(hd).zip(out.chunks_exact_mut(n.max(1))).enumerate() {
        attention_scores(q, keys, scale, o, if g == 0 { ahead } else { &[] });
    }
}

/// The definition of [`attention_scores_group`]: each head on its own.
pub(crate) fn attention_scores_group_portable<K: KeyElem>(
    qs: &[f32],
    keys: &[K],
    scale: f32,
    out: &mut [f32],
    n: usize,
) {
    if n == 0 {
        return;
    }
    let hd = qs.len() / (out.len() / n);
    for (q, o) in qs.chunks_exact(hd).zip(out.chunks_exact_mut(n)) {
        attention_scores_portable(q, keys, scale, o);
    }
}

/// The weighted sums of the `heads` heads of one group over their shared values (`ws`: `heads`
/// rows of n weights; `os`: `heads` rows of hd): each head's `os` row as
/// [`attention_weighted_sum`] leaves it, bit for bit, in one pass over the values (AVX-512 and
/// AVX2; see [`attention_scores_group`]).
pub(crate) fn attention_weighted_sum_group<K: KeyElem>(
    ws: &[f32],
    heads: usize,
    values: &[K],
    os: &mut [f32],
    ahead: &[K],
) {
    let (n, hd) = (ws.len() / heads, os.len() / heads);
    #[cfg(target_arch = "x86_64")]
    if let Some(t) = x86_avx512::Avx512::new() {
        return K::axpy_group_avx512(t, ws, heads, values, os, ahead);
    } else if let Some(t) = x86_avx2::Avx2::new() {
        return K::axpy_group_avx2(t, ws, n, values, os, hd, ahead);
    }
    for (g, (w, o)) in ws.chunks_exact(n.max(1)).zip(os.chunks_exact_mut(hd)).enumerate() {
        attention_weighted_sum(&w[..n], values, o, if g == 0 { ahead } else { &[] });
    }
}

/// The definition of [`attention_weighted_sum_group`]: each head on its own.
pub(crate) fn attention_weighted_sum_group_portable<K: KeyElem>(
    ws: &[f32],
    n: usize,
    values: &[K],
    os: &mut [f32],
    hd: usize,
) {
    if hd == 0 {
        return;
    }
    for (g, o) in os.chunks_exact_mut(hd).enumerate() {
        attention_weighted_sum_portable(&ws[g * n..(g + 1) * n], values, o);
    }
}

/// The largest head size the portable attention's stack row holds (a model config above it is
/// rejected when loaded).
pub(crate) const MAX_HEAD_DIM: usize = 512;

/// `o[d] = fma(w[p], v_p[d], o[d])` for every position p in order: the attention
/// output, identical at every ISA level. `ahead` as in [`attention_scores`].
pub(crate) fn attention_weighted_sum<K: KeyElem>(w: &[f32], values: &[K], o: &mut [f32], ahead: &[K]) {
    #[cfg(target_arch = "x86_64")]
    if let Some(t) = x86_avx512::Avx512::new() {
        return K::axpy_avx512(t, w, values, o, ahead);
    }
    #[cfg(target_arch = "x86_64")]
    if let Some(t) = x86_avx2::Avx2::new() {
        return K::axpy_avx2(t, w, values, o, ahead);
    }
    let _ = ahead;
    attention_weighted_sum_portable(w, values, o)
}

/// The portable weighted sum, each value row converted as a whole first (see
/// [`attention_scores_portable`]); one fused multiply-add per element, as the SIMD kernels.
fn attention_weighted_sum_portable<K: KeyElem>(w: &[f32], values: &[K], o: &mut [f32]) {
    let hd = o.len();
    let mut row = [0f32; MAX_HEAD_DIM];
    for (p, wp) in w.iter().enumerate() {
        let vf = &mut row[..hd];
        K::row_to_f32(&values[p * hd..(p + 1) * hd], vf);
        for (a, v) in o.iter_mut().zip(vf.iter()) {
            *a = wp.mul_add(*v, *a);
        }
    }
}

/// Calls `x86_avx512::$fast` where the CPU has AVX-512, else `x86_avx2::$fast` where it has
/// AVX2, else `$portable`, with the same arguments (the functions `compiled_for!` recompiles).
macro_rules! widest_compiled {
    ($fast:ident, $portable:path, $($arg:expr),*) => {{
        #[cfg(target_arch = "x86_64")]
        if let Some(t) = x86_avx512::Avx512::new() {
            return x86_avx512::$fast(t, $($arg),*);
        }
        #[cfg(target_arch = "x86_64")]
        if let Some(t) = x86_avx2::Avx2::new() {
            return x86_avx2::$fast(t, $($arg),*);
        }
        $portable($($arg),*)
    }};
}

/// Attention scores over keys stored encoded (`KvRows::Encoded`: `precision.bytes_per_vector(
/// q.len())` bytes each): `out[p] = attention_dot(q, decode(k_p)) × scale`, the decode of
/// [`KvPrecision::decode`] and the `attention_dot` of the forward pass, so the same floats as decoding
/// position by position; one call per head, compiled for the widest ISA the CPU has: rows are
/// decoded a chunk at a time into `buf` ([`ENCODED_CHUNK_VALUES`] long), then go through the f32
/// kernel. Decoded one vector per call through the dispatching `decode` at baseline x86-64, with
/// nothing prefetched, quantized caches had decoded 2–6× slower than f16 (large preset, 1 thread,
/// context 1024, int4 against f16: Zen 5 14 vs 80 tok/s, now 55; Zen 3 with AVX2 8.3 vs 38, now
/// 24.6). `ahead` (encoded rows read next; may be empty) is asked for in L2 a vector's share per
/// position.
pub(crate) fn attention_scores_encoded(
    precision: KvPrecision,
    q: &[f32],
    keys: &[u8],
    scale: f32,
    out: &mut [f32],
    ahead: &[u8],
    buf: &mut [f32],
) {
    widest_compiled!(
        attention_scores_encoded,
        attention_scores_encoded_portable,
        precision,
        q,
        keys,
        scale,
        out,
        ahead,
        buf
    )
}

/// `o[d] += w[p] × decode(v_p)[d]` for every position p in order over values stored encoded
/// (see [`attention_scores_encoded`]): the multiply-then-add of [`attention_weighted_sum`].
pub(crate) fn attention_weighted_sum_encoded(
    precision: KvPrecision,
    w: &[f32],
    values: &[u8],
    o: &mut [f32],
    ahead: &[u8],
    buf: &mut [f32],
) {
    widest_compiled!(
        attention_weighted_sum_encoded,
        attention_weighted_sum_encoded_portable,
        precision,
        w,
        values,
        o,
        ahead,
        buf
    )
}

/// Whether [`attention_scores_group_encoded`] and [`attention_weighted_sum_group_encoded`] read
/// each row once for the whole group on this CPU (AVX-512's row readers), rather than head by
/// head: where they do not, grouping the heads saves nothing.
pub(crate) fn encoded_groups_read_once() -> bool {
    #[cfg(target_arch = "x86_64")]
    if x86_avx512::Avx512::new().is_some() {
        return true;
    }
    false
}

/// The scores of the `heads` query heads of one grouped-query group (`qs`: `heads` rows of hd)
/// over their shared encoded keys (`n` rows of `precision.bytes_per_vector(hd)` bytes) into
/// `out` (`heads` rows of n): each head's row as [`attention_scores_encoded`] makes it, bit for
/// bit. On AVX-512 the rows are read and decoded once for the group (2B4T: four heads a KV
/// head); elsewhere head by head.
#[allow(clippy::too_many_arguments)]
pub(crate) fn attention_scores_group_encoded(
    precision: KvPrecision,
    qs: &[f32],
    heads: usize,
    keys: &[u8],
    scale: f32,
    out: &mut [f32],
    ahead: &[u8],
    buf: &mut [f32],
) {
    #[cfg(target_arch = "x86_64")]
    if let Some(t) = x86_avx512::Avx512::new() {
        if x86_avx512::attention_scores_group_encoded(t, precision, qs, heads, keys, scale, out, ahead).is_some() {
            return;
        }
    }
    let (hd, n) = (qs.len() / heads, out.len() / heads);
    // n.max(1): no positions is no scores to write (chunks of 0 would panic).
    for (g, (q, o)) in qs.chunks_exact(hd.max(1)).zip(out.chunks_exact_mut(n.max(1))).enumerate() {
        attention_scores_encoded(precision, q, keys, scale, o, if g == 0 { ahead } else { &[] }, buf);
    }
}

/// The weighted sums of the `heads` heads of one group over their shared encoded values (`ws`:
/// `heads` rows of n; `os`: `heads` rows of hd), each as [`attention_weighted_sum_encoded`]
/// leaves it, bit for bit (see [`attention_scores_group_encoded`]).
pub(crate) fn attention_weighted_sum_group_encoded(
    precision: KvPrecision,
    ws: &[f32],
    heads: usize,
    values: &[u8],
    os: &mut [f32],
    ahead: &[u8],
    buf: &mut [f32],
) {
    #[cfg(target_arch = "x86_64")]
    if let Some(t) = x86_avx512::Avx512::new() {
        if x86_avx512::attention_weighted_sum_group_encoded(t, precision, ws, heads, values, os, ahead).is_some() {
            return;
        }
    }
    let (n, hd) = (ws.len() / heads, os.len() / heads);
    for (g, (w, o)) in ws.chunks_exact(n.max(1)).zip(os.chunks_exact_mut(hd.max(1))).enumerate() {
        attention_weighted_sum_encoded(precision, w, values, o, if g == 0 { ahead } else { &[] }, buf);
    }
}

/// Calls `$f` with the precision as a constant, so that the inlined `decode` keeps one arm.
macro_rules! with_const_precision {
    ($p:expr, $f:ident($($arg:expr),*)) => {
        match $p {
            KvPrecision::F32 => $f(KvPrecision::F32, $($arg),*),
            KvPrecision::F16 => $f(KvPrecision::F16, $($arg),*),
            KvPrecision::Bf16 => $f(KvPrecision::Bf16, $($arg),*),
            KvPrecision::Fp8 => $f(KvPrecision::Fp8, $($arg),*),
            KvPrecision::Int8 => $f(KvPrecision::Int8, $($arg),*),
            KvPrecision::Int4 => $f(KvPrecision::Int4, $($arg),*),
            KvPrecision::Int2 => $f(KvPrecision::Int2, $($arg),*),
        }
    };
}

/// f32 values the encoded attention decodes before it runs the f32 kernel over them: the length
/// of the `buf` it is given (16 KiB: in L1 beside the keys' lines; the caller's, so that no call
/// zeroes a stack array of that size).
pub(crate) const ENCODED_CHUNK_VALUES: usize = 4096;
const _: () = assert!(ENCODED_CHUNK_VALUES >= MAX_HEAD_DIM);

/// Decodes the vectors of `rows` (`vb` bytes each) into `buf` (one `hd` row each), asking for
/// `ahead`'s share of each vector in L2 as it goes.
#[inline(always)]
fn decode_rows(p: KvPrecision, rows: &[u8], vb: usize, hd: usize, buf: &mut [f32], ahead: &[u8], first: usize) {
    for (i, (r, f)) in rows.chunks_exact(vb).zip(buf.chunks_exact_mut(hd)).enumerate() {
        if let Some(a) = ahead.get((first + i) * vb..(first + i + 1) * vb) {
            prefetch_l2(a);
        }
        p.decode(r, f);
    }
}

/// Decodes encoded KV vectors (`precision.bytes_per_vector(hd)` bytes each) into `dst` (one `hd`
/// row each), as [`KvPrecision::decode`] would one at a time, compiled for the widest ISA the
/// CPU has: for a prompt's attention, which decodes each head's rows once for all its query rows.
pub(crate) fn decode_kv_rows(precision: KvPrecision, bytes: &[u8], hd: usize, dst: &mut [f32]) {
    widest_compiled!(decode_kv_rows, decode_kv_rows_portable, precision, bytes, hd, dst)
}

#[inline(always)]
pub(crate) fn decode_kv_rows_portable(precision: KvPrecision, bytes: &[u8], hd: usize, dst: &mut [f32]) {
    #[inline(always)]
    fn each(p: KvPrecision, bytes: &[u8], hd: usize, dst: &mut [f32]) {
        decode_rows(p, bytes, p.bytes_per_vector(hd), hd, dst, &[], 0);
    }
    with_const_precision!(precision, each(bytes, hd, dst))
}

#[inline(always)]
pub(crate) fn attention_scores_encoded_portable(
    precision: KvPrecision,
    q: &[f32],
    keys: &[u8],
    scale: f32,
    out: &mut [f32],
    ahead: &[u8],
    buf: &mut [f32],
) {
    // Decoded in chunks of rows (the decode vectorizes for a constant precision), then the f32
    // scores kernel over each chunk: the same floats as one key at a time.
    #[inline(always)]
    fn each(p: KvPrecision, q: &[f32], keys: &[u8], scale: f32, out: &mut [f32], ahead: &[u8], buf: &mut [f32]) {
        let hd = q.len();
        let (vb, per) = (p.bytes_per_vector(hd), buf.len() / hd);
        for (c, o) in out.chunks_mut(per).enumerate() {
            let rows = &keys[c * per * vb..(c * per + o.len()) * vb];
            let kf = &mut buf[..o.len() * hd];
            decode_rows(p, rows, vb, hd, kf, ahead, c * per);
            attention_scores::<f32>(q, kf, scale, o, &[]);
        }
    }
    with_const_precision!(precision, each(q, keys, scale, out, ahead, buf))
}

#[inline(always)]
pub(crate) fn attention_weighted_sum_encoded_portable(
    precision: KvPrecision,
    w: &[f32],
    values: &[u8],
    o: &mut [f32],
    ahead: &[u8],
    buf: &mut [f32],
) {
    // As the scores: chunks of decoded rows through the f32 weighted sum, in position order.
    #[inline(always)]
    fn each(p: KvPrecision, w: &[f32], values: &[u8], o: &mut [f32], ahead: &[u8], buf: &mut [f32]) {
        let hd = o.len();
        let (vb, per) = (p.bytes_per_vector(hd), buf.len() / hd);
        for (c, wc) in w.chunks(per).enumerate() {
            let rows = &values[c * per * vb..(c * per + wc.len()) * vb];
            let vf = &mut buf[..wc.len() * hd];
            decode_rows(p, rows, vb, hd, vf, ahead, c * per);
            attention_weighted_sum::<f32>(wc, vf, o, &[]);
        }
    }
    with_const_precision!(precision, each(w, values, o, ahead, buf))
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
/// memory once. Standalone copies of the tiles, 256 MiB of I2 rows per pass from DRAM, one Zen 5
/// core, 8 tokens (vpdpbusd peak 505 GMAC/s): 6912×2560 292 -> 431 GMAC/s, 2560×6912 227 ->
/// 436, 4096×1536 333 -> 392, 1536×4096 220 -> 443.
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

/// The gated FFN activation (`ops::gated_activation_portable`) compiled for the widest ISA the
/// CPU has (AVX-512, else AVX2): the same Rust code, so the same IEEE operations in the same
/// order, 16 or 8 lanes wide instead of the baseline's 4. SiLU took 2.3 ns per element at
/// baseline x86-64.
pub(crate) fn gated_activation(act: crate::model::config::FfnActivation, gate: &mut [f32], up: &[f32]) {
    widest_compiled!(gated_activation, crate::model::ops::gated_activation_portable, act, gate, up)
}

/// Softmax of attention scores in place (`ops::softmax_in_place_portable`) compiled for the
/// widest ISA the CPU has, as [`gated_activation`]: the same floats. At baseline x86-64 it took
/// about 1.9 ns per score (2B4T, 1024-token context: 3% of a one-thread decode step).
pub(crate) fn softmax_in_place(scores: &mut [f32]) {
    widest_compiled!(softmax_in_place, crate::model::ops::softmax_in_place_portable, scores)
}

/// The greedy token (`ops::argmax_portable`) compiled for the widest ISA the CPU has, as
/// [`softmax_in_place`]: the same index. The plain loop it replaces, which compares with the
/// running best by index, took about 0.57 ns per logit (2B4T's 128256: 73 µs a token, 1% of a
/// two-thread batch-8 step).
pub(crate) fn argmax(logits: &[f32]) -> u32 {
    widest_compiled!(argmax, crate::model::ops::argmax_portable, logits)
}

/// Per-token int8 quantization (`activations::quantize_token_portable`, the definition): with
/// AVX-512 that code compiled for it (which has byte-narrowing instructions), with AVX2 intrinsics
/// (`x86_avx2::quantize_token`), each bit-identical to it. At baseline x86-64 the float → byte
/// narrowing has no single instruction: about 0.7 ns per element.
pub(crate) fn quantize_token(src: &[f32], dst: &mut [i8]) -> f32 {
    widest_compiled!(quantize_token, crate::activations::quantize_token_portable, src, dst)
}

/// Σ of each 16 values of a token's int8 activations (`activations::sub_sums_portable`, the
/// definition), for the Q6_K head's offset: `vpsadbw` where the CPU has AVX2 (also under
/// AVX-512). Integer sums, so every path gives the same values.
pub(crate) fn sub_sums(q: &[i8], subs: &mut [i16]) {
    #[cfg(target_arch = "x86_64")]
    if let Some(t) = x86_avx2::Avx2::new() {
        return x86_avx2::sub_sums(t, q, subs);
    }
    crate::activations::sub_sums_portable(q, subs)
}

/// One token's lookup tables for the table-lookup TQ1 kernels
/// (`tq1_lut::build_token_tables_portable`, the definition): with AVX2 (also under AVX-512)
/// a group pair per step in registers. Integer arithmetic only, so every path writes the same
/// bytes.
pub(crate) fn build_lut_tables(x: &[i8], dst: &mut [u8]) {
    #[cfg(target_arch = "x86_64")]
    if let Some(t) = x86_avx2::Avx2::new() {
        return x86_avx2::build_lut_tables(t, x, dst);
    }
    crate::formats::tq1_lut::build_token_tables_portable(x, dst)
}

/// One token's `perm` tables (`tq1_perm::build_perm_tables_portable`, the definition): with
/// AVX-512 a group per step in registers (the `lut` builder's sums, each beside its
/// complement). Integer arithmetic only, so every path writes the same bytes.
pub(crate) fn build_perm_tables(x: &[i8], dst: &mut [u8]) {
    #[cfg(target_arch = "x86_64")]
    if let Some(t) = x86_avx512::Avx512::new() {
        return x86_avx512::build_perm_tables(t, x, dst);
    }
    crate::formats::tq1_perm::build_perm_tables_portable(x, dst)
}

/// Columns `cols` of a `[r_n, c_n]` f32 matrix, transposed into `dst` (`dst[c − cols.start][r] =
/// src[r][c]`; `ops::transpose_cols_into_portable` is the definition): 8 × 8 tiles transposed in
/// registers where the CPU has AVX2. Data movement only, so every path gives the same bytes.
pub(crate) fn transpose_cols_into(src: &[f32], r_n: usize, c_n: usize, cols: Range<usize>, dst: &mut [f32]) {
    #[cfg(target_arch = "x86_64")]
    if let Some(t) = x86_avx2::Avx2::new() {
        return x86_avx2::transpose_cols_into(t, src, r_n, c_n, cols, dst);
    }
    crate::model::ops::transpose_cols_into_portable(src, r_n, c_n, cols, dst)
}

/// Columns `c0..c0 + 8` of a `[r_n, c_n]` f32 matrix into eight rows (`dsts[k][r] =
/// src[r][c0 + k]`, r_n = each row's length; `ops::transpose_8_cols_to_rows_portable` is the
/// definition): a decode batch's `[rows, tokens]` matmul block written into eight tokens' rows
/// of a `[tokens, n]` output, 8 × 8 tiles in registers where the CPU has AVX2.
pub(crate) fn transpose_8_cols_to_rows(src: &[f32], c_n: usize, c0: usize, dsts: [&mut [f32]; 8]) {
    #[cfg(target_arch = "x86_64")]
    if let Some(t) = x86_avx2::Avx2::new() {
        return x86_avx2::transpose_8_cols_to_rows(t, src, c_n, c0, dsts);
    }
    crate::model::ops::transpose_8_cols_to_rows_portable(src, c_n, c0, dsts)
}

/// RMSNorm of each row (`ops::rms_norm_rows_portable`) compiled for the widest ISA the CPU
/// has, bit-identical for the same reason as [`gated_activation`]. At baseline x86-64 a norm
/// took about 1 ns per element, on the caller thread while the others wait.
pub(crate) fn rms_norm_rows(x: &[f32], weight: &[f32], eps: f32, out: &mut [f32]) {
    widest_compiled!(rms_norm_rows, crate::model::ops::rms_norm_rows_portable, x, weight, eps, out)
}

/// In-place twin of [`rms_norm_rows`].
pub(crate) fn rms_norm_in_place(x: &mut [f32], weight: &[f32], eps: f32) {
    widest_compiled!(rms_norm_in_place, crate::model::ops::rms_norm_in_place_portable, x, weight, eps)
}

/// Bytes at an address, kept only to ask for them in L2 ahead of their use: a prefetch never
/// faults, so a range may outlive what it names (a worker may still be asking for the first
/// rows of a step's next matmul when the step, or the model, is gone), and it is plain data
/// that any thread may hold.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct PrefetchRange {
    start: usize,
    len: usize,
}

impl PrefetchRange {
    pub const EMPTY: Self = Self { start: 0, len: 0 };

    pub fn of<T>(data: &[T]) -> Self {
        Self { start: data.as_ptr() as usize, len: std::mem::size_of_val(data) }
    }

    pub fn len(&self) -> usize {
        self.len
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// The part from byte `from` on, at most `max` bytes of it (empty past the end).
    pub fn window(self, from: usize, max: usize) -> Self {
        let from = from.min(self.len);
        Self { start: self.start + from, len: (self.len - from).min(max) }
    }

    /// Asks for the cache lines of bytes `bytes` of the range in L2 (nothing where there is
    /// no prefetch instruction).
    pub fn prefetch_l2(self, bytes: Range<usize>) {
        let (lo, hi) = (bytes.start.min(self.len), bytes.end.min(self.len));
        #[cfg(target_arch = "x86_64")]
        if lo < hi {
            // The address is only handed to a prefetch instruction, never dereferenced.
            x86_avx2::prefetch_l2((self.start + lo) as *const u8, hi - lo);
        }
        #[cfg(not(target_arch = "x86_64"))]
        let _ = (lo, hi);
    }
}

/// Asks for `data`'s cache lines in L2 ahead of its use (nothing where there is no prefetch
/// instruction).
pub(crate) fn prefetch_l2<T>(data: &[T]) {
    #[cfg(target_arch = "x86_64")]
    x86_avx2::prefetch_l2(data.as_ptr() as *const u8, std::mem::size_of_val(data));
    #[cfg(not(target_arch = "x86_64"))]
    let _ = data;
}

/// Element types of cached keys and values that attention reads in place.
pub(crate) trait KeyElem: Copy {
    /// `dst[i] = src[i]` as f32, exactly (`dst.len() == src.len()`).
    fn row_to_f32(src: &[Self], dst: &mut [f32]);
    #[cfg(target_arch = "x86_64")]
    fn scores_avx512(t: x86_avx512::Avx512, q: &[f32], keys: &[Self], scale: f32, out: &mut [f32], ahead: &[Self]);
    #[cfg(target_arch = "x86_64")]
    fn axpy_avx512(t: x86_avx512::Avx512, w: &[f32], values: &[Self], o: &mut [f32], ahead: &[Self]);
    #[cfg(target_arch = "x86_64")]
    #[allow(clippy::too_many_arguments)]
    fn scores_group_avx512(
        t: x86_avx512::Avx512,
        qs: &[f32],
        heads: usize,
        keys: &[Self],
        scale: f32,
        out: &mut [f32],
        ahead: &[Self],
    );
    #[cfg(target_arch = "x86_64")]
    fn axpy_group_avx512(
        t: x86_avx512::Avx512,
        ws: &[f32],
        heads: usize,
        values: &[Self],
        os: &mut [f32],
        ahead: &[Self],
    );
    #[cfg(target_arch = "x86_64")]
    fn scores_avx2(t: x86_avx2::Avx2, q: &[f32], keys: &[Self], scale: f32, out: &mut [f32], ahead: &[Self]);
    #[cfg(target_arch = "x86_64")]
    fn axpy_avx2(t: x86_avx2::Avx2, w: &[f32], values: &[Self], o: &mut [f32], ahead: &[Self]);
    #[cfg(target_arch = "x86_64")]
    #[allow(clippy::too_many_arguments)]
    fn scores_group_avx2(
        t: x86_avx2::Avx2,
        qs: &[f32],
        keys: &[Self],
        scale: f32,
        out: &mut [f32],
        n: usize,
        ahead: &[Self],
    );
    #[cfg(target_arch = "x86_64")]
    #[allow(clippy::too_many_arguments)]
    fn axpy_group_avx2(
        t: x86_avx2::Avx2,
        ws: &[f32],
        n: usize,
        values: &[Self],
        os: &mut [f32],
        hd: usize,
        ahead: &[Self],
    );
}

impl KeyElem for f32 {
    #[inline(always)]
    fn row_to_f32(src: &[f32], dst: &mut [f32]) {
        dst.copy_from_slice(src);
    }
    #[cfg(target_arch = "x86_64")]
    fn scores_avx512(t: x86_avx512::Avx512, q: &[f32], keys: &[f32], scale: f32, out: &mut [f32], ahead: &[f32]) {
        x86_avx512::attention_scores_f32(t, q, keys, scale, out, ahead)
    }
    #[cfg(target_arch = "x86_64")]
    fn axpy_avx512(t: x86_avx512::Avx512, w: &[f32], values: &[f32], o: &mut [f32], ahead: &[f32]) {
        x86_avx512::attention_axpy_f32(t, w, values, o, ahead)
    }
    #[cfg(target_arch = "x86_64")]
    fn scores_group_avx512(
        t: x86_avx512::Avx512,
        qs: &[f32],
        heads: usize,
        keys: &[f32],
        scale: f32,
        out: &mut [f32],
        ahead: &[f32],
    ) {
        x86_avx512::attention_scores_group_f32(t, qs, heads, keys, scale, out, ahead)
    }
    #[cfg(target_arch = "x86_64")]
    fn axpy_group_avx512(
        t: x86_avx512::Avx512,
        ws: &[f32],
        heads: usize,
        values: &[f32],
        os: &mut [f32],
        ahead: &[f32],
    ) {
        x86_avx512::attention_axpy_group_f32(t, ws, heads, values, os, ahead)
    }
    #[cfg(target_arch = "x86_64")]
    fn scores_avx2(t: x86_avx2::Avx2, q: &[f32], keys: &[f32], scale: f32, out: &mut [f32], ahead: &[f32]) {
        x86_avx2::attention_scores_f32(t, q, keys, scale, out, ahead)
    }
    #[cfg(target_arch = "x86_64")]
    fn axpy_avx2(t: x86_avx2::Avx2, w: &[f32], values: &[f32], o: &mut [f32], ahead: &[f32]) {
        x86_avx2::attention_axpy_f32(t, w, values, o, ahead)
    }
    #[cfg(target_arch = "x86_64")]
    fn scores_group_avx2(
        t: x86_avx2::Avx2,
        qs: &[f32],
        keys: &[f32],
        scale: f32,
        out: &mut [f32],
        n: usize,
        ahead: &[f32],
    ) {
        x86_avx2::attention_scores_group_f32(t, qs, keys, scale, out, n, ahead)
    }
    #[cfg(target_arch = "x86_64")]
    fn axpy_group_avx2(
        t: x86_avx2::Avx2,
        ws: &[f32],
        n: usize,
        values: &[f32],
        os: &mut [f32],
        hd: usize,
        ahead: &[f32],
    ) {
        x86_avx2::attention_axpy_group_f32(t, ws, n, values, os, hd, ahead)
    }
}

impl KeyElem for half::f16 {
    #[inline(always)]
    fn row_to_f32(src: &[half::f16], dst: &mut [f32]) {
        half::slice::HalfFloatSliceExt::convert_to_f32_slice(src, dst);
    }
    #[cfg(target_arch = "x86_64")]
    fn scores_avx512(
        t: x86_avx512::Avx512,
        q: &[f32],
        keys: &[half::f16],
        scale: f32,
        out: &mut [f32],
        ahead: &[half::f16],
    ) {
        x86_avx512::attention_scores_f16(t, q, keys, scale, out, ahead)
    }
    #[cfg(target_arch = "x86_64")]
    fn axpy_avx512(t: x86_avx512::Avx512, w: &[f32], values: &[half::f16], o: &mut [f32], ahead: &[half::f16]) {
        x86_avx512::attention_axpy_f16(t, w, values, o, ahead)
    }
    #[cfg(target_arch = "x86_64")]
    fn scores_group_avx512(
        t: x86_avx512::Avx512,
        qs: &[f32],
        heads: usize,
        keys: &[half::f16],
        scale: f32,
        out: &mut [f32],
        ahead: &[half::f16],
    ) {
        x86_avx512::attention_scores_group_f16(t, qs, heads, keys, scale, out, ahead)
    }
    #[cfg(target_arch = "x86_64")]
    fn axpy_group_avx512(
        t: x86_avx512::Avx512,
        ws: &[f32],
        heads: usize,
        values: &[half::f16],
        os: &mut [f32],
        ahead: &[half::f16],
    ) {
        x86_avx512::attention_axpy_group_f16(t, ws, heads, values, os, ahead)
    }
    #[cfg(target_arch = "x86_64")]
    fn scores_avx2(t: x86_avx2::Avx2, q: &[f32], keys: &[half::f16], scale: f32, out: &mut [f32], ahead: &[half::f16]) {
        x86_avx2::attention_scores_f16(t, q, keys, scale, out, ahead)
    }
    #[cfg(target_arch = "x86_64")]
    fn axpy_avx2(t: x86_avx2::Avx2, w: &[f32], values: &[half::f16], o: &mut [f32], ahead: &[half::f16]) {
        x86_avx2::attention_axpy_f16(t, w, values, o, ahead)
    }
    #[cfg(target_arch = "x86_64")]
    fn scores_group_avx2(
        t: x86_avx2::Avx2,
        qs: &[f32],
        keys: &[half::f16],
        scale: f32,
        out: &mut [f32],
        n: usize,
        ahead: &[half::f16],
    ) {
        x86_avx2::attention_scores_group_f16(t, qs, keys, scale, out, n, ahead)
    }
    #[cfg(target_arch = "x86_64")]
    fn axpy_group_avx2(
        t: x86_avx2::Avx2,
        ws: &[f32],
        n: usize,
        values: &[half::f16],
        os: &mut [f32],
        hd: usize,
        ahead: &[half::f16],
    ) {
        x86_avx2::attention_axpy_group_f16(t, ws, n, values, os, hd, ahead)
    }
}

/// Wrapping sum of `words` with the widest loads this CPU has: the bandwidth probe's reader.
pub fn sum_words(words: &[u64]) -> u64 {
    #[cfg(target_arch = "x86_64")]
    {
        if let Some(t) = x86_avx512::Avx512::new() {
            return x86_avx512::sum_words(t, words);
        }
        if let Some(t) = x86_avx2::Avx2::new() {
            return x86_avx2::sum_words(t, words);
        }
    }
    crate::bandwidth::sum_words_portable(words)
}

/// `rounds` rounds of the pipe probe's loop `mix` (see [`crate::compute_peak::PipeMix`]);
/// `None` where the CPU lacks what the mix needs.
pub(crate) fn pipe_mix(
    mix: crate::compute_peak::PipeMix,
    rounds: u64,
    ops: &crate::compute_peak::MixOperands,
) -> Option<crate::compute_peak::MixLanes> {
    #[cfg(target_arch = "x86_64")]
    return x86_pipes::run_mix(mix, rounds, ops);
    #[cfg(not(target_arch = "x86_64"))]
    {
        let _ = (mix, rounds, ops);
        None
    }
}

/// The compute probe's loop at `isa` (see [`crate::compute_peak`]): `rounds` rounds of
/// independent chains of the level's int8 product on `a` (u8) × `b` (i8) — AVX-512: 12
/// `vpdpbusd` on all 64 bytes, i32 lanes; AVX2: 8 × `vpmaddubsw` + `vpaddw` on the first 32,
/// i16 lanes widened — and the lane-wise wrapping sum of the chains' accumulators. Scalar has
/// no such loop, and a level this CPU lacks cannot run it: both are errors.
pub fn int8_mac_chains(isa: IsaLevel, rounds: u64, a: &[u8; 64], b: &[i8; 64]) -> Result<Vec<i32>> {
    #[cfg(target_arch = "x86_64")]
    match isa {
        IsaLevel::Avx512 => {
            if let Some(t) = x86_avx512::Avx512::new() {
                return Ok(x86_avx512::int8_mac_chains(t, rounds, a, b).to_vec());
            }
        }
        IsaLevel::Avx2 => {
            if let Some(t) = x86_avx2::Avx2::new() {
                let a: &[u8; 32] = a[..32].try_into().expect("32 of 64 bytes");
                let b: &[i8; 32] = b[..32].try_into().expect("32 of 64 bytes");
                return Ok(x86_avx2::int8_mac_chains(t, rounds, a, b).to_vec());
            }
        }
        IsaLevel::Scalar => {}
    }
    let _ = (rounds, a, b);
    Err(Error::Unsupported(match isa {
        IsaLevel::Scalar => "the int8 compute probe: the scalar level has no SIMD int8 product to measure".into(),
        _ => format!("the int8 compute probe at {}: this CPU does not support it", isa.name()),
    }))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The split dot stage's tiles of rows × tokens give each row's one-token dot product with
    /// each token, at every ISA, for 1 to 4 rows and 1 to 8 tokens (the AVX-512 tiles and the
    /// row-at-a-time shapes), with the extreme codes and activations.
    #[test]
    fn dot_code_tiles_equal_one_row_and_token_at_a_time() {
        use portable::IsaOps;
        fn check<I: IsaOps>(isa: I, name: &str) {
            let mut g = crate::rng::SplitMix64::new(41);
            for n in [256usize, 512, 2560] {
                let mut codes: Vec<u8> = (0..4 * n).map(|_| (g.next_u64() % 3) as u8).collect();
                codes[..64].fill(2);
                codes[n..n + 64].fill(2);
                let mut tokens: Vec<i8> = (0..8 * n).map(|_| g.next_u64() as i8).collect();
                tokens[..64].fill(-128);
                tokens[n..n + 64].fill(127);
                for rows in 1..=4 {
                    for nt in 1..=8 {
                        let mut fast = vec![i32::MIN; rows * nt];
                        isa.dot_codes_tile(&codes[..rows * n], n, &tokens[..nt * n], &mut fast);
                        let plain: Vec<i32> = (0..rows * nt)
                            .map(|k| {
                                let (row, t) = (&codes[k / nt * n..][..n], &tokens[k % nt * n..][..n]);
                                row.iter().zip(t).map(|(&c, &x)| c as i32 * x as i32).sum()
                            })
                            .collect();
                        assert_eq!(fast, plain, "{name}, {n} codes, {rows} rows, {nt} tokens");
                    }
                }
            }
        }
        check(portable::Portable, "portable");
        #[cfg(target_arch = "x86_64")]
        {
            if let Some(t) = x86_avx2::Avx2::new() {
                check(t, "avx2");
            }
            if let Some(t) = x86_avx512::Avx512::new() {
                check(t, "avx512");
            }
        }
    }

    /// The attention kernels' prefetch shares partition the lines of `ahead` in order, for any
    /// alignment, length and step count (more steps than lines too), and an empty `ahead` asks
    /// for nothing.
    #[cfg(target_arch = "x86_64")]
    #[test]
    fn prefetch_shares_cover_every_line_once_in_order() {
        let buf = vec![0u16; 4096];
        for offset in [0usize, 1, 31, 32, 33] {
            for len in [0usize, 1, 32, 33, 64, 96, 1000, 3000] {
                let ahead = &buf[offset..offset + len];
                let bytes = std::mem::size_of_val(ahead);
                let at = ahead.as_ptr() as usize;
                let lines = if len == 0 { 0 } else { (at + bytes - (at & !63)).div_ceil(64) };
                for steps in [1usize, 2, 3, 7, 16, 64, 129, 5000] {
                    let plan = x86_avx2::PrefetchShares::new(ahead, steps);
                    let mut next = 0;
                    for s in 0..steps {
                        let share = plan.share(s);
                        assert_eq!(share.start, next, "offset {offset} len {len} steps {steps} share {s}");
                        next = share.end.max(share.start);
                    }
                    assert_eq!(next, lines, "offset {offset} len {len} steps {steps}");
                }
            }
        }
    }

    /// `stream_from` names where a kernel's reads of a row begin (the start of the bytes a
    /// worker asks for ahead of the next matmul): the row in the packed formats, its tile in
    /// the TQ1_0 repacks, its codes in the AVX2 tq2 copy; nothing for a repack or copy not made
    /// yet (which it does not make) and nothing past the last row.
    #[test]
    fn stream_from_starts_where_each_kernel_reads_the_row() {
        use crate::formats::tq1_lut::LUT_TILE_ROWS;
        use crate::formats::tq1_perm::PERM_TILE_ROWS;
        use crate::formats::{BitPlaneMatrix, I2Matrix, Tq1Matrix, Tq2Matrix};
        use IsaLevel::{Avx2, Avx512};
        let (rows, cols) = (70, 512);
        let k = |family, isa, form| Kernel { family, isa, form };
        let at = |k: Kernel, w: &PackedWeights, r: usize| k.stream_from(w, r);
        let end_of = |r: PrefetchRange| r.start + r.len;
        let sample = [0, 1, 17, 33, rows - 1];

        let tq2 = PackedWeights::Tq2(Tq2Matrix::random(rows, cols, 0.5, 1).unwrap());
        let PackedWeights::Tq2(m) = &tq2 else { unreachable!() };
        let (blocks, codes) =
            (k(KernelFamily::Tq2, Avx512, KernelForm::Fused), k(KernelFamily::Tq2, Avx2, KernelForm::Fused));
        for r in sample {
            assert_eq!(at(blocks, &tq2, r), PrefetchRange::of(&m.blocks()[r * m.blocks_per_row()..]), "tq2 row {r}");
        }
        assert!(at(codes, &tq2, 3).is_empty() && !m.codes_made(), "a code copy not made yet gives nothing");
        codes.prepare(&tq2);
        for r in sample {
            assert_eq!(at(codes, &tq2, r), PrefetchRange::of(&m.codes().unwrap()[r * cols / 4..]), "tq2 codes row {r}");
        }

        let tq1 = PackedWeights::Tq1(Tq1Matrix::random(rows, cols, 0.5, 2).unwrap());
        let PackedWeights::Tq1(m) = &tq1 else { unreachable!() };
        let (digits, lut, perm) = (
            k(KernelFamily::Tq1, Avx512, KernelForm::Fused),
            k(KernelFamily::Tq1, Avx512, KernelForm::Lut),
            k(KernelFamily::Tq1, Avx512, KernelForm::Perm),
        );
        assert!(at(lut, &tq1, 0).is_empty() && at(perm, &tq1, 0).is_empty() && !m.lut_made() && !m.perm_made());
        lut.prepare(&tq1);
        perm.prepare(&tq1);
        let (l, p) = (m.lut().unwrap(), m.perm().unwrap());
        for r in sample {
            assert_eq!(at(digits, &tq1, r), PrefetchRange::of(&m.blocks()[r * m.blocks_per_row()..]), "tq1 row {r}");
            assert_eq!(at(lut, &tq1, r).start, l.tile(r / LUT_TILE_ROWS).as_ptr() as usize, "lut row {r}");
            assert_eq!(at(perm, &tq1, r).start, p.tile(r / PERM_TILE_ROWS).as_ptr() as usize, "perm row {r}");
            assert_eq!(end_of(at(lut, &tq1, r)), end_of(PrefetchRange::of(l.bytes())));
            assert_eq!(end_of(at(perm, &tq1, r)), end_of(PrefetchRange::of(p.bytes())));
        }

        let i2 = PackedWeights::I2(I2Matrix::random(rows, cols, 0.5, 3).unwrap());
        let PackedWeights::I2(m) = &i2 else { unreachable!() };
        let planes = PackedWeights::BitPlanes(BitPlaneMatrix::random(rows, cols, 0.5, 4).unwrap());
        let PackedWeights::BitPlanes(b) = &planes else { unreachable!() };
        for r in sample {
            let i2s = k(KernelFamily::I2s, Avx512, KernelForm::Fused);
            assert_eq!(at(i2s, &i2, r).start, m.row(r).as_ptr() as usize, "i2 row {r}");
            let xnor = k(KernelFamily::Xnor, Avx512, KernelForm::Fused);
            assert_eq!(at(xnor, &planes, r).start, b.row_words(r).as_ptr() as usize, "bit planes row {r}");
        }
        for (kernel, w) in [(blocks, &tq2), (codes, &tq2), (digits, &tq1), (lut, &tq1), (perm, &tq1)] {
            assert!(at(kernel, w, rows).is_empty() && at(kernel, w, rows + 5).is_empty(), "past the last row");
        }
        let r = PrefetchRange::of(&[0u8; 100][..]);
        assert_eq!((r.window(30, 50).len(), r.window(80, 50).len(), r.window(150, 50).len()), (50, 20, 0));
    }

    /// The fused AVX2 tq2 kernel holds a copy of the codes (64 bytes a block) and reads them
    /// for the rows of one scale, the blocks (66 bytes) for the others; `prepare` makes the
    /// copy and the other tq2 kernels neither hold nor read it. (Built directly: no need for
    /// the machine to run the kernel to count its bytes.)
    #[test]
    fn tq2_code_copy_is_counted_where_read() {
        use crate::formats::{PackedWeights, Tq2Matrix};
        let (rows, cols) = (6, 512);
        let m = Tq2Matrix::random(rows, cols, 0.5, 3).unwrap();
        let uniform_blocks = m.blocks().to_vec();
        let mut blocks = m.blocks().to_vec();
        blocks[2 * 2 + 1].d = half::f16::from_f32(0.25); // row 2: two scales
        let mixed = PackedWeights::Tq2(Tq2Matrix::from_blocks(rows, cols, blocks).unwrap());
        let uniform = PackedWeights::Tq2(m);
        let fused = Kernel { family: KernelFamily::Tq2, isa: IsaLevel::Avx2, form: KernelForm::Fused };
        let code_row = cols / 4;
        let block_row = cols / 256 * 66;
        assert_eq!(fused.bytes_read(&uniform), rows * code_row);
        assert_eq!(fused.bytes_read(&mixed), 5 * code_row + block_row);
        assert_eq!(fused.repack_bytes(&uniform), rows * code_row);
        assert!(!fused.prepared(&uniform));
        fused.prepare(&uniform);
        assert!(fused.prepared(&uniform));
        for other in [
            Kernel { form: KernelForm::Split, ..fused },
            Kernel { isa: IsaLevel::Avx512, ..fused },
            Kernel { isa: IsaLevel::Scalar, ..fused },
        ] {
            other.prepare(&mixed);
            let PackedWeights::Tq2(m) = &mixed else { unreachable!() };
            assert!(!other.uses_tq2_codes() && !m.codes_made(), "{other}");
            assert_eq!((other.bytes_read(&mixed), other.repack_bytes(&mixed)), (rows * block_row, 0), "{other}");
        }
        // No row of one scale: nothing to copy, the blocks read.
        let mut blocks = uniform_blocks;
        for b in blocks.iter_mut().step_by(2) {
            b.d = half::f16::from_f32(0.25);
        }
        let none = PackedWeights::Tq2(Tq2Matrix::from_blocks(rows, cols, blocks).unwrap());
        fused.prepare(&none);
        let PackedWeights::Tq2(m) = &none else { unreachable!() };
        assert!(fused.prepared(&none) && m.codes().is_none());
        assert_eq!((fused.bytes_read(&none), fused.repack_bytes(&none)), (rows * block_row, 0));
    }

    /// The AVX2 tile transpose equals the plain loops on every shape class: whole tiles, row
    /// and column edges, one row or column, and column ranges starting anywhere.
    #[test]
    fn transpose_tiles_equal_plain_loops() {
        for r_n in [1usize, 7, 8, 9, 16, 23, 64, 130] {
            for c_n in [1usize, 3, 8, 13, 16, 24, 33] {
                let src: Vec<f32> = (0..r_n * c_n).map(|i| i as f32 * 0.5 - 3.0).collect();
                for (a, b) in [(0, c_n), (0, c_n / 2), (c_n / 3, c_n), (1.min(c_n), c_n), (c_n / 2, c_n / 2)] {
                    let bits = |v: &[f32]| v.iter().map(|f| f.to_bits()).collect::<Vec<_>>();
                    let mut want = vec![f32::NAN; (b - a) * r_n];
                    crate::model::ops::transpose_cols_into_portable(&src, r_n, c_n, a..b, &mut want);
                    for r in 0..r_n {
                        for c in a..b {
                            assert_eq!(want[(c - a) * r_n + r], src[r * c_n + c]);
                        }
                    }
                    let mut got = vec![f32::NAN; (b - a) * r_n];
                    transpose_cols_into(&src, r_n, c_n, a..b, &mut got);
                    assert_eq!(bits(&got), bits(&want), "{r_n}×{c_n} cols {a}..{b}");
                    #[cfg(target_arch = "x86_64")]
                    if let Some(t) = x86_avx2::Avx2::new() {
                        let mut simd = vec![f32::NAN; (b - a) * r_n];
                        x86_avx2::transpose_cols_into(t, &src, r_n, c_n, a..b, &mut simd);
                        assert_eq!(bits(&simd), bits(&want), "avx2 {r_n}×{c_n} cols {a}..{b}");
                    }
                }
            }
        }
    }

    /// Eight columns into eight rows: the portable loop is the definition, checked against
    /// the source, and every path gives its bits, at tile and tail row counts.
    #[test]
    fn eight_columns_into_rows_equal_plain_loops() {
        for r_n in [0usize, 1, 7, 8, 9, 16, 23, 130] {
            for (c_n, c0) in [(8usize, 0usize), (9, 1), (16, 8), (13, 3)] {
                let src: Vec<f32> = (0..r_n * c_n).map(|i| i as f32 * 0.25 - 7.0).collect();
                let run = |f: &dyn Fn(&mut [Vec<f32>; 8])| {
                    let mut rows: [Vec<f32>; 8] = std::array::from_fn(|_| vec![f32::NAN; r_n]);
                    f(&mut rows);
                    rows.map(|r| r.iter().map(|v| v.to_bits()).collect::<Vec<_>>())
                };
                let want = run(&|rows| {
                    crate::model::ops::transpose_8_cols_to_rows_portable(
                        &src,
                        c_n,
                        c0,
                        rows.each_mut().map(|r| &mut r[..]),
                    )
                });
                for (k, row) in want.iter().enumerate() {
                    for (r, bits) in row.iter().enumerate() {
                        assert_eq!(f32::from_bits(*bits), src[r * c_n + c0 + k]);
                    }
                }
                let got = run(&|rows| transpose_8_cols_to_rows(&src, c_n, c0, rows.each_mut().map(|r| &mut r[..])));
                assert_eq!(got, want, "{r_n}×{c_n} from column {c0}");
                #[cfg(target_arch = "x86_64")]
                if let Some(t) = x86_avx2::Avx2::new() {
                    let simd = run(&|rows| {
                        x86_avx2::transpose_8_cols_to_rows(t, &src, c_n, c0, rows.each_mut().map(|r| &mut r[..]))
                    });
                    assert_eq!(simd, want, "avx2 {r_n}×{c_n} from column {c0}");
                }
            }
        }
    }

    #[test]
    fn gated_activation_is_bit_identical_to_the_portable_loop() {
        use crate::model::FfnActivation;
        let mut g = crate::rng::SplitMix64::new(5);
        // Odd length (a vector tail), values over SiLU's whole range, and the clamp edges.
        let mut gate: Vec<f32> = (0..1037).map(|_| (g.unit_f32() - 0.5) * 40.0).collect();
        gate.extend([-100.0, -87.5, -87.0, -0.0, 0.0, 1e-30, 87.9, 88.5, 100.0, f32::MIN_POSITIVE]);
        let up: Vec<f32> = (0..gate.len()).map(|_| g.unit_f32() * 4.0 - 2.0).collect();
        for act in [FfnActivation::Silu, FfnActivation::ReluSquared] {
            let (mut fast, mut plain) = (gate.clone(), gate.clone());
            super::gated_activation(act, &mut fast, &up);
            crate::model::ops::gated_activation_portable(act, &mut plain, &up);
            for (i, (a, b)) in fast.iter().zip(&plain).enumerate() {
                assert_eq!(a.to_bits(), b.to_bits(), "{act:?} element {i} (gate {}): {a} vs {b}", gate[i]);
            }
            // The AVX2 tier too (what CPUs without AVX-512 run).
            #[cfg(target_arch = "x86_64")]
            if let Some(t) = super::x86_avx2::Avx2::new() {
                let mut avx2 = gate.clone();
                super::x86_avx2::gated_activation(t, act, &mut avx2, &up);
                assert!(avx2.iter().zip(&plain).all(|(a, b)| a.to_bits() == b.to_bits()), "{act:?} AVX2");
            }
            // And it is the activation: SiLU(g) × up = g / (1 + e^-g) × up.
            if act == FfnActivation::Silu {
                let i = 3;
                let want = gate[i] / (1.0 + (-gate[i]).exp()) * up[i];
                assert!((fast[i] - want).abs() <= 1e-5 * want.abs().max(1.0), "{} vs {want}", fast[i]);
            }
        }
    }

    #[test]
    fn argmax_is_the_plain_loops_index() {
        // The definition: the running best by index, replaced only by a strictly larger value.
        let plain = |v: &[f32]| {
            let mut best = 0;
            for (i, x) in v.iter().enumerate() {
                if *x > v[best] {
                    best = i;
                }
            }
            best as u32
        };
        let mut g = crate::rng::SplitMix64::new(23);
        let special = [f32::NAN, 0.0, -0.0, f32::INFINITY, f32::NEG_INFINITY, 1.0, 1.0];
        for n in [0usize, 1, 2, 15, 16, 17, 33, 100, 128256] {
            for case in 0..24 {
                let mut v: Vec<f32> = (0..n).map(|_| (g.next_u64() % 64) as f32 - 32.0).collect();
                // Ties, signed zeros, NaNs (first or anywhere), infinities, all-NaN tails.
                for _ in 0..case.min(n) {
                    let at = (g.next_u64() % n as u64) as usize;
                    v[at] = special[(g.next_u64() % special.len() as u64) as usize];
                }
                if case == 5 && n > 0 {
                    v[0] = f32::NAN;
                }
                if case == 6 {
                    v.iter_mut().for_each(|x| *x = -0.0);
                    if n > 3 {
                        v[3] = 0.0;
                    }
                }
                let want = plain(&v);
                assert_eq!(super::argmax(&v), want, "n {n} case {case}");
                assert_eq!(crate::model::ops::argmax_portable(&v), want, "portable, n {n} case {case}");
                #[cfg(target_arch = "x86_64")]
                if let Some(t) = super::x86_avx2::Avx2::new() {
                    assert_eq!(super::x86_avx2::argmax(t, &v), want, "AVX2, n {n} case {case}");
                }
            }
        }
    }

    #[test]
    fn softmax_is_bit_identical_to_the_portable_loop() {
        let mut g = crate::rng::SplitMix64::new(9);
        // Lengths around the 16-lane blocks, spreads that underflow some exponentials, and -∞.
        for n in [1usize, 5, 16, 17, 129, 1025] {
            for spread in [1.0f32, 30.0, 200.0] {
                let mut s: Vec<f32> = (0..n).map(|_| (g.unit_f32() - 0.5) * spread).collect();
                if n > 4 {
                    s[3] = f32::NEG_INFINITY;
                }
                let (mut fast, mut plain) = (s.clone(), s.clone());
                super::softmax_in_place(&mut fast);
                crate::model::ops::softmax_in_place_portable(&mut plain);
                let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
                assert_eq!(bits(&fast), bits(&plain), "n {n} spread {spread}");
                #[cfg(target_arch = "x86_64")]
                if let Some(t) = super::x86_avx2::Avx2::new() {
                    let mut avx2 = s.clone();
                    super::x86_avx2::softmax_in_place(t, &mut avx2);
                    assert_eq!(bits(&avx2), bits(&plain), "AVX2, n {n} spread {spread}");
                }
                // And it is a softmax: sums to 1, the largest score has the largest weight.
                let sum: f64 = fast.iter().map(|v| *v as f64).sum();
                assert!((sum - 1.0).abs() < 1e-5, "n {n}: Σ = {sum}");
                let top = (0..n).max_by(|&a, &b| s[a].total_cmp(&s[b])).unwrap();
                assert!(fast.iter().all(|v| *v <= fast[top]), "n {n}");
            }
        }
    }

    #[test]
    fn lookup_tables_are_identical_to_the_portable_loops() {
        use crate::formats::{tq1_lut, tq1_perm};
        type Builder = fn(&[i8], &mut [u8]);
        type Form = (&'static str, fn(usize) -> usize, Builder, Builder);
        let forms: [Form; 2] = [
            ("lut", tq1_lut::lut_table_bytes, super::build_lut_tables, tq1_lut::build_token_tables_portable),
            ("perm", tq1_perm::perm_table_bytes, super::build_perm_tables, tq1_perm::build_perm_tables_portable),
        ];
        let mut g = crate::rng::SplitMix64::new(17);
        // Short rows (no whole pair or group pair: the SIMD builders' tails only, one pair and a
        // tail), odd lengths and model widths; extremes included.
        for n in [1usize, 3, 4, 5, 6, 7, 12, 13, 24, 25, 47, 256, 1536, 2560, 2561, 6912] {
            let mut x: Vec<i8> = (0..n).map(|_| g.next_u64() as i8).collect();
            for (k, v) in x.iter_mut().enumerate().take(12) {
                *v = [-128, 127, -128, 127, 127, 127, -128, -128, -128, 0, 1, -1][k];
            }
            for (form, table_bytes, fast_builder, plain_builder) in forms {
                let bytes = table_bytes(n);
                let (mut fast, mut plain) = (vec![0x5Au8; bytes], vec![0xA5u8; bytes]);
                fast_builder(&x, &mut fast);
                plain_builder(&x, &mut plain);
                assert_eq!(fast, plain, "{form}, n {n}");
            }
        }
    }

    #[test]
    fn a_thread_builds_tables_once_per_quantization_for_every_token() {
        // `tables_of` gives every token's tables as the definitions make them; asked again for
        // the same activations it reuses them (no build time counted); new values, even equal
        // ones (a new stamp), a new batch size or the other form build them again.
        let cols = 2561;
        let x: Vec<f32> = (0..3 * cols).map(|i| ((i * 31 % 101) as f32 - 50.0) / 7.0).collect();
        let mut a = ActivationBatch::new(3, cols).unwrap();
        let mut s = KernelScratch::new();
        s.time_stages = true;
        let check = |s: &mut KernelScratch, a: &ActivationBatch, form: KernelForm| {
            let perm = form == KernelForm::Perm;
            let t = s.tables_of(form, a);
            for b in 0..a.batch() {
                let q = &a.token(b)[..cols];
                let want = if perm {
                    let mut v = vec![0u8; crate::formats::tq1_perm::perm_table_bytes(cols)];
                    crate::formats::tq1_perm::build_perm_tables_portable(q, &mut v);
                    v
                } else {
                    let mut v = vec![0u8; crate::formats::tq1_lut::lut_table_bytes(cols)];
                    crate::formats::tq1_lut::build_token_tables_portable(q, &mut v);
                    v
                };
                assert!(t.token(b) == want.as_slice(), "{form}, B={}, token {b}", a.batch());
            }
        };
        for form in [KernelForm::Perm, KernelForm::Lut] {
            a.set_batch(3).unwrap();
            a.quantize(&x).unwrap();
            check(&mut s, &a, form);
            assert!(s.take_table_ticks() > 0, "{form}: first call builds");
            check(&mut s, &a, form);
            assert_eq!(s.take_table_ticks(), 0, "{form}: same activations, no build");
            a.quantize(&x).unwrap();
            check(&mut s, &a, form);
            assert!(s.take_table_ticks() > 0, "{form}: quantized again, built again");
            a.set_batch(2).unwrap();
            a.quantize(&x[..2 * cols]).unwrap();
            check(&mut s, &a, form);
            assert!(s.take_table_ticks() > 0, "{form}: new batch size");
        }
        // The other form on the same activations.
        check(&mut s, &a, KernelForm::Perm);
        assert!(s.take_table_ticks() > 0, "form changed");
    }

    #[test]
    fn quantize_token_is_identical_to_the_portable_loop() {
        let mut g = crate::rng::SplitMix64::new(13);
        for n in [1usize, 15, 16, 17, 2560, 6913] {
            let mut x: Vec<f32> = (0..n).map(|_| (g.unit_f32() - 0.5) * 200.0).collect();
            x[0] = 127.0; // the absmax: scale 1, so the values below are their own q
            if n > 4 {
                x[1] = 2.5; // ties to even: 2
                x[2] = -3.5; // −4
                x[3] = f32::NAN; // → 0, and ignored by absmax
            }
            let (mut fast, mut plain) = (vec![9i8; n], vec![9i8; n]);
            let (sf, sp) =
                (super::quantize_token(&x, &mut fast), crate::activations::quantize_token_portable(&x, &mut plain));
            assert_eq!((sf.to_bits(), &fast), (sp.to_bits(), &plain), "n {n}");
            #[cfg(target_arch = "x86_64")]
            if let Some(t) = super::x86_avx2::Avx2::new() {
                let mut avx2 = vec![9i8; n];
                let sa = super::x86_avx2::quantize_token(t, &x, &mut avx2);
                assert_eq!((sa.to_bits(), &avx2), (sp.to_bits(), &plain), "AVX2, n {n}");
            }
            assert_eq!(fast[0], 127);
            if n > 4 {
                assert_eq!(&fast[1..4], &[2, -4, 0], "ties to even, NaN to 0");
            }
        }
        // A subnormal absmax makes 127 / absmax infinite: q = ±127, and 0 · ∞ = NaN → 0.
        let tiny: Vec<f32> = (0..70).map(|i| [1e-45f32, 0.0, -1e-45, f32::NAN][i % 4]).collect();
        let (mut fast, mut plain) = (vec![9i8; 70], vec![9i8; 70]);
        let sp = crate::activations::quantize_token_portable(&tiny, &mut plain);
        assert_eq!(super::quantize_token(&tiny, &mut fast).to_bits(), sp.to_bits());
        assert_eq!(fast, plain);
        assert_eq!(&plain[..4], &[127, 0, -127, 0]);
        // Not finite or all zero: scale 0 and zeros.
        for bad in [vec![0.0f32; 40], vec![1.0, f32::INFINITY, 2.0]] {
            let mut q = vec![5i8; bad.len()];
            assert_eq!(super::quantize_token(&bad, &mut q), 0.0);
            assert!(q.iter().all(|v| *v == 0));
        }
    }

    #[test]
    fn sub_sums_equal_the_portable_loop() {
        let mut g = crate::rng::SplitMix64::new(21);
        for subs in [1usize, 2, 3, 96, 433] {
            let mut q: Vec<i8> = (0..16 * subs).map(|_| g.next_u64() as i8).collect();
            // The extremes: a sub-block of −128s and one of 127s.
            q[..16].fill(-128);
            if subs > 1 {
                q[16..32].fill(127);
            }
            let (mut fast, mut plain) = (vec![7i16; subs], vec![-7i16; subs]);
            super::sub_sums(&q, &mut fast);
            crate::activations::sub_sums_portable(&q, &mut plain);
            assert_eq!(fast, plain, "{subs} sub-blocks");
            assert_eq!(plain[0], -2048);
        }
    }

    #[test]
    fn rms_norm_is_bit_identical_to_the_portable_loop() {
        let mut g = crate::rng::SplitMix64::new(9);
        for n in [7usize, 16, 1536, 2560, 4099] {
            let rows = 3;
            let mut x: Vec<f32> = (0..rows * n).map(|_| (g.unit_f32() - 0.5) * 8.0).collect();
            x[n..2 * n].fill(0.0); // a zero row: eps alone sets the factor
            x[2 * n] = 1e30; // a huge element in the last row
            let w: Vec<f32> = (0..n).map(|_| g.unit_f32() * 2.0).collect();
            let (mut fast, mut plain) = (vec![0f32; rows * n], vec![0f32; rows * n]);
            super::rms_norm_rows(&x, &w, 1e-5, &mut fast);
            crate::model::ops::rms_norm_rows_portable(&x, &w, 1e-5, &mut plain);
            let bits = |v: &[f32]| v.iter().map(|f| f.to_bits()).collect::<Vec<_>>();
            assert_eq!(bits(&fast), bits(&plain), "rows, n {n}");
            let (mut fast_ip, mut plain_ip) = (x.clone(), x.clone());
            super::rms_norm_in_place(&mut fast_ip, &w, 1e-5);
            crate::model::ops::rms_norm_in_place_portable(&mut plain_ip, &w, 1e-5);
            assert_eq!(bits(&fast_ip), bits(&plain_ip), "in place, n {n}");
            assert_eq!(bits(&fast_ip), bits(&fast), "in place = into out, n {n}");
            #[cfg(target_arch = "x86_64")]
            if let Some(t) = super::x86_avx2::Avx2::new() {
                let (mut rows_avx2, mut ip_avx2) = (vec![0f32; rows * n], x.clone());
                super::x86_avx2::rms_norm_rows(t, &x, &w, 1e-5, &mut rows_avx2);
                super::x86_avx2::rms_norm_in_place(t, &mut ip_avx2, &w, 1e-5);
                assert_eq!((bits(&rows_avx2), bits(&ip_avx2)), (bits(&plain), bits(&plain_ip)), "AVX2, n {n}");
            }
            // And it is RMSNorm: x / sqrt(mean(x²) + eps) × w, checked in f64 on the first row.
            let ms: f64 = x[..n].iter().map(|v| (*v as f64).powi(2)).sum::<f64>() / n as f64;
            let want = x[3] as f64 / (ms + 1e-5).sqrt() * w[3] as f64;
            assert!((fast[3] as f64 - want).abs() <= 1e-5 * want.abs().max(1.0), "{} vs {want}", fast[3]);
        }
    }

    #[test]
    fn encoded_attention_reads_every_code_as_the_decode_does() {
        // Arbitrary code bytes (fp8's NaN code, bf16's NaNs and infinities, every nibble and
        // crumb) with finite scales: each ISA's entry point against the portable one, bit for
        // bit (a NaN only as a NaN).
        use crate::model::KvPrecision;
        let same = |a: &[f32], b: &[f32]| {
            a.iter().zip(b).all(|(x, y)| x.to_bits() == y.to_bits() || (x.is_nan() && y.is_nan()))
        };
        let mut g = crate::rng::SplitMix64::new(31);
        let mut buf = vec![0f32; super::ENCODED_CHUNK_VALUES];
        for p in [KvPrecision::Bf16, KvPrecision::Fp8, KvPrecision::Int8, KvPrecision::Int4, KvPrecision::Int2] {
            for hd in [16usize, 40, 96, 128] {
                let (vb, n) = (p.bytes_per_vector(hd), 300);
                let mut rows: Vec<u8> = (0..n * vb).map(|_| g.next_u64() as u8).collect();
                // Each row's f16 parameters (after its codes) finite: 0.5 to 2 times ±2^(0..3).
                let codes = match p {
                    KvPrecision::Bf16 => 2 * hd,
                    KvPrecision::Fp8 | KvPrecision::Int8 => hd,
                    KvPrecision::Int4 => hd.div_ceil(2),
                    _ => hd.div_ceil(4),
                };
                for r in rows.chunks_exact_mut(vb) {
                    for f in r[codes..].chunks_exact_mut(2) {
                        let v = half::f16::from_f32((g.unit_f32() * 1.5 + 0.5) * (1 << (g.next_u64() % 4)) as f32);
                        f.copy_from_slice(&v.to_le_bytes());
                    }
                }
                let q: Vec<f32> = (0..hd).map(|_| g.unit_f32() * 2.0 - 1.0).collect();
                let w: Vec<f32> = (0..n).map(|_| g.unit_f32()).collect();
                let (mut a, mut b) = (vec![0f32; n], vec![0f32; n]);
                super::attention_scores_encoded(p, &q, &rows, 0.125, &mut a, &[], &mut buf);
                super::attention_scores_encoded_portable(p, &q, &rows, 0.125, &mut b, &[], &mut buf);
                assert!(same(&a, &b), "{p} hd {hd} scores");
                let (mut oa, mut ob) = (q.clone(), q.clone());
                super::attention_weighted_sum_encoded(p, &w, &rows, &mut oa, &[], &mut buf);
                super::attention_weighted_sum_encoded_portable(p, &w, &rows, &mut ob, &[], &mut buf);
                assert!(same(&oa, &ob), "{p} hd {hd} weighted sum");
                let (mut da, mut db) = (vec![0f32; n * hd], vec![0f32; n * hd]);
                super::decode_kv_rows(p, &rows, hd, &mut da);
                super::decode_kv_rows_portable(p, &rows, hd, &mut db);
                assert!(same(&da, &db), "{p} hd {hd} decoded rows");
                // Groups of 1 to 5 heads over the same rows: each head's scores and sums as the
                // single-head entry points make them.
                for heads in 1..=5usize {
                    let qs: Vec<f32> = (0..heads * hd).map(|_| g.unit_f32() * 2.0 - 1.0).collect();
                    let ws: Vec<f32> = (0..heads * n).map(|_| g.unit_f32()).collect();
                    let (mut ga, mut one) = (vec![0f32; heads * n], vec![0f32; n]);
                    super::attention_scores_group_encoded(p, &qs, heads, &rows, 0.125, &mut ga, &rows[..7], &mut buf);
                    let (mut oa, mut o1) = (vec![0.5f32; heads * hd], vec![0f32; hd]);
                    super::attention_weighted_sum_group_encoded(p, &ws, heads, &rows, &mut oa, &[], &mut buf);
                    for h in 0..heads {
                        super::attention_scores_encoded(p, &qs[h * hd..][..hd], &rows, 0.125, &mut one, &[], &mut buf);
                        assert!(same(&ga[h * n..][..n], &one), "{p} hd {hd} group of {heads}, head {h} scores");
                        o1.fill(0.5);
                        super::attention_weighted_sum_encoded(p, &ws[h * n..][..n], &rows, &mut o1, &[], &mut buf);
                        assert!(same(&oa[h * hd..][..hd], &o1), "{p} hd {hd} group of {heads}, head {h} sums");
                    }
                }
                // Every fp8 code alone: the reader's float is the decode's.
                if p == KvPrecision::Fp8 && hd == 128 {
                    let mut row = vec![0u8; p.bytes_per_vector(256)];
                    for (i, c) in row[..256].iter_mut().enumerate() {
                        *c = i as u8;
                    }
                    row[256..].copy_from_slice(&half::f16::from_f32(1.5).to_le_bytes());
                    let mut want = vec![0f32; 256];
                    p.decode(&row, &mut want);
                    let (mut oa, mut ob) = (vec![0f32; 256], vec![0f32; 256]);
                    super::attention_weighted_sum_encoded(p, &[1.0], &row, &mut oa, &[], &mut buf);
                    super::attention_weighted_sum_encoded_portable(p, &[1.0], &row, &mut ob, &[], &mut buf);
                    assert!(same(&oa, &ob), "every fp8 code");
                    assert!(same(&ob, &want.iter().map(|v| 0.0 + 1.0 * v).collect::<Vec<_>>()), "portable fp8 codes");
                }
            }
        }
    }

    #[test]
    fn encoded_attention_equals_decoding_position_by_position() {
        // The reference is what attention did before: each position's vector decoded on its own
        // (`KvPrecision::decode`, checked against plain formulas in kv_cache), then `attention_dot`
        // or one fused multiply-add per element. Every ISA entry point must give the same bits.
        use crate::model::KvPrecision;
        let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
        let mut g = crate::rng::SplitMix64::new(29);
        let mut buf = vec![0f32; super::ENCODED_CHUNK_VALUES];
        for p in KvPrecision::ALL.into_iter().filter(|p| !matches!(p, KvPrecision::F32 | KvPrecision::F16)) {
            for hd in [17usize, 64, 96, 100, 128] {
                for n in [1usize, 2, 33, 130] {
                    let vb = p.bytes_per_vector(hd);
                    let q: Vec<f32> = (0..hd).map(|_| g.unit_f32() * 4.0 - 2.0).collect();
                    let w: Vec<f32> = (0..n).map(|_| g.unit_f32()).collect();
                    let mut rows = vec![0u8; n * vb];
                    for r in rows.chunks_exact_mut(vb) {
                        let v: Vec<f32> = (0..hd).map(|_| g.unit_f32() * 6.0 - 3.0).collect();
                        p.encode(&v, r);
                    }
                    let decoded = |i: usize| {
                        let mut v = vec![0f32; hd];
                        p.decode(&rows[i * vb..(i + 1) * vb], &mut v);
                        v
                    };
                    let want_scores: Vec<f32> =
                        (0..n).map(|i| crate::model::ops::attention_dot(&q, &decoded(i)) * 0.125).collect();
                    let mut want_sum = q.clone();
                    for (i, wp) in w.iter().enumerate() {
                        for (a, x) in want_sum.iter_mut().zip(decoded(i)) {
                            *a = wp.mul_add(x, *a);
                        }
                    }
                    let what = format!("{p} hd {hd} n {n}");
                    let mut scores = vec![0f32; n];
                    super::attention_scores_encoded(
                        p,
                        &q,
                        &rows,
                        0.125,
                        &mut scores,
                        &rows[vb.min(rows.len())..],
                        &mut buf,
                    );
                    assert_eq!(bits(&scores), bits(&want_scores), "scores, {what}");
                    super::attention_scores_encoded_portable(p, &q, &rows, 0.125, &mut scores, &[], &mut buf);
                    assert_eq!(bits(&scores), bits(&want_scores), "portable scores, {what}");
                    let mut sum = q.clone();
                    super::attention_weighted_sum_encoded(p, &w, &rows, &mut sum, &rows, &mut buf);
                    assert_eq!(bits(&sum), bits(&want_sum), "weighted sum, {what}");
                    #[cfg(target_arch = "x86_64")]
                    if let Some(t) = super::x86_avx2::Avx2::new() {
                        super::x86_avx2::attention_scores_encoded(t, p, &q, &rows, 0.125, &mut scores, &[], &mut buf);
                        assert_eq!(bits(&scores), bits(&want_scores), "AVX2 scores, {what}");
                        let mut sum = q.clone();
                        super::x86_avx2::attention_weighted_sum_encoded(t, p, &w, &rows, &mut sum, &[], &mut buf);
                        assert_eq!(bits(&sum), bits(&want_sum), "AVX2 weighted sum, {what}");
                    }
                }
            }
        }
    }

    #[test]
    fn grouped_attention_is_each_head_alone_bit_for_bit() {
        // Every group size (2 and 4 take the one-pass kernels, 1 and 3 the per-head loop), head
        // sizes with and without a 16-multiple, and enough positions to cross a position block.
        let mut g = crate::rng::SplitMix64::new(23);
        let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
        for heads in [1usize, 2, 3, 4] {
            for hd in [64usize, 100, 128] {
                for n in [0usize, 1, 17, 300, 600] {
                    let qs: Vec<f32> = (0..heads * hd).map(|_| g.unit_f32() * 4.0 - 2.0).collect();
                    let k32: Vec<f32> = (0..n * hd).map(|_| g.unit_f32() * 6.0 - 3.0).collect();
                    let k16: Vec<half::f16> = k32.iter().map(|v| half::f16::from_f32(*v)).collect();
                    let ws: Vec<f32> = (0..heads * n).map(|_| g.unit_f32()).collect();
                    let o0: Vec<f32> = (0..heads * hd).map(|_| g.unit_f32() - 0.5).collect();
                    let (mut a, mut b) = (vec![0f32; heads * n], vec![0f32; heads * n]);
                    let case = format!("heads {heads} hd {hd} n {n}");
                    super::attention_scores_group(&qs, heads, &k32, 0.125, &mut a, &k32[..k32.len().min(9)]);
                    super::attention_scores_group_portable(&qs, &k32, 0.125, &mut b, n);
                    assert_eq!(bits(&a), bits(&b), "f32 scores, {case}");
                    super::attention_scores_group(&qs, heads, &k16, 0.125, &mut a, &[]);
                    super::attention_scores_group_portable(&qs, &k16, 0.125, &mut b, n);
                    assert_eq!(bits(&a), bits(&b), "f16 scores, {case}");
                    // The definition is each head through the single-head loop.
                    for h in 0..heads {
                        let mut one = vec![0f32; n];
                        super::attention_scores_portable(&qs[h * hd..(h + 1) * hd], &k16, 0.125, &mut one);
                        assert_eq!(bits(&b[h * n..(h + 1) * n]), bits(&one), "definition, head {h}, {case}");
                    }
                    let (mut oa, mut ob) = (o0.clone(), o0.clone());
                    super::attention_weighted_sum_group(&ws, heads, &k16, &mut oa, &k16[..k16.len().min(3)]);
                    super::attention_weighted_sum_group_portable(&ws, n, &k16, &mut ob, hd);
                    assert_eq!(bits(&oa), bits(&ob), "f16 sums, {case}");
                    let (mut oa, mut ob) = (o0.clone(), o0.clone());
                    super::attention_weighted_sum_group(&ws, heads, &k32, &mut oa, &[]);
                    super::attention_weighted_sum_group_portable(&ws, n, &k32, &mut ob, hd);
                    assert_eq!(bits(&oa), bits(&ob), "f32 sums, {case}");
                    for h in 0..heads {
                        let mut one = o0[h * hd..(h + 1) * hd].to_vec();
                        super::attention_weighted_sum_portable(&ws[h * n..(h + 1) * n], &k32, &mut one);
                        assert_eq!(bits(&ob[h * hd..(h + 1) * hd]), bits(&one), "sum definition, head {h}, {case}");
                    }
                    // The AVX2 entry points directly (what the dispatch skips on AVX-512 CPUs).
                    #[cfg(target_arch = "x86_64")]
                    if let Some(t) = super::x86_avx2::Avx2::new() {
                        super::x86_avx2::attention_scores_group_f16(t, &qs, &k16, 0.125, &mut a, n, &[]);
                        super::attention_scores_group_portable(&qs, &k16, 0.125, &mut b, n);
                        assert_eq!(bits(&a), bits(&b), "AVX2 f16 scores, {case}");
                        let (mut oa, mut ob) = (o0.clone(), o0.clone());
                        super::x86_avx2::attention_axpy_group_f32(t, &ws, n, &k32, &mut oa, hd, &[]);
                        super::attention_weighted_sum_group_portable(&ws, n, &k32, &mut ob, hd);
                        assert_eq!(bits(&oa), bits(&ob), "AVX2 f32 sums, {case}");
                    }
                }
            }
        }
    }

    #[test]
    fn attention_primitives_are_bit_identical_to_the_portable_loops() {
        let mut g = crate::rng::SplitMix64::new(17);
        for hd in [64usize, 96, 100, 128, 200, 256] {
            for n in [1usize, 2, 16, 17, 130] {
                let q: Vec<f32> = (0..hd).map(|_| g.unit_f32() * 4.0 - 2.0).collect();
                let k32: Vec<f32> = (0..n * hd).map(|_| g.unit_f32() * 6.0 - 3.0).collect();
                let k16: Vec<half::f16> = k32.iter().map(|v| half::f16::from_f32(*v)).collect();
                let w: Vec<f32> = (0..n).map(|_| g.unit_f32()).collect();
                let (mut a, mut b) = (vec![0f32; n], vec![0f32; n]);
                super::attention_scores(&q, &k32, 0.125, &mut a, &k32[..7]);
                super::attention_scores_portable(&q, &k32, 0.125, &mut b);
                assert_eq!(
                    a.iter().map(|x| x.to_bits()).collect::<Vec<_>>(),
                    b.iter().map(|x| x.to_bits()).collect::<Vec<_>>(),
                    "f32 scores hd {hd} n {n}"
                );
                super::attention_scores(&q, &k16, 0.125, &mut a, &[]);
                super::attention_scores_portable(&q, &k16, 0.125, &mut b);
                assert_eq!(
                    a.iter().map(|x| x.to_bits()).collect::<Vec<_>>(),
                    b.iter().map(|x| x.to_bits()).collect::<Vec<_>>(),
                    "f16 scores hd {hd} n {n}"
                );
                let (mut oa, mut ob) = (q.clone(), q.clone());
                super::attention_weighted_sum(&w, &k16, &mut oa, &k16[3..]);
                super::attention_weighted_sum_portable(&w, &k16, &mut ob);
                assert_eq!(
                    oa.iter().map(|x| x.to_bits()).collect::<Vec<_>>(),
                    ob.iter().map(|x| x.to_bits()).collect::<Vec<_>>(),
                    "f16 sum hd {hd} n {n}"
                );
                let (mut oa, mut ob) = (q.clone(), q.clone());
                super::attention_weighted_sum(&w, &k32, &mut oa, &[]);
                super::attention_weighted_sum_portable(&w, &k32, &mut ob);
                assert_eq!(
                    oa.iter().map(|x| x.to_bits()).collect::<Vec<_>>(),
                    ob.iter().map(|x| x.to_bits()).collect::<Vec<_>>(),
                    "f32 sum hd {hd} n {n}"
                );
                // The AVX2 entry points (what CPUs without AVX-512 run) against the same loops,
                // and the portable loops against one value at a time (exact conversions).
                let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
                let one_at_a_time: Vec<f32> = (0..n)
                    .map(|p| {
                        let k: Vec<f32> = k16[p * hd..(p + 1) * hd].iter().map(|v| v.to_f32()).collect();
                        crate::model::ops::attention_dot(&q, &k) * 0.125
                    })
                    .collect();
                super::attention_scores_portable(&q, &k16, 0.125, &mut b);
                assert_eq!(bits(&b), bits(&one_at_a_time), "f16 row conversion, hd {hd} n {n}");
                #[cfg(target_arch = "x86_64")]
                if let Some(t) = super::x86_avx2::Avx2::new() {
                    super::x86_avx2::attention_scores_f32(t, &q, &k32, 0.125, &mut a, &k32[..9]);
                    super::attention_scores_portable(&q, &k32, 0.125, &mut b);
                    assert_eq!(bits(&a), bits(&b), "AVX2 f32 scores hd {hd} n {n}");
                    super::x86_avx2::attention_scores_f16(t, &q, &k16, 0.125, &mut a, &k16[..3]);
                    assert_eq!(bits(&a), bits(&one_at_a_time), "AVX2 f16 scores hd {hd} n {n}");
                    let (mut oa, mut ob) = (q.clone(), q.clone());
                    super::x86_avx2::attention_axpy_f16(t, &w, &k16, &mut oa, &[]);
                    super::attention_weighted_sum_portable(&w, &k16, &mut ob);
                    assert_eq!(bits(&oa), bits(&ob), "AVX2 f16 sum hd {hd} n {n}");
                    let (mut oa, mut ob) = (q.clone(), q.clone());
                    super::x86_avx2::attention_axpy_f32(t, &w, &k32, &mut oa, &k32[..5]);
                    super::attention_weighted_sum_portable(&w, &k32, &mut ob);
                    assert_eq!(bits(&oa), bits(&ob), "AVX2 f32 sum hd {hd} n {n}");
                }
            }
        }
    }

    #[test]
    fn every_isa_sums_words_like_the_portable_loop() {
        for n in [0usize, 1, 7, 15, 16, 31, 32, 33, 1000] {
            let w: Vec<u64> = (0..n as u64).map(|i| i.wrapping_mul(0xDEAD_BEEF_1234_5677)).collect();
            let want = crate::bandwidth::sum_words_portable(&w);
            #[cfg(target_arch = "x86_64")]
            {
                if let Some(t) = super::x86_avx2::Avx2::new() {
                    assert_eq!(super::x86_avx2::sum_words(t, &w), want, "avx2, n {n}");
                }
                if let Some(t) = super::x86_avx512::Avx512::new() {
                    assert_eq!(super::x86_avx512::sum_words(t, &w), want, "avx512, n {n}");
                }
            }
            assert_eq!(super::sum_words(&w), want);
        }
    }
}
