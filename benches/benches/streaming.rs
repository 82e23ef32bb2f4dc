//! What batch-1 decode really does: each call reads a matrix the previous calls evicted from
//! every cache. The best kernel of each family (`Kernel::best`) cycles over ≥ 512 MiB of 6912×2560
//! matrices (16× the 32 MiB L3), beside the engine's memory-bandwidth probe (a STREAM-style read
//! of 1 GiB): the probe's GB/s is the roofline the kernels are compared with.
//!
//! `cargo bench -p bitnet-benches --bench streaming`

use std::time::Duration;

use bitnet_benches::activations;
use bitnet_engine::probes::bandwidth::{ProbeBuffer, DEFAULT_PROBE_BYTES};
use bitnet_engine::{Kernel, KernelFamily, KernelScratch, PackedWeights};
use criterion::{criterion_group, criterion_main, BenchmarkId, Criterion, Throughput};

const SET_BYTES: usize = 512 << 20;
const N: usize = 6912;
const K: usize = 2560;

fn bandwidth_probe(c: &mut Criterion) {
    let buf = ProbeBuffer::new(DEFAULT_PROBE_BYTES).expect("1 GiB");
    let mut group = c.benchmark_group("streaming");
    group.sample_size(10).warm_up_time(Duration::from_secs(1)).measurement_time(Duration::from_secs(4));
    group.throughput(Throughput::BytesDecimal(buf.bytes() as u64));
    group.bench_function("bandwidth_probe_1thread", |b| b.iter(|| buf.read_once(1)));
    group.finish();
}

fn streaming(c: &mut Criterion) {
    let mut group = c.benchmark_group("streaming");
    group.sample_size(20).warm_up_time(Duration::from_secs(1)).measurement_time(Duration::from_secs(3));
    for family in [KernelFamily::I2s, KernelFamily::Tq2, KernelFamily::Tq1, KernelFamily::Xnor] {
        let kernel = Kernel::best(family);
        let one = family.native_format().random(N, K, 0.02, 5).expect("valid shape");
        // What the kernel reads beside the weights (the tq1 lookup repack, the AVX2 tq2 code
        // copy) made before the copies, which carry it, and counted as what it streams.
        kernel.prepare(&one);
        let bytes = kernel.bytes_read(&one);
        // Distinct copies in memory (timing does not depend on the values), ≥ 512 MiB in all.
        let count = SET_BYTES.div_ceil(bytes);
        let set: Vec<PackedWeights> = vec![one; count];
        for b in [1usize, 8] {
            let x = activations(b, K, 2);
            let mut out = vec![0f32; N * b];
            let mut scratch = KernelScratch::for_cols(x.padded_cols());
            let mut i = 0;
            group.throughput(Throughput::BytesDecimal(bytes as u64));
            group.bench_function(BenchmarkId::new(kernel.name().replace('/', "_"), format!("B{b}")), |bench| {
                bench.iter(|| {
                    i = (i + 1) % set.len();
                    kernel.matmul(&set[i], &x, 0..N, &mut out, &mut scratch).expect("matching shapes")
                })
            });
        }
    }
    group.finish();
}

criterion_group!(benches, bandwidth_probe, streaming);
criterion_main!(benches);
