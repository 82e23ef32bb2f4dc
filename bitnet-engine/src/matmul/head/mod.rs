//! The LM head: token rows (int8, or llama.cpp's Q6_K) × int8 activations, at the widest ISA
//! the CPU has; every level gives identical results.

#[cfg(target_arch = "x86_64")]
mod x86_avx2;
#[cfg(target_arch = "x86_64")]
mod x86_avx512;

use std::ops::Range;

use super::{finish_blocks, finish_tensor};
use crate::activations::ActivationBatch;
use crate::cpu::IsaLevel;
use crate::error::{Error, Result};
#[cfg(target_arch = "x86_64")]
use crate::simd::x86_avx2::Avx2;
#[cfg(target_arch = "x86_64")]
use crate::simd::x86_avx512::Avx512;

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
        if let Some(t) = Avx512::new() {
            x86_avx512::int8_rows(t, m, x, rows, out);
            return Ok(());
        }
    }
    #[cfg(target_arch = "x86_64")]
    if isa >= IsaLevel::Avx2 {
        if let Some(t) = Avx2::new() {
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
        if let Some(t) = Avx512::new() {
            x86_avx512::q6k_groups(t, g, x, rows, out);
            return Ok(());
        }
    }
    #[cfg(target_arch = "x86_64")]
    if isa >= IsaLevel::Avx2 {
        if let Some(t) = Avx2::new() {
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
        if let Some(t) = Avx512::new() {
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
/// stream 16 KiB ahead. Memory is the limit there, not compute. On Zen 5 this beat the hardware
/// prefetcher alone on both presets, and two rows per pass won on large but lost on 2B4T; on
/// Zen 4, before, no software prefetch had beaten per-row prefetches (docs/perf-notes.md).
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
