//! The system fingerprint of a report: what the numbers were measured on, read from this
//! machine (the fields are `bitnet_report::system`'s).

use bitnet_engine::IsaLevel;
use bitnet_report::system::{CpuIdentity, System};

fn read(p: &str) -> Option<String> {
    std::fs::read_to_string(p).ok().map(|s| s.trim().to_string())
}

fn cache_kib(level: u32, kind: &str) -> Option<u64> {
    for i in 0..8 {
        let base = format!("/sys/devices/system/cpu/cpu0/cache/index{i}");
        let (Some(l), Some(t), Some(size)) =
            (read(&format!("{base}/level")), read(&format!("{base}/type")), read(&format!("{base}/size")))
        else {
            continue;
        };
        if l == level.to_string() && (t == kind || t == "Unified") {
            return size.trim_end_matches('K').parse().ok();
        }
    }
    None
}

/// Reads the fingerprint of this machine; `isa_used` names the ISA levels of the kernels run.
pub fn fingerprint(isa_used: &[IsaLevel], pinned: bool) -> System {
    let cpuinfo = read("/proc/cpuinfo").unwrap_or_default();
    let field = |name: &str| {
        cpuinfo.lines().find(|l| l.starts_with(name)).and_then(|l| l.split_once(':')).map(|(_, v)| v.trim().to_string())
    };
    let logical = std::thread::available_parallelism().map(|n| n.get()).unwrap_or(1);
    let mut cores = std::collections::BTreeSet::new();
    let (mut phys, mut core) = (String::new(), String::new());
    for l in cpuinfo.lines() {
        if let Some((k, v)) = l.split_once(':') {
            match k.trim() {
                "physical id" => phys = v.trim().into(),
                "core id" => {
                    core = v.trim().into();
                    cores.insert((phys.clone(), core.clone()));
                }
                _ => {}
            }
        }
    }
    let _ = core;
    let flags = field("flags").unwrap_or_default();
    let wanted =
        ["avx2", "fma", "f16c", "avx512f", "avx512bw", "avx512vl", "avx512_vnni", "avx512_vpopcntdq", "avx512vbmi"];
    let cpu_features =
        wanted.iter().filter(|f| flags.split_whitespace().any(|x| x == **f)).map(|s| s.to_string()).collect();
    let mut isa: Vec<String> = isa_used.iter().map(|l| l.name().to_string()).collect();
    isa.sort();
    isa.dedup();
    let memory_bytes = read("/proc/meminfo").and_then(|m| {
        m.lines().find(|l| l.starts_with("MemTotal:"))?.split_whitespace().nth(1)?.parse::<u64>().ok().map(|k| k * 1024)
    });
    let os = read("/etc/os-release")
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with("PRETTY_NAME="))?
                .split_once('=')
                .map(|(_, v)| v.trim_matches('"').to_string())
        })
        .unwrap_or_else(|| std::env::consts::OS.to_string());
    let turbo = read("/sys/devices/system/cpu/cpufreq/boost")
        .map(|b| if b == "1" { "on".to_string() } else { "off".to_string() })
        .or_else(|| {
            read("/sys/devices/system/cpu/intel_pstate/no_turbo")
                .map(|b| if b == "1" { "off".into() } else { "on".into() })
        });
    System {
        cpu_model: field("model name").unwrap_or_else(|| "unknown".into()),
        cpu_id: bitnet_engine::cpu::CpuId::current().map(|c| CpuIdentity {
            vendor: c.vendor.clone(),
            family: c.family,
            model: c.model,
            stepping: c.stepping,
            microarchitecture: c.microarchitecture().map(str::to_string),
        }),
        physical_cores: if cores.is_empty() { logical } else { cores.len() },
        logical_cpus: logical,
        isa,
        cpu_features,
        l1d_kib: cache_kib(1, "Data"),
        l2_kib: cache_kib(2, "Unified"),
        l3_kib: cache_kib(3, "Unified"),
        memory_bytes,
        os,
        kernel: read("/proc/sys/kernel/osrelease").unwrap_or_default(),
        governor: read("/sys/devices/system/cpu/cpu0/cpufreq/scaling_governor"),
        turbo,
        transparent_hugepage: read("/sys/kernel/mm/transparent_hugepage/enabled").and_then(|m| thp_mode(&m)),
        huge_pages_requested: Some(bitnet_engine::aligned::huge_pages_enabled()),
        pinned,
        rustc: env!("BITNET_RUSTC_VERSION").to_string(),
    }
}

/// The bracketed choice of a sysfs mode list: `always [madvise] never` → `madvise`.
fn thp_mode(list: &str) -> Option<String> {
    let start = list.find('[')? + 1;
    let end = start + list[start..].find(']')?;
    Some(list[start..end].to_string())
}

/// Bytes of memory the OS says are available now (MemAvailable), if readable.
pub fn available_memory() -> Option<u64> {
    read("/proc/meminfo").and_then(|m| {
        m.lines()
            .find(|l| l.starts_with("MemAvailable:"))?
            .split_whitespace()
            .nth(1)?
            .parse::<u64>()
            .ok()
            .map(|k| k * 1024)
    })
}

/// This process's peak resident set size (VmHWM), if readable.
pub fn peak_rss() -> Option<u64> {
    read("/proc/self/status").and_then(|m| {
        m.lines().find(|l| l.starts_with("VmHWM:"))?.split_whitespace().nth(1)?.parse::<u64>().ok().map(|k| k * 1024)
    })
}

#[cfg(test)]
mod tests {
    #[test]
    fn thp_mode_is_the_bracketed_choice() {
        assert_eq!(super::thp_mode("always [madvise] never").as_deref(), Some("madvise"));
        assert_eq!(super::thp_mode("[always] madvise never").as_deref(), Some("always"));
        assert_eq!(super::thp_mode("always madvise never"), None);
    }
}
