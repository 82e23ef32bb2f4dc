//! `bitnet-bench pipes`: the pipe probe's table (see `bitnet_engine::probes::compute_peak::PipeMix`),
//! which shows on this CPU whether lookups, bf16 products or adds can add int8 arithmetic
//! beside `vpdpbusd`, the bound of batched decode and prefill.

use bitnet_engine::probes::compute_peak::{PipeMix, PipeMixReport};

/// The table printed by `bitnet-bench pipes`, with the legend that says how products are counted
/// and what the last column means.
pub fn table(reports: &[PipeMixReport]) -> String {
    if reports.is_empty() {
        return "pipe probe: this CPU has no AVX-512 VNNI, so there is no vpdpbusd loop to compare with\n".into();
    }
    let alone = reports.iter().find(|r| r.mix == PipeMix::Vnni).map(|r| r.products_g);
    let mut s = String::from(
        "instruction mixes on one core (AVX-512, register loops; best pass):\n\n\
         | mix                             | a round                                                     | M rounds/s | G vpdpbusd/s | G products/s | × vpdpbusd alone |\n\
         |---------------------------------|-------------------------------------------------------------|------------|--------------|--------------|------------------|\n",
    );
    for r in reports {
        let ratio = alone.map_or("-".to_string(), |a| format!("{:.2}", r.products_g / a));
        s += &format!(
            "| {:<31} | {:<59} | {:>10.1} | {:>12.2} | {:>12.1} | {:>16} |\n",
            r.mix.name(),
            r.mix.round(),
            r.rounds_per_sec / 1e6,
            r.vnni_g,
            r.products_g,
            ratio
        );
    }
    let missing: Vec<&str> =
        PipeMix::ALL.iter().filter(|m| !reports.iter().any(|r| r.mix == **m)).map(|m| m.name()).collect();
    if !missing.is_empty() {
        s += &format!("\nnot run (this CPU lacks BF16 or VBMI): {}\n", missing.join(", "));
    }
    s += "\nproducts: 64 a vpdpbusd; 32 a vdpbf16ps; 96 a vpermi2b → vpdpbusd pair (a 128-byte table of\n\
          two column triples' sums, split into 4-bit activation halves so that each fits a byte); 32 a\n\
          masked vpaddw + vpsubw pair (+1 and −1 weights of 32 columns); none for vpaddd. A mix above\n\
          1.00× would let a batched kernel pass the int8 peak; at or below it, it cannot.\n";
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    fn report(mix: PipeMix, rounds_per_sec: f64) -> PipeMixReport {
        let vnni_g = rounds_per_sec * mix.vnni_per_round() as f64 / 1e9;
        let products_g = rounds_per_sec * (64 * mix.vnni_per_round() + mix.other_products_per_round()) as f64 / 1e9;
        PipeMixReport { mix, rounds_per_sec, vnni_g, products_g }
    }

    #[test]
    fn the_table_compares_each_mix_with_vpdpbusd_alone() {
        // 12 vpdpbusd a round at 300 M rounds/s: 3.6 G a second, 230.4 G products.
        let t = table(&[
            report(PipeMix::Vnni, 300e6),
            report(PipeMix::Lookup, 300e6),
            report(PipeMix::VnniMaskedAdd, 200e6),
        ]);
        let row = |name: &str| t.lines().find(|l| l.starts_with(&format!("| {name} "))).unwrap().to_string();
        assert!(row("vpdpbusd").contains("|        300.0 |") || row("vpdpbusd").contains("300.0"), "{t}");
        assert!(
            row("vpdpbusd").contains("3.60")
                && row("vpdpbusd").contains("230.4")
                && row("vpdpbusd").ends_with("1.00 |")
        );
        // Lookup: 6 pairs of 96 products a round = 172.8 G, 0.75× of 230.4.
        assert!(row("vpermi2b → vpdpbusd").contains("172.8") && row("vpermi2b → vpdpbusd").ends_with("0.75 |"), "{t}");
        // Masked adds: 6 × 64 + 3 × 32 = 480 products a round at 200 M = 96.0 G, 0.42×.
        assert!(row("vpdpbusd + masked vpaddw/vpsubw").contains("96.0"), "{t}");
        assert!(row("vpdpbusd + masked vpaddw/vpsubw").ends_with("0.42 |"), "{t}");
        assert!(
            t.contains("not run (this CPU lacks BF16 or VBMI): vdpbf16ps, vpdpbusd + vdpbf16ps, vpdpbusd + vpaddd"),
            "{t}"
        );
        assert!(table(&[]).contains("no AVX-512 VNNI"));
    }
}
