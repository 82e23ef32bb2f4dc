//! TQ1_0 / TQ2_0 bytes must be exactly those of llama.cpp's quantizer, as implemented by the
//! official `gguf` Python package (fixture written by `data/make_tq_vectors.py`).
#![allow(clippy::needless_range_loop)]

use bitnet_engine::formats::{Tq1Matrix, Tq2Matrix};
use bitnet_engine::TernaryMatrix;

const ROWS: usize = 3;
const COLS: usize = 512;

fn data(name: &str) -> Vec<u8> {
    let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/data").join(name);
    std::fs::read(&path).unwrap_or_else(|e| panic!("reading fixture {}: {e}", path.display()))
}

fn fixture_rows() -> Vec<TernaryMatrix> {
    let values: Vec<i8> = data("tq_vectors_ternary.i8").into_iter().map(|b| b as i8).collect();
    let scales: Vec<f32> =
        data("tq_vectors_scales.f32").chunks_exact(4).map(|c| f32::from_le_bytes(c.try_into().unwrap())).collect();
    assert_eq!((values.len(), scales.len()), (ROWS * COLS, ROWS));
    (0..ROWS)
        .map(|r| TernaryMatrix::new(1, COLS, values[r * COLS..(r + 1) * COLS].to_vec(), scales[r]).unwrap())
        .collect()
}

#[test]
fn tq2_0_packing_matches_gguf_bytes() {
    let expected = data("tq_vectors.tq2_0");
    let ours: Vec<u8> = fixture_rows().iter().flat_map(|m| Tq2Matrix::pack(m).unwrap().to_bytes()).collect();
    assert_eq!(ours.len(), expected.len());
    for (i, (a, b)) in ours.iter().zip(&expected).enumerate() {
        assert_eq!(a, b, "TQ2_0 byte {i} (block {}, offset {})", i / 66, i % 66);
    }
}

#[test]
fn tq1_0_packing_matches_gguf_bytes() {
    let expected = data("tq_vectors.tq1_0");
    let ours: Vec<u8> = fixture_rows().iter().flat_map(|m| Tq1Matrix::pack(m).unwrap().to_bytes()).collect();
    assert_eq!(ours.len(), expected.len());
    for (i, (a, b)) in ours.iter().zip(&expected).enumerate() {
        assert_eq!(a, b, "TQ1_0 byte {i} (block {}, offset {})", i / 54, i % 54);
    }
}

#[test]
fn decoding_gguf_bytes_gives_the_ternary_values() {
    let rows = fixture_rows();
    let all_values: Vec<i8> = rows.iter().flat_map(|m| m.values.clone()).collect();
    let tq2 = Tq2Matrix::from_bytes(ROWS, COLS, &data("tq_vectors.tq2_0")).unwrap();
    let tq1 = Tq1Matrix::from_bytes(ROWS, COLS, &data("tq_vectors.tq1_0")).unwrap();
    assert_eq!(tq2.unpack().values, all_values);
    assert_eq!(tq1.unpack().values, all_values);
    // Block scales are f16(absmax): the row scale, or 0 for an all-zero block (row 1, block 1).
    for r in 0..ROWS {
        for b in 0..2 {
            let all_zero = rows[r].values[b * 256..(b + 1) * 256].iter().all(|v| *v == 0);
            let want = if all_zero { 0.0 } else { half::f16::from_f32(rows[r].scale).to_f32() };
            assert_eq!(tq2.row(r)[b].d.to_f32(), want, "TQ2_0 d of row {r} block {b}");
            assert_eq!(tq1.row(r)[b].d.to_f32(), want, "TQ1_0 d of row {r} block {b}");
        }
    }
    assert!(tq2.row(1)[1].qs.iter().all(|b| *b == 0x55), "all-zero TQ2_0 block is 0x55 bytes");
}
