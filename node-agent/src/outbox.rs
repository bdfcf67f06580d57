//! The durable outbox: every run report is on disk before it is sent, and leaves only when the
//! orchestrator acknowledges its ID.
//!
//! Stored in one `redb` file (copy-on-write B-trees, crash-safe commits; every write here is
//! committed with `Durability::Immediate`), so a `kill -9` or a node reboot loses nothing that
//! was pushed. Sending is at-least-once: a report sent but not yet acknowledged when the agent
//! dies is sent again, under the same `report_id`, and the orchestrator answers `DUPLICATE`.
//!
//! The outbox is bounded (`--outbox-max-reports`). When full, the oldest in-progress snapshot
//! makes room (a later snapshot or the final report of the same run supersedes it); completed
//! runs are never dropped to make room. A report that cannot be stored because the outbox is
//! full of completed runs is refused and handed back to the caller, which logs an error and
//! counts it: loud, never silent.
//!
//! A damaged file (a bad block, a torn write, a truncation to zero bytes) is found when the
//! outbox opens: every page's checksum is verified and every record read. Such a file is moved
//! aside as `outbox.redb.damaged-<unix seconds>` (kept for inspection), an error is logged,
//! and the agent starts with an empty outbox instead of crash-looping; [`Outbox::recovered`]
//! says so (counted in `kudos_outbox_recoveries`). A panic inside redb on a later operation
//! becomes [`OutboxError::Damaged`], an error like any other store failure.
//!
//! Tables: `reports` (sequence → encoded report, in arrival order), `ids` (report ID →
//! sequence, for acknowledgements), `snapshots` (sequences of in-progress snapshots, oldest
//! first), `meta` (counters and one-shot flags), `active_runs` (run ID → latest state of each
//! active run, so runs survive agent restarts).

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};

use kudos_proto::kudos::v1::{RunReport, RunState};
use prost::Message;
use redb::{Durability, ReadableDatabase, ReadableTable, ReadableTableMetadata, TableDefinition};

const REPORTS: TableDefinition<u64, &[u8]> = TableDefinition::new("reports");
const IDS: TableDefinition<&str, u64> = TableDefinition::new("ids");
const SNAPSHOTS: TableDefinition<u64, ()> = TableDefinition::new("snapshots");
const META: TableDefinition<&str, u64> = TableDefinition::new("meta");
const ACTIVE: TableDefinition<&str, &[u8]> = TableDefinition::new("active_runs");

const NEXT_SEQ: &str = "next_seq";
const SYNTHETIC_DONE: &str = "synthetic_done";

/// Outbox errors.
#[derive(Debug, thiserror::Error)]
pub enum OutboxError {
    /// The directory or file could not be prepared.
    #[error("outbox directory {path}: {source}")]
    Io {
        /// The path involved.
        path: PathBuf,
        /// The cause.
        #[source]
        source: std::io::Error,
    },
    /// The store failed (disk full, corruption, I/O error).
    #[error("outbox store: {0}")]
    Store(#[source] Box<redb::Error>),
    /// The file is damaged: the embedded database panicked reading or writing it.
    #[error("outbox store damaged: {0}")]
    Damaged(String),
}

impl OutboxError {
    /// Whether the error says the file itself is damaged (as opposed to permissions, a full
    /// disk or another process holding it).
    fn is_damage(&self) -> bool {
        match self {
            OutboxError::Damaged(_) => true,
            OutboxError::Store(e) => kudos_common::damaged_file::is_damage(e),
            OutboxError::Io { .. } => false,
        }
    }
}

/// Calls `f`, turning a panic inside redb into [`OutboxError::Damaged`].
fn guarded<T>(f: impl FnOnce() -> Result<T, OutboxError>) -> Result<T, OutboxError> {
    kudos_common::damaged_file::catch_panic(f, OutboxError::Damaged)
}

impl<E: Into<redb::Error>> From<E> for OutboxError {
    fn from(e: E) -> Self {
        OutboxError::Store(Box::new(e.into()))
    }
}

/// What a push did.
#[derive(Debug, Default)]
pub struct PushOutcome {
    /// Reports newly stored.
    pub stored: usize,
    /// Reports already present under the same ID (not stored twice).
    pub duplicates: usize,
    /// IDs of in-progress snapshots dropped to make room (older ones, or the new one itself
    /// when only completed runs were left).
    pub dropped_snapshots: Vec<String>,
    /// Completed or failed run reports that could not be stored because the outbox is full of
    /// completed runs. The caller must report these loudly.
    pub refused: Vec<RunReport>,
}

/// The on-disk outbox; see the module docs. Cheap to share behind an `Arc`.
pub struct Outbox {
    db: kudos_common::damaged_file::ClosingDatabase,
    max_reports: u64,
    depth: AtomicU64,
    notify: tokio::sync::Notify,
    recovered: Option<String>,
}

fn io_error(path: &Path) -> impl FnOnce(std::io::Error) -> OutboxError {
    let path = path.to_owned();
    move |source| OutboxError::Io { path, source }
}

fn is_snapshot(r: &RunReport) -> bool {
    r.state == RunState::InProgress as i32
}

impl Outbox {
    /// Opens (or creates) the outbox in `dir`: the directory is made `0700`, the file `0600`.
    /// A damaged file is moved aside and an empty outbox started (see the module docs).
    pub fn open(dir: &Path, max_reports: u64) -> Result<Self, OutboxError> {
        use std::os::unix::fs::{DirBuilderExt, PermissionsExt};
        std::fs::DirBuilder::new()
            .recursive(true)
            .mode(0o700)
            .create(dir)
            .map_err(io_error(dir))?;
        std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o700))
            .map_err(io_error(dir))?;
        let file = dir.join("outbox.redb");
        let damage = match std::fs::metadata(&file) {
            // A store always holds its tables: zero bytes is a truncation, not a new file.
            Ok(m) if m.len() == 0 => OutboxError::Damaged("the file has zero bytes".into()),
            _ => match guarded(|| Self::open_file(&file, max_reports)) {
                Err(e) if e.is_damage() => e,
                other => return other,
            },
        };
        let aside = kudos_common::damaged_file::move_aside(&file).map_err(io_error(&file))?;
        tracing::error!(
            path = %file.display(),
            moved_to = %aside.display(),
            reason = %damage,
            "THE OUTBOX FILE IS DAMAGED: it was moved aside and the agent starts with an EMPTY outbox \
             (reports not yet acknowledged and saved active runs in it are lost)"
        );
        let mut outbox = guarded(|| Self::open_file(&file, max_reports))?;
        outbox.recovered = Some(format!("{damage}; moved to {}", aside.display()));
        Ok(outbox)
    }

    /// Opens the file, verifying every page's checksum (redb's integrity check: a plain open
    /// may panic on a file damaged outside redb) and reading every record once, so damage is
    /// found here rather than by a later send.
    fn open_file(file: &Path, max_reports: u64) -> Result<Self, OutboxError> {
        use std::os::unix::fs::PermissionsExt;
        // Small cache: the working set is the unsent reports, and RSS matters on every node.
        // Wrapped at once: a redb panic below drops it while unwinding, and a second panic in
        // its closing commit would abort the process.
        let db = kudos_common::damaged_file::ClosingDatabase::new(
            redb::Builder::new()
                .set_cache_size(4 << 20)
                .set_check_integrity_on_open(true)
                .create(file)?,
        );
        std::fs::set_permissions(file, std::fs::Permissions::from_mode(0o600))
            .map_err(io_error(file))?;
        let txn = db.begin_write()?;
        let depth = {
            let reports = txn.open_table(REPORTS)?;
            for entry in reports.iter()? {
                entry?;
            }
            txn.open_table(IDS)?;
            txn.open_table(SNAPSHOTS)?;
            txn.open_table(META)?;
            for entry in txn.open_table(ACTIVE)?.iter()? {
                entry?;
            }
            reports.len()?
        };
        txn.commit()?;
        Ok(Self {
            db,
            max_reports: max_reports.max(1),
            depth: AtomicU64::new(depth),
            notify: tokio::sync::Notify::new(),
            recovered: None,
        })
    }

    /// Why the file found at open was damaged and set aside, if it was.
    pub fn recovered(&self) -> Option<&str> {
        self.recovered.as_deref()
    }

    /// Reports waiting for an acknowledgement.
    pub fn depth(&self) -> u64 {
        self.depth.load(Ordering::Relaxed)
    }

    /// The capacity in reports.
    pub fn capacity(&self) -> u64 {
        self.max_reports
    }

    /// Resolves after the next push that stored something (or at once if one happened since the
    /// last call: a single consumer, the sender, waits here).
    pub async fn changed(&self) {
        self.notify.notified().await;
    }

    fn begin(&self) -> Result<redb::WriteTransaction, OutboxError> {
        let mut txn = self.db.begin_write()?;
        txn.set_durability(Durability::Immediate)?;
        Ok(txn)
    }

    /// Stores `reports` durably (one commit); see [`PushOutcome`] for what happens when full.
    pub fn push(&self, reports: &[RunReport]) -> Result<PushOutcome, OutboxError> {
        guarded(|| {
            let txn = self.begin()?;
            let out = self.push_in(&txn, reports)?;
            txn.commit()?;
            self.after_write(&out);
            Ok(out)
        })
    }

    fn after_write(&self, out: &PushOutcome) {
        if let Ok(n) = self.count() {
            self.depth.store(n, Ordering::Relaxed);
        }
        if out.stored > 0 {
            self.notify.notify_one();
        }
    }

    fn count(&self) -> Result<u64, OutboxError> {
        guarded(|| Ok(self.db.begin_read()?.open_table(REPORTS)?.len()?))
    }

    fn push_in(
        &self,
        txn: &redb::WriteTransaction,
        reports: &[RunReport],
    ) -> Result<PushOutcome, OutboxError> {
        let mut out = PushOutcome::default();
        let mut table = txn.open_table(REPORTS)?;
        let mut ids = txn.open_table(IDS)?;
        let mut snaps = txn.open_table(SNAPSHOTS)?;
        let mut meta = txn.open_table(META)?;
        let mut next = meta.get(NEXT_SEQ)?.map(|v| v.value()).unwrap_or(0);
        for r in reports {
            if ids.get(r.report_id.as_str())?.is_some() {
                out.duplicates += 1;
                continue;
            }
            if table.len()? >= self.max_reports {
                // Make room with the oldest snapshot, if there is one.
                let oldest = snaps.first()?.map(|(k, _)| k.value());
                match oldest {
                    Some(seq) => {
                        snaps.remove(seq)?;
                        if let Some(old) = table.remove(seq)? {
                            let id = RunReport::decode(old.value())
                                .map(|o| o.report_id)
                                .unwrap_or_default();
                            drop(old);
                            ids.remove(id.as_str())?;
                            out.dropped_snapshots.push(id);
                        }
                    }
                    None if is_snapshot(r) => {
                        out.dropped_snapshots.push(r.report_id.clone());
                        continue;
                    }
                    None => {
                        out.refused.push(r.clone());
                        continue;
                    }
                }
            }
            let seq = next;
            next += 1;
            table.insert(seq, r.encode_to_vec().as_slice())?;
            ids.insert(r.report_id.as_str(), seq)?;
            if is_snapshot(r) {
                snaps.insert(seq, ())?;
            }
            out.stored += 1;
        }
        meta.insert(NEXT_SEQ, next)?;
        Ok(out)
    }

    /// Stores `make()`'s reports unless a previous call with the same `flag` already did (in the
    /// same commit as the flag, so a crash never generates them twice).
    pub fn push_once(
        &self,
        flag: &str,
        make: impl FnOnce() -> Vec<RunReport>,
    ) -> Result<Option<PushOutcome>, OutboxError> {
        guarded(|| {
            let txn = self.begin()?;
            let key = format!("{SYNTHETIC_DONE}/{flag}");
            if txn.open_table(META)?.get(key.as_str())?.is_some() {
                return Ok(None);
            }
            let out = self.push_in(&txn, &make())?;
            txn.open_table(META)?.insert(key.as_str(), 1)?;
            txn.commit()?;
            self.after_write(&out);
            Ok(Some(out))
        })
    }

    /// Up to `limit` reports with sequence numbers above `after`, oldest first.
    pub fn pending(
        &self,
        after: Option<u64>,
        limit: usize,
    ) -> Result<Vec<(u64, RunReport)>, OutboxError> {
        guarded(|| {
            let txn = self.db.begin_read()?;
            let table = txn.open_table(REPORTS)?;
            let start = after.map_or(0, |a| a.saturating_add(1));
            let mut out = Vec::with_capacity(limit.min(1024));
            for entry in table.range(start..)?.take(limit) {
                let (k, v) = entry?;
                match RunReport::decode(v.value()) {
                    Ok(r) => out.push((k.value(), r)),
                    Err(e) => {
                        tracing::error!(seq = k.value(), error = %e, "undecodable report in the outbox; skipped")
                    }
                }
            }
            Ok(out)
        })
    }

    /// Removes acknowledged reports; unknown IDs are ignored. Returns how many were removed.
    pub fn ack<S: AsRef<str>>(&self, report_ids: &[S]) -> Result<usize, OutboxError> {
        guarded(|| {
            let txn = self.begin()?;
            let mut n = 0;
            {
                let mut table = txn.open_table(REPORTS)?;
                let mut ids = txn.open_table(IDS)?;
                let mut snaps = txn.open_table(SNAPSHOTS)?;
                for id in report_ids {
                    let seq = ids.remove(id.as_ref())?.map(|v| v.value());
                    if let Some(seq) = seq {
                        table.remove(seq)?;
                        snaps.remove(seq)?;
                        n += 1;
                    }
                }
            }
            txn.commit()?;
            if let Ok(c) = self.count() {
                self.depth.store(c, Ordering::Relaxed);
            }
            Ok(n)
        })
    }

    /// Replaces the saved state of active runs.
    pub fn save_active(&self, runs: &[RunReport]) -> Result<(), OutboxError> {
        guarded(|| {
            let txn = self.begin()?;
            {
                let mut t = txn.open_table(ACTIVE)?;
                t.retain(|_, _| false)?;
                for r in runs {
                    t.insert(r.run_id.as_str(), r.encode_to_vec().as_slice())?;
                }
            }
            txn.commit()?;
            Ok(())
        })
    }

    /// The saved state of runs that were active when the agent last stopped.
    pub fn load_active(&self) -> Result<Vec<RunReport>, OutboxError> {
        guarded(|| {
            let txn = self.db.begin_read()?;
            let t = txn.open_table(ACTIVE)?;
            let mut out = Vec::new();
            for entry in t.iter()? {
                let (_, v) = entry?;
                if let Ok(r) = RunReport::decode(v.value()) {
                    out.push(r);
                }
            }
            Ok(out)
        })
    }
}

#[cfg(test)]
mod tests;
