//! Run history in an SQLite database (embedded: rusqlite's bundled SQLite): `bitnet-bench --db
//! FILE` appends every report, `bitnet-diff --db FILE` compares two commits or prints a
//! metric's trend. One table; each row keeps the whole report as JSON next to the columns
//! queries need, so nothing is lost and the format stays the report's.

use std::path::Path;

use anyhow::{anyhow, bail, Context, Result};
use rusqlite::{params, Connection};

use bitnet_report::report::Report;

const CREATE: &str = "CREATE TABLE IF NOT EXISTS runs (
    id INTEGER PRIMARY KEY AUTOINCREMENT,
    created_at TEXT NOT NULL,
    git_commit TEXT,
    git_dirty INTEGER,
    cpu_model TEXT NOT NULL,
    model TEXT NOT NULL,
    complete INTEGER NOT NULL,
    schema_version INTEGER NOT NULL,
    report TEXT NOT NULL
)";

fn open(path: &Path) -> Result<Connection> {
    let db = Connection::open(path).with_context(|| format!("--db {}: cannot open", path.display()))?;
    db.execute(CREATE, []).with_context(|| format!("--db {}: not a bitnet-bench history database", path.display()))?;
    Ok(db)
}

/// Appends a report; returns its run id.
pub fn append(path: &Path, r: &Report) -> Result<i64> {
    let db = open(path)?;
    db.execute(
        "INSERT INTO runs (created_at, git_commit, git_dirty, cpu_model, model, complete, schema_version, report)
         VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8)",
        params![
            r.created_at,
            r.tool.git_commit,
            r.tool.git_dirty,
            r.system.cpu_model,
            r.model.name,
            r.complete,
            r.schema_version,
            serde_json::to_string(r)?
        ],
    )
    .with_context(|| format!("--db {}: cannot append the run", path.display()))?;
    Ok(db.last_insert_rowid())
}

/// A stored run.
pub struct Run {
    pub id: i64,
    pub report: Report,
}

/// Every run, oldest first.
pub fn runs(path: &Path) -> Result<Vec<Run>> {
    if !path.is_file() {
        bail!("--db {}: no such file", path.display());
    }
    let db = open(path)?;
    let mut st = db.prepare("SELECT id, report FROM runs ORDER BY id")?;
    let rows = st.query_map([], |r| Ok((r.get::<_, i64>(0)?, r.get::<_, String>(1)?)))?;
    let mut out = Vec::new();
    for row in rows {
        let (id, text) = row?;
        let report = bitnet_report::parse(&text, &format!("{}: run {id}", path.display()))?;
        out.push(Run { id, report });
    }
    Ok(out)
}

/// The newest complete run of the commit `rev` (a full hash or a prefix of at least 4) built
/// from a clean tree; where the commit has only runs with uncommitted changes
/// (`tool.git_dirty`), the newest of those, which `bitnet-diff` then notes as such.
pub fn latest_of(path: &Path, rev: &str) -> Result<Report> {
    if rev.len() < 4 {
        bail!("revision {rev:?}: give at least 4 characters of the commit hash");
    }
    let all = runs(path)?;
    let of_rev: Vec<Report> = all
        .into_iter()
        .rev()
        .map(|r| r.report)
        .filter(|r| r.complete && r.tool.git_commit.as_deref().is_some_and(|c| c.starts_with(rev)))
        .collect();
    let pick = of_rev.iter().position(|r| r.tool.git_dirty != Some(true)).unwrap_or(0);
    of_rev.into_iter().nth(pick).ok_or_else(|| anyhow!("--db {}: no complete run of commit {rev}", path.display()))
}
