//! The files a store opened, which its path must still name while it runs.

use idem_core::Error;
use std::path::{Path, PathBuf};

/// The database file a store opened, its `-wal` and its `-shm`, by identity (device and
/// inode). An operator who deletes or replaces them while the store runs leaves its connections
/// on files other processes do not share: a key reserved there would run a second time on the
/// files at the path. Every write step first checks that the path still names them (one
/// `stat` each).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct OpenedFiles {
    database: PathBuf,
    id: (u64, u64),
    /// The `-wal` as it was at open, if there was one: SQLite removes it only when the last
    /// connection closes, never while this store has its own open.
    wal: Option<(u64, u64)>,
    /// The `-shm` as it was at open, if there was one (removed like the `-wal`): it holds the
    /// WAL's locks and index, so a process with another one neither waits for this store's
    /// writes nor sees them.
    shm: Option<(u64, u64)>,
}

impl OpenedFiles {
    /// The files at `database` now; `None` where identities are not known (no file, or not
    /// Unix): nothing is checked then.
    pub(crate) fn of(database: &Path) -> Option<Self> {
        Some(Self {
            database: database.to_path_buf(),
            id: file_id(database)?,
            wal: file_id(&beside(database, "-wal")),
            shm: file_id(&beside(database, "-shm")),
        })
    }

    /// Whether the path still names the files opened; a misconfigured store error if not.
    pub(crate) fn still_named(&self) -> Result<(), Error> {
        let kept = |opened: Option<(u64, u64)>, suffix: &str| {
            opened.is_none() || file_id(&beside(&self.database, suffix)) == opened
        };
        let database_kept = file_id(&self.database) == Some(self.id);
        if database_kept && kept(self.wal, "-wal") && kept(self.shm, "-shm") {
            return Ok(());
        }
        Err(Error::store(
            crate::error::BACKEND,
            idem_core::StoreErrorKind::Misconfigured,
            format!(
                "{} (or its -wal or -shm) was deleted or replaced while this store had it \
                 open: it writes nothing more there, as other processes would not see it; \
                 restart the process on the files at the path",
                self.database.display()
            ),
        ))
    }
}

fn beside(database: &Path, suffix: &str) -> PathBuf {
    let mut name = database.as_os_str().to_owned();
    name.push(suffix);
    PathBuf::from(name)
}

#[cfg(unix)]
fn file_id(path: &Path) -> Option<(u64, u64)> {
    use std::os::unix::fs::MetadataExt;
    std::fs::metadata(path).ok().map(|m| (m.dev(), m.ino()))
}

#[cfg(not(unix))]
fn file_id(_path: &Path) -> Option<(u64, u64)> {
    None
}
