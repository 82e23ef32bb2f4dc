//! The matmul kernels' unit tests (the oracle tests are in `tests/kernels_equal_oracle.rs`).

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
        if let Some(t) = Avx2::new() {
            check(t, "avx2");
        }
        if let Some(t) = Avx512::new() {
            check(t, "avx512");
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
