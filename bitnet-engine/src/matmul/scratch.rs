//! The kernels' per-thread scratch: the split forms' tiles, rearranged activations, decoded
//! rows and the lookup forms' token tables.

use super::*;

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
    pub(super) codes: AlignedBytes,
    /// AND results of the xnor stage, `[8 planes, 2 (mask, sign), plane_words]`.
    pub(super) words: Vec<u64>,
    /// Activations rearranged for the AVX-512 TQ1 and TQ2 kernels (TQ1 digit order,
    /// `[tokens, cols / 256, 320]` for up to eight tokens, or TQ2 lane order, `[cols]`); grown
    /// on first use for a batch size, so later calls allocate nothing.
    pub(crate) x_reordered: AlignedBytes,
    /// Decoded codes of a block of rows for the batched TQ1 kernels (repacked as I2 blocks:
    /// `x86_avx2::codes::unpacked_scratch_bytes`, `x86_avx512::tq1::tq1_repack_scratch_bytes`); grown on
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

    /// Preallocates everything the kernels would otherwise grow on first use, for calls of 1 to
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
    /// caller into the activations and read by every thread, they had taken far longer to
    /// write with two Zen 4 threads than with one (every line the other core had read must first
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
                    crate::activations::build_perm_tables(&x.token(b)[..cols], dst);
                } else {
                    crate::activations::build_lut_tables(&x.token(b)[..cols], dst);
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

    pub(super) fn ensure(&mut self, padded_cols: usize) {
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
