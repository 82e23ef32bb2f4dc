//! The float operations at AVX2: 8 × 8 register transposes, and the portable definitions
//! compiled for AVX2.

use std::arch::x86_64::*;
use std::ops::Range;

use crate::simd::x86_avx2::*;

/// Columns `cols` of a `[r_n, c_n]` matrix, transposed (see `ops::transpose_cols_into`):
/// whole 8 × 8 tiles in registers, the edges (rows past the last multiple of 8, columns past the
/// last whole tile of `cols`) by plain loops.
pub(crate) fn transpose_cols_into(_t: Avx2, src: &[f32], r_n: usize, c_n: usize, cols: Range<usize>, dst: &mut [f32]) {
    assert!(cols.start <= cols.end && cols.end <= c_n, "columns {cols:?} of {c_n}");
    assert!(src.len() >= r_n * c_n && dst.len() >= cols.len() * r_n, "transpose buffers too short");
    let rows_full = r_n / 8 * 8;
    let cols_full = cols.start..cols.start + cols.len() / 8 * 8;
    // SAFETY: the token proves AVX2; the asserts above bound every tile (see the impl).
    unsafe { transpose_tiles(src, r_n, c_n, rows_full, cols_full.clone(), cols.start, dst) };
    // The edges, by plain loops (empty ranges where the tiles covered everything): the last
    // r_n − rows_full rows in every column of `cols`, then the columns past the last whole tile.
    let mut plain = |cs: Range<usize>, rs: Range<usize>| {
        for c in cs {
            for r in rs.clone() {
                dst[(c - cols.start) * r_n + r] = src[r * c_n + c];
            }
        }
    };
    plain(cols.clone(), rows_full..r_n);
    plain(cols_full.end..cols.end, 0..rows_full);
}

/// Tiles rows `0..rows_full` (a multiple of 8) × columns `cols` (a multiple of 8 long) of a
/// `[r_n, c_n]` source: eight 8-float rows in, eight 8-float columns out.
///
/// SAFETY: the caller guarantees `rows_full ≤ r_n`, `cols.end ≤ c_n`, `src.len() ≥ r_n·c_n` and
/// `dst.len() ≥ (cols.end − first)·r_n`, so every load (row < rows_full, column < cols.end) and
/// every store (destination row < cols.end − first, column < rows_full) is in bounds.
#[target_feature(enable = "avx2")]
unsafe fn transpose_tiles(
    src: &[f32],
    r_n: usize,
    c_n: usize,
    rows_full: usize,
    cols: Range<usize>,
    first: usize,
    dst: &mut [f32],
) {
    let (s, d) = (src.as_ptr(), dst.as_mut_ptr());
    for r0 in (0..rows_full).step_by(8) {
        for c0 in cols.clone().step_by(8) {
            let v: [__m256; 8] = std::array::from_fn(|i| _mm256_loadu_ps(s.add((r0 + i) * c_n + c0)));
            for (j, col) in transpose8x8(v).into_iter().enumerate() {
                _mm256_storeu_ps(d.add((c0 - first + j) * r_n + r0), col);
            }
        }
    }
}

/// The 8 × 8 tile whose row i is `v[i]`, transposed: column j in element j.
#[inline(always)]
unsafe fn transpose8x8(v: [__m256; 8]) -> [__m256; 8] {
    // Pairs of rows interleaved, then pairs of pairs: each 128-bit half now holds four
    // consecutive rows of one column; the lane permute joins the two halves.
    let t = [
        _mm256_unpacklo_ps(v[0], v[1]),
        _mm256_unpackhi_ps(v[0], v[1]),
        _mm256_unpacklo_ps(v[2], v[3]),
        _mm256_unpackhi_ps(v[2], v[3]),
        _mm256_unpacklo_ps(v[4], v[5]),
        _mm256_unpackhi_ps(v[4], v[5]),
        _mm256_unpacklo_ps(v[6], v[7]),
        _mm256_unpackhi_ps(v[6], v[7]),
    ];
    let u: [__m256; 8] = [
        _mm256_shuffle_ps::<0x44>(t[0], t[2]),
        _mm256_shuffle_ps::<0xEE>(t[0], t[2]),
        _mm256_shuffle_ps::<0x44>(t[1], t[3]),
        _mm256_shuffle_ps::<0xEE>(t[1], t[3]),
        _mm256_shuffle_ps::<0x44>(t[4], t[6]),
        _mm256_shuffle_ps::<0xEE>(t[4], t[6]),
        _mm256_shuffle_ps::<0x44>(t[5], t[7]),
        _mm256_shuffle_ps::<0xEE>(t[5], t[7]),
    ];
    std::array::from_fn(|j| {
        if j < 4 {
            _mm256_permute2f128_ps::<0x20>(u[j], u[j + 4])
        } else {
            _mm256_permute2f128_ps::<0x31>(u[j - 4], u[j])
        }
    })
}

/// Columns `c0..c0 + 8` of a `[r_n, c_n]` matrix into eight separate rows (see
/// `ops::transpose_8_cols_to_rows`): 8 × 8 tiles in registers, the last r_n mod 8 rows by
/// a plain loop.
pub(crate) fn transpose_8_cols_to_rows(_t: Avx2, src: &[f32], c_n: usize, c0: usize, dsts: [&mut [f32]; 8]) {
    let r_n = dsts[0].len();
    assert!(dsts.iter().all(|d| d.len() == r_n), "rows of different lengths");
    assert!(c0 + 8 <= c_n && src.len() >= r_n * c_n, "columns {c0}..{} of {c_n}, or source too short", c0 + 8);
    let rows_full = r_n / 8 * 8;
    let d: [*mut f32; 8] = std::array::from_fn(|k| dsts[k].as_mut_ptr());
    // SAFETY: the token proves AVX2; the asserts bound every tile (see the impl).
    unsafe { transpose_tiles_to_rows(src, c_n, c0, rows_full, d) };
    for (k, dst) in dsts.into_iter().enumerate() {
        for r in rows_full..r_n {
            dst[r] = src[r * c_n + c0 + k];
        }
    }
}

/// Tiles of [`transpose_8_cols_to_rows`].
///
/// SAFETY: the caller guarantees `c0 + 8 ≤ c_n`, `src.len() ≥ rows_full·c_n` and that each of
/// `d` points to at least `rows_full` writable floats of its own, so every load (row <
/// rows_full, column < c0 + 8) and every store (8 floats from row r0 < rows_full) is in
/// bounds.
#[target_feature(enable = "avx2")]
unsafe fn transpose_tiles_to_rows(src: &[f32], c_n: usize, c0: usize, rows_full: usize, d: [*mut f32; 8]) {
    let s = src.as_ptr();
    for r0 in (0..rows_full).step_by(8) {
        let v: [__m256; 8] = std::array::from_fn(|i| _mm256_loadu_ps(s.add((r0 + i) * c_n + c0)));
        for (k, col) in transpose8x8(v).into_iter().enumerate() {
            _mm256_storeu_ps(d[k].add(r0), col);
        }
    }
}

// The portable definitions at 8 lanes for CPUs without AVX-512 (see `widest_compiled!`).
compiled_for! {
    Avx2, "avx2,fma,f16c";
    gated_activation(act: super::FfnActivation, gate: &mut [f32], up: &[f32]) = super::portable::gated_activation_portable;
    rms_norm_rows(x: &[f32], weight: &[f32], eps: f32, out: &mut [f32]) = super::portable::rms_norm_rows_portable;
    rms_norm_in_place(x: &mut [f32], weight: &[f32], eps: f32) = super::portable::rms_norm_in_place_portable;
    softmax_in_place(scores: &mut [f32]) = super::portable::softmax_in_place_portable;
    argmax(logits: &[f32]) -> u32 = super::portable::argmax_portable;
}
