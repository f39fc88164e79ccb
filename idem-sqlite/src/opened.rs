//! The files a store opened, which its path must still name while it runs.

use idem_core::Error;
use std::path::{Path, PathBuf};

/// The database file a store opened and its `-wal`, by identity (device and inode). An operator
/// who deletes or replaces them while the store runs leaves its connections on files no other
/// process opens: a key reserved there would run a second time on the file at the path. Every
/// write step first checks that the path still names them (one `stat` each).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct OpenedFiles {
    database: PathBuf,
    id: (u64, u64),
    /// The `-wal` as it was at open, if there was one: SQLite removes it only when the last
    /// connection closes, never while this store has its own open.
    wal: Option<(u64, u64)>,
}

impl OpenedFiles {
    /// The files at `database` now; `None` where identities are not known (no file, or not
    /// Unix): nothing is checked then.
    pub(crate) fn of(database: &Path) -> Option<Self> {
        Some(Self {
            database: database.to_path_buf(),
            id: file_id(database)?,
            wal: file_id(&wal_of(database)),
        })
    }

    /// Whether the path still names the files opened; a misconfigured store error if not.
    pub(crate) fn still_named(&self) -> Result<(), Error> {
        let wal = file_id(&wal_of(&self.database));
        let database_kept = file_id(&self.database) == Some(self.id);
        let wal_kept = self.wal.is_none() || wal == self.wal;
        if database_kept && wal_kept {
            return Ok(());
        }
        Err(Error::store(
            crate::error::BACKEND,
            idem_core::StoreErrorKind::Misconfigured,
            format!(
                "{} (or its -wal) was deleted or replaced while this store had it open: it \
                 writes nothing more there, as no other process would see it; restart the \
                 process on the file at the path",
                self.database.display()
            ),
        ))
    }
}

fn wal_of(database: &Path) -> PathBuf {
    let mut name = database.as_os_str().to_owned();
    name.push("-wal");
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
