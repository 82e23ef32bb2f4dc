//! Records the git commit, dirty flag and rustc version of the build for the report's
//! `tool` and `system` sections.

use std::process::Command;

fn output(cmd: &str, args: &[&str]) -> Option<String> {
    let o = Command::new(cmd).args(args).output().ok()?;
    o.status.success().then(|| String::from_utf8_lossy(&o.stdout).trim().to_string())
}

fn main() {
    let commit = output("git", &["rev-parse", "HEAD"]).unwrap_or_default();
    let dirty = output("git", &["status", "--porcelain", "--untracked-files=no"]).map(|s| !s.is_empty());
    let rustc = std::env::var("RUSTC").unwrap_or_else(|_| "rustc".into());
    let version = output(&rustc, &["--version"]).unwrap_or_default();
    println!("cargo:rustc-env=BITNET_GIT_COMMIT={commit}");
    println!("cargo:rustc-env=BITNET_GIT_DIRTY={}", dirty.map_or("", |d| if d { "true" } else { "false" }));
    println!("cargo:rustc-env=BITNET_RUSTC_VERSION={version}");
    // Rebuild when the commit or the working tree's tracked files change.
    for p in ["../.git/HEAD", "../.git/index", "../.git/refs"] {
        println!("cargo:rerun-if-changed={p}");
    }
}
