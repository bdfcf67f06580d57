//! What the two embedded redb stores (the orchestrator's file store and the node agent's
//! outbox) do with a file damaged outside redb: decide that it is damaged, catch redb's panics
//! on it, and move it aside so the process starts with an empty store instead of crash-looping.

use std::path::{Path, PathBuf};

/// Whether redb's error says the file itself is damaged, as opposed to permissions, a full
/// disk or another process holding it. Our tables always have the same types, so a file that
/// says otherwise is damaged too (found by fuzzing: a patched table header made the open fail
/// for good). So is a header that claims redb's file format 1 or 2 ("upgrade required"):
/// Kudos has only ever written format 3 (redb 4), so such a byte is damage, not an old file
/// (found by fuzzing too: one flipped version byte stopped the orchestrator for good).
pub fn is_damage(e: &redb::Error) -> bool {
    match e {
        redb::Error::Corrupted(_)
        | redb::Error::RepairAborted
        | redb::Error::TableTypeMismatch { .. }
        | redb::Error::TableIsMultimap(_)
        | redb::Error::TableIsNotMultimap(_)
        | redb::Error::TypeDefinitionChanged { .. }
        | redb::Error::UpgradeRequired(_) => true,
        redb::Error::Io(io) => matches!(
            io.kind(),
            std::io::ErrorKind::InvalidData | std::io::ErrorKind::UnexpectedEof
        ),
        _ => false,
    }
}

/// Calls `f`; a panic inside it (redb panics on some damaged pages) becomes `damaged(message)`.
pub fn catch_panic<T, E>(
    f: impl FnOnce() -> Result<T, E>,
    damaged: impl FnOnce(String) -> E,
) -> Result<T, E> {
    std::panic::catch_unwind(std::panic::AssertUnwindSafe(f)).unwrap_or_else(|p| {
        let msg = p
            .downcast_ref::<&str>()
            .map(|s| (*s).to_owned())
            .or_else(|| p.downcast_ref::<String>().cloned())
            .unwrap_or_else(|| "panic without a message".into());
        Err(damaged(msg))
    })
}

/// A redb database whose closing cannot take the process down. redb commits once more when a
/// database is dropped (it saves its allocator state), and on a damaged file that commit can
/// fail one of redb's assertions: a panic at shutdown, or wherever the last handle goes, with
/// nothing to catch it (found by fuzzing: a file that opened and loaded, then panicked in
/// `Drop`). This catches it and logs it instead.
pub struct ClosingDatabase(Option<redb::Database>);

impl ClosingDatabase {
    /// Takes ownership of `db`.
    pub fn new(db: redb::Database) -> Self {
        Self(Some(db))
    }
}

impl std::ops::Deref for ClosingDatabase {
    type Target = redb::Database;

    fn deref(&self) -> &redb::Database {
        match &self.0 {
            Some(db) => db,
            // Only `drop` takes it out, and nothing derefs after that.
            None => unreachable!("a ClosingDatabase is used after it was dropped"),
        }
    }
}

impl Drop for ClosingDatabase {
    fn drop(&mut self) {
        if let Some(db) = self.0.take()
            && let Err(why) = catch_panic(
                || {
                    drop(db);
                    Ok(())
                },
                |m| m,
            )
        {
            tracing::error!(error = %why, "closing the store file failed inside redb; the file may be damaged and is checked at the next open");
        }
    }
}

/// Renames `path` to `<path>.damaged-<unix seconds>` (kept for inspection); returns the new path.
pub fn move_aside(path: &Path) -> std::io::Result<PathBuf> {
    let secs = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs());
    let mut aside = path.as_os_str().to_owned();
    aside.push(format!(".damaged-{secs}"));
    let aside = PathBuf::from(aside);
    std::fs::rename(path, &aside)?;
    Ok(aside)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_caught_panic_keeps_its_message() {
        let r: Result<(), String> =
            catch_panic(|| panic!("page {}", 7), |m| format!("damaged: {m}"));
        assert_eq!(r, Err("damaged: page 7".into()));
        let r: Result<u8, String> = catch_panic(|| Ok(1), |m| m);
        assert_eq!(r, Ok(1));
    }

    #[test]
    fn damage_is_told_from_other_failures() {
        assert!(is_damage(&redb::Error::Corrupted("x".into())));
        assert!(is_damage(&redb::Error::TableIsMultimap("runs".into())));
        assert!(is_damage(&redb::Error::UpgradeRequired(1)));
        assert!(!is_damage(&redb::Error::DatabaseAlreadyOpen));
        let denied = std::io::Error::from(std::io::ErrorKind::PermissionDenied);
        assert!(!is_damage(&redb::Error::Io(denied)));
    }

    #[test]
    fn moved_aside_keeps_the_file() {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("s.redb");
        std::fs::write(&path, b"x").expect("write");
        let aside = move_aside(&path).expect("rename");
        assert!(!path.exists());
        assert!(aside.to_string_lossy().contains("s.redb.damaged-"));
        assert_eq!(std::fs::read(aside).expect("read"), b"x");
    }
}
