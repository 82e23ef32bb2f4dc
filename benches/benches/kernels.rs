//! Every kernel family × ISA level × form on the BitNet b1.58 2B4T shapes, B = 1 and B = 8, in
//! cache (one matrix, reused). Throughput is bytes of packed weights, so criterion prints GB/s;
//! the scalar oracle is included so speedups are measured in the same run.
//!
//! `cargo bench -p bitnet-benches --bench kernels [-- FILTER]`

use std::time::Duration;

use bitnet_benches::{activations, shapes_2b4t};
use bitnet_engine::{Kernel, KernelFamily, KernelScratch};
use criterion::{criterion_group, criterion_main, BenchmarkId, Criterion, Throughput};

fn kernels(c: &mut Criterion) {
    for (shape, n, k) in shapes_2b4t() {
        for b in [1usize, 8] {
            let mut group = c.benchmark_group(format!("kernels/{shape}/B{b}"));
            group
                .warm_up_time(Duration::from_millis(500))
                .measurement_time(Duration::from_millis(1500))
                .sample_size(20);
            let x = activations(b, k, 1);
            for kernel in Kernel::all_supported() {
                let w = kernel.family().native_format().random(n, k, 0.02, 3).expect("valid shape");
                let mut out = vec![0f32; n * b];
                let mut scratch = KernelScratch::for_cols(x.padded_cols());
                if kernel.family() == KernelFamily::Scalar {
                    group.sample_size(10).measurement_time(Duration::from_secs(2));
                } else {
                    group.sample_size(20).measurement_time(Duration::from_millis(1500));
                }
                // Made before timing: what the kernel reads beside the weights, counted as read.
                kernel.prepare(&w);
                group.throughput(Throughput::BytesDecimal(kernel.bytes_read(&w) as u64));
                group.bench_function(BenchmarkId::from_parameter(kernel.name().replace('/', "_")), |bench| {
                    bench.iter(|| kernel.matmul(&w, &x, 0..n, &mut out, &mut scratch).expect("matching shapes"))
                });
            }
            group.finish();
        }
    }
}

criterion_group!(benches, kernels);
criterion_main!(benches);
