//! Writing output files so that readers never see a half-written one.

use std::io::Write;
use std::path::Path;

use crate::error::{ReportError, Result};

/// Writes `bytes` to a temporary file beside `path`, syncs it and renames it into place; on
/// failure the temporary file is removed and `path` is untouched.
pub fn write_atomic(path: &Path, bytes: &[u8]) -> Result<()> {
    let error = |error| ReportError::Write { path: path.to_path_buf(), error };
    let dir = path.parent().filter(|d| !d.as_os_str().is_empty()).unwrap_or(Path::new("."));
    if path.file_name().is_none() {
        return Err(error(std::io::Error::new(std::io::ErrorKind::InvalidInput, "the path has no file name")));
    }
    let mut builder = tempfile::Builder::new();
    // A temporary file is private (0600) by default; the output gets what a plain create
    // would give it (0666 less the umask).
    #[cfg(unix)]
    builder.permissions(std::os::unix::fs::PermissionsExt::from_mode(0o666));
    let mut tmp = builder.prefix(".tmp-").tempfile_in(dir).map_err(error)?;
    tmp.write_all(bytes).map_err(error)?;
    tmp.as_file().sync_all().map_err(error)?;
    tmp.persist(path).map_err(|e| error(e.error))?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn writes_whole_files_and_leaves_nothing_on_failure() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("r.json");
        write_atomic(&p, b"one").unwrap();
        write_atomic(&p, b"two").unwrap();
        assert_eq!(std::fs::read(&p).unwrap(), b"two");
        let missing = dir.path().join("no/such/dir/r.json");
        let e = write_atomic(&missing, b"x").unwrap_err().to_string();
        assert!(e.starts_with(&missing.display().to_string()) && e.contains("cannot write"), "{e}");
        let names: Vec<_> = std::fs::read_dir(dir.path()).unwrap().map(|e| e.unwrap().file_name()).collect();
        assert_eq!(names, ["r.json"], "no temporary file is left behind");
    }

    #[cfg(unix)]
    #[test]
    fn output_files_get_the_permissions_of_a_plain_create() {
        use std::os::unix::fs::PermissionsExt;
        let dir = tempfile::tempdir().unwrap();
        let (ours, plain) = (dir.path().join("a"), dir.path().join("b"));
        write_atomic(&ours, b"x").unwrap();
        std::fs::write(&plain, b"x").unwrap();
        let mode = |p: &Path| std::fs::metadata(p).unwrap().permissions().mode() & 0o777;
        assert_eq!(mode(&ours), mode(&plain));
    }
}
