//! Every kernel family × ISA level × form equals the scalar oracle exactly: identical integer
//! accumulators and therefore identical f32 outputs, on the shapes the issue lists (tails
//! included), with extreme activations, and on random shapes (proptest). A path this CPU lacks
//! is skipped with a printed reason.
#![allow(clippy::needless_range_loop)]

use std::ops::Range;

use bitnet_engine::formats::{BlockTq1_0, BlockTq2_0, Tq1Matrix, Tq2Matrix, QK_K};
use bitnet_engine::matmul::LUT_MAX_BATCH;
use bitnet_engine::rng::SplitMix64;
use bitnet_engine::{
    ActivationBatch, IsaLevel, Kernel, KernelFamily, KernelForm, KernelScratch, PackedWeights, ScratchNeeds,
    TernaryMatrix, WeightFormat,
};
use proptest::prelude::*;

const KS: [usize; 4] = [256, 544, 2560, 6912];
const NS: [usize; 4] = [1, 7, 64, 640];
const BS: [usize; 6] = [1, 2, 3, 8, 17, 64];

/// Every (kernel, format) pair to check: each non-scalar family on each format it reads.
fn kernels_under_test() -> Vec<(Kernel, WeightFormat)> {
    let mut v = Vec::new();
    for family in KernelFamily::ALL {
        if family == KernelFamily::Scalar {
            continue;
        }
        for &isa in family.isa_levels().iter().filter(|l| l.testable()) {
            for &form in family.forms() {
                match Kernel::new(family, isa, form) {
                    Ok(k) => {
                        for f in WeightFormat::ALL {
                            if family.accepts(f) {
                                v.push((k, f));
                            }
                        }
                    }
                    // A form that needs more than its level (perm: VBMI and GFNI).
                    Err(e) => eprintln!("skipping {family}/{isa}/{form}: {e}"),
                }
            }
        }
    }
    v
}

fn activations(batch: usize, k: usize, seed: u64) -> ActivationBatch {
    let mut g = SplitMix64::new(seed);
    // Heavy-tailed values like real hidden states: mostly small, a few large.
    let x: Vec<f32> = (0..batch * k)
        .map(|_| {
            let u = g.unit_f32() * 2.0 - 1.0;
            if g.below(50) == 0 {
                u * 40.0
            } else {
                u
            }
        })
        .collect();
    let mut a = ActivationBatch::new(batch, k).unwrap();
    a.quantize(&x).unwrap();
    a.build_planes();
    a
}

fn run(kernel: Kernel, w: &PackedWeights, x: &ActivationBatch, rows: Range<usize>) -> Vec<f32> {
    let mut out = vec![f32::NAN; rows.len() * x.batch()];
    let mut scratch = KernelScratch::new();
    kernel.matmul(w, x, rows, &mut out, &mut scratch).unwrap();
    out
}

fn oracle(w: &PackedWeights, x: &ActivationBatch, rows: Range<usize>) -> Vec<f32> {
    run(Kernel::new(KernelFamily::Scalar, IsaLevel::Scalar, KernelForm::Fused).unwrap(), w, x, rows)
}

fn assert_same(kernel: Kernel, format: WeightFormat, what: &str, got: &[f32], want: &[f32]) {
    assert_eq!(got.len(), want.len());
    for (i, (g, w)) in got.iter().zip(want).enumerate() {
        assert!(g.to_bits() == w.to_bits(), "{kernel} on {format}, {what}: output {i} is {g}, oracle says {w}");
    }
}

/// Weights of `format` for the ternary matrix `m` (binary: zeros become +1).
fn pack(format: WeightFormat, m: &TernaryMatrix) -> Option<PackedWeights> {
    if format.needs_qk_multiple() && !m.cols.is_multiple_of(QK_K) {
        let err = format.pack(m).unwrap_err();
        assert!(err.to_string().contains("multiple of 256"), "{err}");
        return None;
    }
    if format == WeightFormat::Binary {
        let mut b = m.clone();
        b.values.iter_mut().filter(|v| **v == 0).for_each(|v| *v = 1);
        return Some(format.pack(&b).unwrap());
    }
    Some(format.pack(m).unwrap())
}

#[test]
fn every_kernel_equals_oracle_on_issue_shapes() {
    let kernels = kernels_under_test();
    assert!(kernels.len() >= 20, "expected every family × form on at least the scalar ISA, got {}", kernels.len());
    for (ki, &k) in KS.iter().enumerate() {
        for (ni, &n) in NS.iter().enumerate() {
            let m = TernaryMatrix::random(n, k, 0.0371, (ki * 10 + ni) as u64);
            for format in WeightFormat::ALL {
                let Some(w) = pack(format, &m) else { continue };
                for (bi, &b) in BS.iter().enumerate() {
                    let x = activations(b, k, (ki * 100 + ni * 10 + bi) as u64);
                    let want = oracle(&w, &x, 0..n);
                    for &(kernel, f) in kernels.iter().filter(|(_, f)| *f == format) {
                        let got = run(kernel, &w, &x, 0..n);
                        assert_same(kernel, f, &format!("N={n} K={k} B={b}"), &got, &want);
                    }
                }
            }
        }
    }
}

/// The int8-row kernel (the LM head) at every ISA level equals plain integer loops written
/// here, bit for bit: one token (the single-row streaming path) and batches (the register
/// tiles), odd row ranges, K with a tail, and rows holding ±127.
#[test]
fn int8_rows_equal_plain_loops() {
    use bitnet_engine::formats::Int8Rows;
    use bitnet_engine::matmul::int8_rows_matmul;
    let mut g = SplitMix64::new(23);
    for k in [256usize, 300, 2560] {
        let n = 37;
        let mut v: Vec<f32> = (0..n * k).map(|_| g.unit_f32() * 2.0 - 1.0).collect();
        for r in 0..n {
            v[r * k + r % k] = if r % 2 == 0 { 3.0 } else { -3.0 }; // the row's absmax: code ±127
        }
        let m = Int8Rows::quantize(n, k, &v).unwrap();
        for batch in [1usize, 2, 3, 5, 8, 9] {
            let mut x = activations(batch, k, 100 + batch as u64);
            if batch == 3 {
                // Extreme activations: −128 (outside what the quantizer writes, but a valid i8
                // that the AVX2 kernel's sign trick must not wrap) and 127, against ±127 weights.
                let q: Vec<i8> = (0..batch * k).map(|i| [-128, 127, -128, -127, 0, 1][i % 6]).collect();
                x.set_quantized(&q, &[0.5, 0.25, 1.0]).unwrap();
            }
            for rows in [0..n, 3..4, 5..36] {
                let want: Vec<f32> = rows
                    .clone()
                    .flat_map(|r| {
                        let (m, x) = (&m, &x);
                        (0..batch).map(move |b| {
                            let isum: i32 = (0..k).map(|c| m.get(r, c) as i32 * x.token(b)[c] as i32).sum();
                            isum as f32 * m.scale(r) * x.scale(b)
                        })
                    })
                    .collect();
                for isa in IsaLevel::ALL {
                    let mut got = vec![f32::NAN; rows.len() * batch];
                    int8_rows_matmul(isa, &m, &x, rows.clone(), &mut got).unwrap();
                    assert_eq!(
                        got.iter().map(|f| f.to_bits()).collect::<Vec<_>>(),
                        want.iter().map(|f| f.to_bits()).collect::<Vec<_>>(),
                        "{isa} K {k} batch {batch} rows {rows:?}"
                    );
                }
            }
        }
    }
}

/// The Q6_K kernel (a GGUF's LM head) at every ISA level equals plain integer loops written
/// here from the block definition, bit for bit: per block Σⱼ scaleⱼ · Σ (q − 32)·x in i32, times
/// d in f64, blocks in order, then the token's scale. Random blocks, and blocks at the extremes
/// (every code 63 or 0, scales −128 and 127) against activations −128 and 127; one token and
/// batches; odd row ranges, one ending at the matrix's last row; rows of 1, 2, 3, 10 and 19
/// blocks (the one-token kernel reduces its sums 16 blocks at a time, two blocks per step);
/// in the file's layout, and in 16-row groups (AVX-512's batched kernel), alone and made by
/// the matrix, with and without the tokens' offsets.
#[test]
fn q6k_rows_equal_plain_loops() {
    use bitnet_engine::formats::{Q6kRowGroups, Q6kRows, Q6K_BLOCK_BYTES};
    use bitnet_engine::matmul::{q6k_groups_matmul, q6k_rows_matmul};
    for k in [256usize, 512, 768, 2560, 19 * 256] {
        let n = 21;
        let random = Q6kRows::random(n, k, 0.05, k as u64).unwrap();
        let mut bytes = random.as_bytes().to_vec();
        for (i, b) in bytes.chunks_exact_mut(Q6K_BLOCK_BYTES).enumerate() {
            let (ql, qh, sc) = match i % 3 {
                0 => (0xFF, 0xFF, 0x80), // q = 63, scale −128
                1 => (0x00, 0x00, 0x7F), // q = 0, scale 127
                _ => continue,
            };
            b[..128].fill(ql);
            b[128..192].fill(qh);
            b[192..208].fill(sc);
        }
        let extreme = Q6kRows::from_bytes(n, k, &bytes).unwrap();
        let grouped = [Q6kRowGroups::from_rows(&random), Q6kRowGroups::from_rows(&extreme)];
        for (mi, m) in [&random, &extreme].into_iter().enumerate() {
            // Cases 1 and 6 are one and eight tokens of extreme activations. From eight tokens
            // the first eight take the assembly tile, then tiles of 8, 4 and 1–3 (13, 16, 19).
            for (case, batch) in [1usize, 1, 2, 3, 5, 8, 8, 9, 12, 13, 16, 19].into_iter().enumerate() {
                let mut x = activations(batch, k, 200 + batch as u64);
                if case == 1 || case == 6 {
                    let q: Vec<i8> = (0..batch * k).map(|i| [-128, 127, 127, -128, -127][(i + i / k) % 5]).collect();
                    x.set_quantized(&q, &vec![0.75; batch]).unwrap();
                }
                if batch == 3 {
                    let q: Vec<i8> = (0..batch * k).map(|i| [-128, 127, -128, -127, 0, 1][i % 6]).collect();
                    x.set_quantized(&q, &[0.5, 0.25, 1.0]).unwrap();
                }
                if batch == 2 {
                    let q: Vec<i8> = (0..batch * k).map(|i| if i < k { -128 } else { 127 }).collect();
                    x.set_quantized(&q, &[0.5, 0.25]).unwrap();
                }
                for rows in [0..n, 3..4, 5..20, 1..n] {
                    let want: Vec<f32> = rows
                        .clone()
                        .flat_map(|r| {
                            let x = &x;
                            (0..batch).map(move |b| {
                                let mut acc = 0f64;
                                for blk in 0..k / QK_K {
                                    let mut isum = 0i32;
                                    for c in blk * QK_K..(blk + 1) * QK_K {
                                        let w = m.code(r, c) as i32 - 32;
                                        isum += m.sub_scale(r, c) as i32 * w * x.token(b)[c] as i32;
                                    }
                                    acc += m.block_scale(r, blk).to_f64() * isum as f64;
                                }
                                acc as f32 * x.scale(b)
                            })
                        })
                        .collect();
                    // The 16-row groups: AVX-512 takes their VNNI kernel (tiles of 8, 4, 2 and 1
                    // tokens) once the offsets are built, alone and through the matrix (from two
                    // tokens, once the groups are made).
                    let mut with_offsets = x.clone();
                    with_offsets.build_q6k_offsets();
                    let prepared = m.clone();
                    prepared.prepare_groups();
                    for isa in IsaLevel::ALL {
                        let mut got = vec![f32::NAN; rows.len() * batch];
                        q6k_rows_matmul(isa, m, &with_offsets, rows.clone(), &mut got).unwrap();
                        assert_eq!(
                            got.iter().map(|f| f.to_bits()).collect::<Vec<_>>(),
                            want.iter().map(|f| f.to_bits()).collect::<Vec<_>>(),
                            "{isa} K {k} batch {batch} rows {rows:?} file layout"
                        );
                        for (x, offsets) in [(&x, false), (&with_offsets, true)] {
                            let mut got = vec![f32::NAN; rows.len() * batch];
                            q6k_groups_matmul(isa, &grouped[mi], x, rows.clone(), &mut got).unwrap();
                            assert_eq!(
                                got.iter().map(|f| f.to_bits()).collect::<Vec<_>>(),
                                want.iter().map(|f| f.to_bits()).collect::<Vec<_>>(),
                                "groups: {isa} K {k} batch {batch} rows {rows:?} offsets {offsets}"
                            );
                            let mut got = vec![f32::NAN; rows.len() * batch];
                            q6k_rows_matmul(isa, &prepared, x, rows.clone(), &mut got).unwrap();
                            assert_eq!(
                                got.iter().map(|f| f.to_bits()).collect::<Vec<_>>(),
                                want.iter().map(|f| f.to_bits()).collect::<Vec<_>>(),
                                "prepared groups: {isa} K {k} batch {batch} rows {rows:?} offsets {offsets}"
                            );
                        }
                    }
                }
            }
        }
    }
    // Shapes that do not fit are errors that say what was expected, at every level.
    let m = Q6kRows::random(8, 512, 0.05, 1).unwrap();
    let x = activations(2, 512, 3);
    let wrong_k = activations(2, 256, 3);
    for isa in IsaLevel::ALL {
        let e = q6k_rows_matmul(isa, &m, &wrong_k, 0..8, &mut [0.0; 16]).unwrap_err().to_string();
        assert!(e.contains("K = 512") && e.contains("K = 256"), "{e}");
        let e = q6k_rows_matmul(isa, &m, &x, 4..9, &mut [0.0; 10]).unwrap_err().to_string();
        assert!(e.contains("4..9 of 8"), "{e}");
        let e = q6k_rows_matmul(isa, &m, &x, 0..8, &mut [0.0; 15]).unwrap_err().to_string();
        assert!(e.contains("need 16 outputs, got 15"), "{e}");
        let g = Q6kRowGroups::from_rows(&m);
        let e = q6k_groups_matmul(isa, &g, &wrong_k, 0..8, &mut [0.0; 16]).unwrap_err().to_string();
        assert!(e.contains("K = 512") && e.contains("K = 256"), "{e}");
        let e = q6k_groups_matmul(isa, &g, &x, 4..9, &mut [0.0; 10]).unwrap_err().to_string();
        assert!(e.contains("4..9 of 8"), "{e}");
    }
}

#[test]
fn extreme_activations_equal_oracle() {
    let kernels = kernels_under_test();
    for k in [256, 544, 2560] {
        let m = TernaryMatrix::random(9, k, 1.5, k as u64);
        for fill in [127i8, -127, 0] {
            for b in [1usize, 3, 8, 17] {
                let mut x = ActivationBatch::new(b, k).unwrap();
                x.set_quantized(&vec![fill; b * k], &vec![0.25; b]).unwrap();
                x.build_planes();
                for format in WeightFormat::ALL {
                    let Some(w) = pack(format, &m) else { continue };
                    let want = oracle(&w, &x, 0..9);
                    // The oracle itself against plain arithmetic: all-constant activations give
                    // fill × (row sum of weights) × scales.
                    if let PackedWeights::I2(p) = &w {
                        for r in 0..9 {
                            let row_sum: i32 = m.row(r).iter().map(|v| *v as i32).sum();
                            let exact = (row_sum * fill as i32) as f32 * p.scale() * 0.25;
                            assert_eq!(want[r * b], exact);
                        }
                    }
                    for &(kernel, f) in kernels.iter().filter(|(_, f)| *f == format) {
                        let got = run(kernel, &w, &x, 0..9);
                        assert_same(kernel, f, &format!("K={k} B={b} all {fill}"), &got, &want);
                    }
                }
            }
        }
    }
}

#[test]
fn sums_at_the_integer_limits_equal_oracle() {
    // Every weight of a row the same and every activation at the same extreme: the largest
    // sums a row can have, which a kernel's narrow (i16) partial sums must hold before they
    // are widened. Rows of +1 and −1 against 127 and −128, over long rows (27 blocks). Also
    // 16, −16 and 5: the TQ1 lookup tables' l bytes of ±48 and ±15 (plain and complemented)
    // are −16 and 15, so its i8 span sums reach −128 and 120. 32 rows: two whole 16-row tiles,
    // the one-token two-tile path and its vector epilogue.
    let kernels = kernels_under_test();
    let (rows, k) = (32, 6912);
    let values: Vec<i8> = (0..rows * k).map(|i| if (i / k) % 2 == 0 { 1 } else { -1 }).collect();
    let m = TernaryMatrix::new(rows, k, values, 1.0).unwrap();
    for fill in [127i8, -128, 16, -16, 5] {
        for b in [1usize, 2, 5, 8] {
            let mut x = ActivationBatch::new(b, k).unwrap();
            x.set_quantized(&vec![fill; b * k], &vec![0.5; b]).unwrap();
            x.build_planes();
            for format in WeightFormat::ALL {
                let Some(w) = pack(format, &m) else { continue };
                let want = oracle(&w, &x, 0..rows);
                for &(kernel, f) in kernels.iter().filter(|(_, f)| *f == format) {
                    let got = run(kernel, &w, &x, 0..rows);
                    assert_same(kernel, f, &format!("K={k} B={b} all {fill}"), &got, &want);
                }
            }
        }
    }
}

#[test]
fn row_ranges_write_only_their_slice() {
    // Ranges that cut tiles, and ranges that start mid-tile but hold whole 16-row tiles (the
    // lut kernel finishes those in vectors, its outputs `batch` apart from `rows.start`). 544
    // columns for the formats that take any width, 512 for the 256-block ones (TQ1_0, TQ2_0).
    for (k, b) in [(544, 1), (544, 3), (512, 1), (512, 3), (512, 5), (512, 9), (512, 11)] {
        let m = TernaryMatrix::random(64, k, 0.1, 5);
        let x = activations(b, k, 6);
        for (kernel, format) in kernels_under_test() {
            let Some(w) = pack(format, &m) else { continue };
            let whole = run(kernel, &w, &x, 0..64);
            for range in [0..1, 5..17, 63..64, 10..10, 5..40, 3..64] {
                let part = run(kernel, &w, &x, range.clone());
                let what = format!("B={b}, rows {range:?}");
                assert_same(kernel, format, &what, &part, &whole[range.start * b..range.end * b]);
            }
        }
    }
}

#[test]
fn tq2_with_varied_block_scales_equals_oracle() {
    // Real GGUF files have a different f16 scale per block; exactness must not rely on equal d.
    let (n, k) = (33, 2560);
    let m = TernaryMatrix::random(n, k, 1.0, 12);
    let packed = Tq2Matrix::pack(&m).unwrap();
    let mut g = SplitMix64::new(13);
    // Most rows keep one scale for all their blocks (the kernels' integer fast path, in tiles
    // of up to four rows), a few get a different scale per block, so both paths run side by
    // side in one matrix. The runs of uniform rows (5, 2, 6, 10 and 5 long) take every tile size;
    // each uniform row has a scale of its own, so that a tile's rows are scaled each by its own.
    let per_row = k / QK_K;
    let uniform = |r: usize| ![5, 8, 15, 16, 27].contains(&r);
    let blocks: Vec<BlockTq2_0> = packed
        .blocks()
        .iter()
        .enumerate()
        .map(|(i, b)| {
            let r = i / per_row;
            let d = if uniform(r) {
                half::f16::from_f32(0.5 + 0.125 * r as f32)
            } else {
                half::f16::from_f32(0.01 + g.unit_f32() * 0.09)
            };
            BlockTq2_0 { qs: b.qs, d }
        })
        .collect();
    let m2 = Tq2Matrix::from_blocks(n, k, blocks).unwrap();
    assert!((0..n).all(|r| m2.row_has_uniform_scale(r) == uniform(r)));
    let w = PackedWeights::Tq2(m2);
    for b in [1, 5, 8, 9] {
        let x = activations(b, k, b as u64);
        let want = oracle(&w, &x, 0..n);
        for &(kernel, _) in kernels_under_test().iter().filter(|(_, f)| *f == WeightFormat::Tq2_0) {
            assert_same(kernel, WeightFormat::Tq2_0, &format!("varied d, B={b}"), &run(kernel, &w, &x, 0..n), &want);
            // Other row ranges start the tiles at other rows.
            let part = run(kernel, &w, &x, 3..n);
            assert_same(kernel, WeightFormat::Tq2_0, &format!("varied d, rows 3.., B={b}"), &part, &want[3 * b..]);
        }
    }
}

#[test]
fn tq1_with_any_code_bytes_and_varied_scales_equals_oracle() {
    // The in-register TQ1 kernels must agree with llama.cpp's digit formula on every byte value,
    // not only on the ones the quantizer writes; and rows with per-block scales (their generic
    // path) sit next to uniform rows (the integer paths: up to four rows at a time for one
    // token; for batches of five or more with every row uniform (AVX2; AVX-512 from nine), rows
    // repacked to I2 blocks in two-row × four-token (AVX2) or 4 × 4 (AVX-512) tiles, 6912-wide
    // rows in two column chunks). Each uniform row has a
    // scale of its own, so that a tile's rows are each scaled by their own. With every row
    // uniform the matrix also has a table-lookup repack (the `lut` form); with some rows mixed
    // it has none and the `lut` form runs the digit kernel.
    let n = 23;
    for (k, mixed) in [(2560usize, true), (6912, true), (2560, false), (6912, false)] {
        let per_row = k / QK_K;
        let mut g = SplitMix64::new(21);
        let mut byte = || (g.next_u64() >> 56) as u8;
        let mut all_values = (0..=255u8).cycle();
        let uniform = |r: usize| !mixed || r % 4 != 1;
        let mut g2 = SplitMix64::new(22);
        let blocks: Vec<BlockTq1_0> = (0..n * per_row)
            .map(|i| {
                let r = i / per_row;
                // The first row walks through all 256 byte values; the others are random bytes.
                let mut code = |_| if r == 0 { all_values.next().unwrap() } else { byte() };
                let d = if uniform(r) {
                    half::f16::from_f32(0.02 + 0.001 * r as f32)
                } else {
                    half::f16::from_f32(0.01 + g2.unit_f32() * 0.09)
                };
                BlockTq1_0 { qs: std::array::from_fn(&mut code), qh: std::array::from_fn(&mut code), d }
            })
            .collect();
        let m = Tq1Matrix::from_blocks(n, k, blocks).unwrap();
        assert!((0..n).all(|r| m.row_has_uniform_scale(r) == uniform(r)));
        assert_eq!(m.lut().is_some(), !mixed);
        let w = PackedWeights::Tq1(m);
        for b in [1, 2, 3, 5, 8, 9, 17] {
            let x = activations(b, k, 40 + b as u64);
            let want = oracle(&w, &x, 0..n);
            for &(kernel, _) in kernels_under_test().iter().filter(|(_, f)| *f == WeightFormat::Tq1_0) {
                assert_same(
                    kernel,
                    WeightFormat::Tq1_0,
                    &format!("any bytes, B={b}"),
                    &run(kernel, &w, &x, 0..n),
                    &want,
                );
                // Odd row ranges start the two-row tile at other rows.
                let part = run(kernel, &w, &x, 3..n);
                assert_same(kernel, WeightFormat::Tq1_0, &format!("rows 3.., B={b}"), &part, &want[3 * b..]);
            }
        }
    }
}

/// The one-token TQ1 kernel reduces its lanes in i32 up to 1600 row chunks and in i64 beyond:
/// rows on both sides of that limit, with code bytes 255 (every digit 2) and activations −127
/// (the worst case for overflow), equal the oracle.
#[test]
fn tq1_long_rows_on_both_sides_of_the_i32_limit_equal_oracle() {
    // 1896 blocks × 54 bytes = 1600 chunks of 64 bytes: the i32 path at its limit, lanes at
    // 91% of the i32 range (the bound assumes |x| = 128 and no scale bytes). 2200 blocks = 1857
    // chunks, where i32 lanes would overflow: the i64 path (raising the limit fails here).
    for blocks_per_row in [1896usize, 2200] {
        let (n, k) = (7, blocks_per_row * QK_K); // tiles of four, two and one row
        let block = BlockTq1_0 { qs: [255; 48], qh: [255; 4], d: half::f16::from_f32(0.03) };
        let blocks = vec![block; n * blocks_per_row];
        let w = PackedWeights::Tq1(Tq1Matrix::from_blocks(n, k, blocks).unwrap());
        let mut x = ActivationBatch::new(1, k).unwrap();
        x.quantize(&vec![-1.0; k]).unwrap();
        assert_eq!(x.token(0)[k - 1], -127);
        let want = oracle(&w, &x, 0..n);
        for &(kernel, _) in kernels_under_test().iter().filter(|(_, f)| *f == WeightFormat::Tq1_0) {
            let what = format!("{blocks_per_row} blocks per row");
            assert_same(kernel, WeightFormat::Tq1_0, &what, &run(kernel, &w, &x, 0..n), &want);
        }
    }
}

#[test]
fn oracle_matches_dequantized_f64_arithmetic() {
    // The oracle's outputs are the real-valued products of dequantized weights and activations,
    // up to f32 rounding of the final scaling.
    let (n, k, b) = (16, 800, 4);
    let m = TernaryMatrix::random(n, k, 0.05, 21);
    let x = activations(b, k, 22);
    let w = WeightFormat::I2.pack(&m).unwrap();
    let got = oracle(&w, &x, 0..n);
    for r in 0..n {
        for t in 0..b {
            let exact: f64 =
                (0..k).map(|c| m.values[r * k + c] as f64 * 0.05 * x.token(t)[c] as f64 * x.scale(t) as f64).sum();
            assert!((got[r * b + t] as f64 - exact).abs() <= 1e-5 * exact.abs().max(1e-3), "row {r} token {t}");
        }
    }
}

#[test]
fn mismatched_arguments_are_clear_errors() {
    let m = TernaryMatrix::random(4, 256, 1.0, 1);
    let w = WeightFormat::I2.pack(&m).unwrap();
    let x = activations(2, 256, 2);
    let k = Kernel::best(KernelFamily::I2s);
    let mut s = KernelScratch::new();
    let err = k.matmul(&w, &x, 0..4, &mut [0.0; 7], &mut s).unwrap_err().to_string();
    assert!(err.contains("8 floats, got 7"), "{err}");
    let err = k.matmul(&w, &x, 2..5, &mut [0.0; 6], &mut s).unwrap_err().to_string();
    assert!(err.contains("outside 0..4"), "{err}");
    let tq = WeightFormat::Tq2_0.pack(&m).unwrap();
    let err = k.matmul(&tq, &x, 0..4, &mut [0.0; 8], &mut s).unwrap_err().to_string();
    assert!(err.contains("cannot read tq2_0"), "{err}");
    let x_other = activations(2, 512, 3);
    assert!(k.matmul(&w, &x_other, 0..4, &mut [0.0; 8], &mut s).is_err());
    let mut no_planes = ActivationBatch::new(2, 256).unwrap();
    no_planes.quantize(&[1.0; 512]).unwrap();
    let xn = Kernel::best(KernelFamily::Xnor);
    let bp = WeightFormat::BitPlanes.pack(&m).unwrap();
    let err = xn.matmul(&bp, &no_planes, 0..4, &mut [0.0; 8], &mut s).unwrap_err().to_string();
    assert!(err.contains("build_planes"), "{err}");
    let lut = Kernel::new(KernelFamily::Tq1, IsaLevel::Scalar, KernelForm::Lut).unwrap();
    let tq1 = WeightFormat::Tq1_0.pack(&m).unwrap();
    // Above LUT_MAX_BATCH tokens the lut form reads no tables (it runs the fused form).
    let big = LUT_MAX_BATCH + 1;
    let mut no_tables = ActivationBatch::new(big, 256).unwrap();
    no_tables.quantize(&vec![0.5; big * 256]).unwrap();
    let mut out = vec![0.0; 4 * big];
    lut.matmul(&tq1, &no_tables, 0..4, &mut out, &mut s).unwrap();
    assert_eq!(out, oracle(&tq1, &no_tables, 0..4));
    assert_eq!(lut.for_batch(LUT_MAX_BATCH), lut);
    assert_eq!(lut.for_batch(big).form(), KernelForm::Fused);
    assert_eq!(k.for_batch(big), k);
    assert!(Kernel::new(KernelFamily::Scalar, IsaLevel::Avx2, KernelForm::Fused).is_err());
    assert!(Kernel::new(KernelFamily::Scalar, IsaLevel::Scalar, KernelForm::Split).is_err());
}

#[test]
fn unsupported_isa_is_reported_not_run() {
    for isa in IsaLevel::ALL {
        match Kernel::new(KernelFamily::I2s, isa, KernelForm::Fused) {
            Ok(k) => assert!(k.isa().is_supported()),
            Err(e) => {
                assert!(!isa.is_supported());
                eprintln!("{isa} not available here: {e}");
            }
        }
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 48, ..ProptestConfig::default() })]

    #[test]
    fn random_shapes_equal_oracle(n in 1usize..24, k in 1usize..1100, b in 1usize..20, seed in any::<u64>()) {
        let m = TernaryMatrix::random(n, k, 0.5, seed);
        let x = activations(b, k, seed ^ 1);
        for format in WeightFormat::ALL {
            let Some(w) = pack(format, &m) else { continue };
            let want = oracle(&w, &x, 0..n);
            for &(kernel, f) in kernels_under_test().iter().filter(|(_, f)| *f == format) {
                let got = run(kernel, &w, &x, 0..n);
                prop_assert!(got.iter().zip(&want).all(|(g, w)| g.to_bits() == w.to_bits()),
                    "{} on {} N={} K={} B={}", kernel, f, n, k, b);
            }
        }
    }

    #[test]
    fn random_block_shapes_equal_oracle(n in 1usize..12, blocks in 1usize..6, b in 1usize..12, seed in any::<u64>()) {
        // K a multiple of 256 so the TQ formats take part in every case.
        let k = blocks * QK_K;
        let m = TernaryMatrix::random(n, k, 0.3, seed);
        let x = activations(b, k, seed ^ 2);
        for format in [WeightFormat::Tq2_0, WeightFormat::Tq1_0, WeightFormat::I2] {
            let w = format.pack(&m).unwrap();
            let want = oracle(&w, &x, 0..n);
            for &(kernel, f) in kernels_under_test().iter().filter(|(_, f)| *f == format) {
                let got = run(kernel, &w, &x, 0..n);
                prop_assert!(got.iter().zip(&want).all(|(g, w)| g.to_bits() == w.to_bits()),
                    "{} on {} N={} K={} B={}", kernel, f, n, k, b);
            }
        }
    }
}

/// Each split stage run alone (for per-stage counters) does its stage's real work: `dot` alone
/// over the first tile's codes gives exactly the oracle's outputs for those rows, and every
/// stage of every family runs and returns a checksum.
#[test]
fn split_stages_run_alone() {
    use bitnet_engine::matmul::SplitStage;
    for family in [KernelFamily::I2s, KernelFamily::Tq2, KernelFamily::Tq1, KernelFamily::Xnor] {
        let (n, k, b) = (40, 512, 2);
        let w = family.native_format().random(n, k, 0.02, 3).unwrap();
        let mut x = ActivationBatch::new(b, k).unwrap();
        let v: Vec<f32> = (0..b * k).map(|i| ((i * 37 % 101) as f32 - 50.0) / 50.0).collect();
        x.quantize(&v).unwrap();
        x.build_planes();
        let mut want = vec![0f32; n * b];
        Kernel::new(KernelFamily::Scalar, IsaLevel::Scalar, KernelForm::Fused)
            .unwrap()
            .matmul(&w, &x, 0..n, &mut want, &mut KernelScratch::new())
            .unwrap();
        for &isa in family.isa_levels().iter().filter(|l| l.testable()) {
            let kernel = Kernel::new(family, isa, KernelForm::Fused).unwrap();
            for stage in SplitStage::of(family) {
                let mut s = KernelScratch::new();
                let mut y = vec![0f32; n * b];
                let sum = kernel.run_stage_alone(stage, &w, &x, 0..n, &mut y, &mut s).unwrap();
                assert_ne!(sum, 0, "{family} {isa} {}", stage.name());
                if stage == SplitStage::Dot {
                    let first = s.tile_rows(x.padded_cols()).min(n);
                    assert_eq!(&y[..first * b], &want[..first * b], "{family} {isa}: dot alone on the first tile");
                }
            }
            let other = if family == KernelFamily::Xnor { SplitStage::Unpack } else { SplitStage::Xnor };
            assert!(kernel
                .run_stage_alone(other, &w, &x, 0..n, &mut vec![0f32; n * b], &mut KernelScratch::new())
                .is_err());
        }
    }
}

#[test]
fn scratch_made_for_the_kernels_never_grows_and_holds_only_what_they_read() {
    // A state makes its threads' scratch with `for_kernels` for its widest rows and largest
    // batch; every call of 1..=batch tokens must then find it big enough (growing would allocate
    // mid-decode), and kernels that read no reordered activations or decoded rows get none.
    let batch = 12;
    for k in [2560usize, 6912] {
        let m = TernaryMatrix::random(24, k, 0.4, 31);
        for (kernel, format) in kernels_under_test() {
            let Some(w) = pack(format, &m) else { continue };
            let padded = ActivationBatch::new(1, k).unwrap().padded_cols();
            let mut scratch = KernelScratch::for_kernels(padded, batch, [kernel]);
            let made = scratch.held();
            assert_eq!(made, kernel.scratch_needs(padded, batch), "{kernel}");
            for b in 1..=batch {
                let x = activations(b, k, 5 + b as u64);
                let mut out = vec![f32::NAN; w.rows() * b];
                kernel.matmul(&w, &x, 0..w.rows(), &mut out, &mut scratch).unwrap();
                assert_eq!(scratch.held(), made, "{kernel} on {format}, K={k}: B={b} grew the scratch");
            }
            let none = ScratchNeeds::default();
            match (kernel.family(), kernel.isa(), kernel.form()) {
                // Reordered activations for small batches, decoded rows for large ones.
                (KernelFamily::Tq1, IsaLevel::Avx2 | IsaLevel::Avx512, KernelForm::Fused) => {
                    assert!(made.reordered > 0 && made.unpacked > 0, "{kernel}: {made:?}")
                }
                // Lookups up to LUT_MAX_BATCH, the decoded-rows kernel above: no reordering.
                // Each thread's own tables of up to LUT_MAX_BATCH tokens.
                (KernelFamily::Tq1, IsaLevel::Avx2 | IsaLevel::Avx512, KernelForm::Lut)
                | (KernelFamily::Tq1, IsaLevel::Avx512, KernelForm::Perm) => {
                    assert!(made.reordered == 0 && made.unpacked > 0 && made.tables > 0, "{kernel}: {made:?}");
                    let tables = ScratchNeeds { tables: made.tables, ..none };
                    assert_eq!(kernel.scratch_needs(padded, LUT_MAX_BATCH), tables, "{kernel}");
                }
                (KernelFamily::Tq1, IsaLevel::Scalar, KernelForm::Lut | KernelForm::Perm) => {
                    assert_eq!(made, ScratchNeeds { tables: made.tables, ..none }, "{kernel}");
                    assert!(made.tables > 0, "{kernel}");
                }
                (KernelFamily::Tq2, IsaLevel::Avx512, KernelForm::Fused) => {}
                _ => assert_eq!(made, none, "{kernel} reads no scratch"),
            }
        }
    }
}
