//! The Q6_K LM head (`matmul::q6k_rows_matmul`) on 2B4T's width (2560 columns), B = 1 and
//! B = 8: 128 rows in cache (269 KB, one core's L2) and 32768 rows streamed (69 MB, twice
//! the L3), at the AVX2 level and (B = 8) the AVX-512 VNNI one (on the 16-row groups a batched
//! model state makes), with the portable loop as the same-run reference in cache.
//! Throughput is bytes of Q6_K blocks, so criterion prints GB/s.
//!
//! `cargo bench -p bitnet-benches --bench head [-- FILTER]`

use std::time::Duration;

use bitnet_benches::activations;
use bitnet_engine::formats::Q6kRows;
use bitnet_engine::matmul::q6k_rows_matmul;
use bitnet_engine::IsaLevel;
use criterion::{criterion_group, criterion_main, BenchmarkId, Criterion, Throughput};

const COLS: usize = 2560;

fn head(c: &mut Criterion) {
    for (case, rows) in [("cache_128x2560", 128usize), ("stream_32768x2560", 32768)] {
        let m = Q6kRows::random(rows, COLS, 0.02, 5).expect("valid shape");
        for b in [1usize, 8] {
            let mut group = c.benchmark_group(format!("head_q6k/{case}/B{b}"));
            group
                .warm_up_time(Duration::from_millis(500))
                .measurement_time(Duration::from_millis(1500))
                .sample_size(20);
            group.throughput(Throughput::BytesDecimal(m.byte_len() as u64));
            let mut x = activations(b, COLS, 1);
            // The tokens' offsets, as the model builds them for batches: AVX-512 then runs its
            // VNNI kernel on the head's 16-row groups from two tokens (one token runs the AVX2
            // code on the file's layout).
            x.build_q6k_offsets();
            if b > 1 {
                m.prepare_groups();
            }
            let mut out = vec![0f32; rows * b];
            // The portable loop streamed would take seconds per call: in cache only.
            let mut levels = if rows > 128 { vec![IsaLevel::Avx2] } else { vec![IsaLevel::Scalar, IsaLevel::Avx2] };
            if b > 1 {
                levels.push(IsaLevel::Avx512);
            }
            for &isa in levels.iter().filter(|l| l.is_supported()) {
                group.bench_function(BenchmarkId::from_parameter(isa.name()), |bench| {
                    bench.iter(|| q6k_rows_matmul(isa, &m, &x, 0..rows, &mut out).expect("matching shapes"))
                });
            }
            group.finish();
        }
    }
}

criterion_group!(benches, head);
criterion_main!(benches);
