//! The binary's face: a quick kernel sweep prints a table; bad flags exit 2 naming the flag.

use std::process::Command;

fn bench() -> Command {
    Command::new(env!("CARGO_BIN_EXE_bitnet-bench"))
}

#[test]
fn quick_kernel_sweep_prints_a_table_with_the_probe_and_ratios() {
    let out = bench().args(["kernels", "--quick", "--kernels", "i2s", "--batch", "1,3"]).output().unwrap();
    assert!(out.status.success(), "stderr: {}", String::from_utf8_lossy(&out.stderr));
    let stdout = String::from_utf8(out.stdout).unwrap();
    assert!(stdout.starts_with("memory read bandwidth (probe, 64 MiB"), "{stdout}");
    // One row per i2s kernel this CPU has × 2 shapes × 2 batch sizes, plus the oracle rows.
    let i2s_rows = stdout.lines().filter(|l| l.starts_with("| i2s/")).count();
    let expected = bitnet_engine::Kernel::all_supported()
        .iter()
        .filter(|k| k.family() == bitnet_engine::KernelFamily::I2s)
        .count()
        * 2
        * 2;
    assert_eq!(i2s_rows, expected, "{stdout}");
    assert_eq!(stdout.lines().filter(|l| l.starts_with("| scalar/")).count(), 4, "{stdout}");
    // Every i2s row is faster than the oracle (a ratio > 1 in the last column).
    for line in stdout.lines().filter(|l| l.starts_with("| i2s/")) {
        let speedup: f64 = line.trim_end_matches('|').rsplit('|').next().unwrap().trim().parse().unwrap();
        assert!(speedup > 1.0, "{line}");
    }
}

#[test]
fn bad_flags_exit_2_and_name_the_flag() {
    for (args, needle) in [
        (vec!["kernels", "--kernels", "bogus"], "bogus"),
        (vec!["kernels", "--isa", "sse9"], "sse9"),
        (vec!["kernels", "--batch", "0", "--quick"], "--batch"),
        (vec!["frobnicate"], "frobnicate"),
    ] {
        let out = bench().args(&args).output().unwrap();
        assert_eq!(out.status.code(), Some(2), "{args:?}");
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(stderr.contains(needle), "{args:?}: {stderr}");
        assert!(out.stdout.is_empty(), "{args:?} printed to stdout");
    }
}
