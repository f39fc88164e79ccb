//! Which processes reserve in a table: a lock file beside the database, one per table.
//!
//! A one-commit execution (C15) keeps its reservation uncommitted until its effect commits.
//! Readers do not see it, so a duplicate from another process would queue for SQLite's write
//! lock until that transaction ends, which C5 forbids. Only the engine of the process that runs
//! the transaction can keep duplicates away (its in-process claims), so a store opened for one
//! commit holds the table's lock file exclusively for its whole life, and every other store
//! holds it shared from its first reservation on: the two refuse each other, with an error that
//! says why, instead of one of them waiting. Stores that never reserve (the `idem` command's
//! inspection, listing and purge) take no lock.
//!
//! The locks are `flock` locks (`File::try_lock`), held by the open file: two stores of one
//! process refuse each other as two processes do, and the system drops a lock when its process
//! dies. The lock file is never removed (removing it would let a new store lock a new file
//! while an old one still holds the removed one).

use crate::config::SqliteConfig;
use crate::error::BACKEND;
use idem_core::{Error, StoreErrorKind};
use std::fs::{File, OpenOptions, TryLockError};
use std::path::{Path, PathBuf};
use std::sync::OnceLock;

/// A store's hold on its table's lock file.
#[derive(Debug)]
pub(crate) struct ProcessLock {
    /// `None` for a database that is no file (in memory, temporary): it takes no lock (and
    /// cannot be opened for one commit).
    path: Option<PathBuf>,
    /// Held since the store opened, for one commit.
    exclusive: Option<File>,
    /// Taken at the first reservation of a store that is not opened for one commit (a refusal
    /// is not remembered: the next reservation tries again, once the table is free).
    shared: OnceLock<File>,
}

impl ProcessLock {
    /// The lock of `config`'s table: beside the file the store's path names, or, for a name
    /// that is no path (a `file:` URI), beside `opened`, the file SQLite opened (`None`: in
    /// memory, temporary), so that two names of one file share a lock; taken exclusively now
    /// if the store is opened for one commit (never on a `read_only` connection, which could
    /// not reserve), else shared at the first reservation ([`reserving`](Self::reserving)).
    pub(crate) fn open(
        config: &SqliteConfig,
        opened: Option<&Path>,
        read_only: bool,
    ) -> Result<Self, Error> {
        let table_lock = lock_path(&config.path, &config.table)
            .ok()
            .or_else(|| opened.and_then(|opened| lock_path(opened, &config.table).ok()));
        let (path, exclusive) = if config.one_commit {
            let Some(path) = table_lock.filter(|_| !read_only) else {
                return Err(refused(format!(
                    "cannot open {} for one commit: it is read-only or no file (one commit \
                     keeps other stores out of its table by a lock file beside the database)",
                    config.path.display()
                )));
            };
            let file = lock_file(&path)?;
            let exclusive = match file.try_lock() {
                Ok(()) => Some(file),
                Err(TryLockError::WouldBlock) => {
                    return Err(refused(format!(
                        "cannot open table {} of {} for one commit: another store (in this \
                         process or another) reserves in it; a store opened for one commit \
                         must be the only one that reserves in its table (lock file {})",
                        config.table,
                        config.path.display(),
                        path.display()
                    )))
                }
                Err(TryLockError::Error(error)) => return Err(io(&path, &error)),
            };
            (Some(path), exclusive)
        } else {
            (table_lock, None)
        };
        Ok(Self {
            path,
            exclusive,
            shared: OnceLock::new(),
        })
    }

    /// Before a reservation: `Ok` if this store may reserve in its table (it holds the lock
    /// exclusively, or could take it shared); an error if a store opened for one commit holds
    /// the table.
    pub(crate) fn reserving(&self) -> Result<(), Error> {
        if self.exclusive.is_some() || self.shared.get().is_some() {
            return Ok(());
        }
        let Some(path) = &self.path else {
            return Ok(());
        };
        let file = lock_file(path)?;
        match file.try_lock_shared() {
            Ok(()) => {
                // Two first reservations at once may both lock: one file is kept, the other
                // closed (each holds its own shared lock, so the kept one still does).
                let _ = self.shared.set(file);
                Ok(())
            }
            Err(TryLockError::WouldBlock) => Err(refused(format!(
                "another store holds this table for one commit (C15) and must be the only one \
                 that reserves in it; open this one for one commit instead of it, or open that \
                 one for two (lock file {})",
                path.display()
            ))),
            Err(TryLockError::Error(error)) => Err(io(path, &error)),
        }
    }

    /// Whether the store holds its table for one commit.
    pub(crate) fn one_commit(&self) -> bool {
        self.exclusive.is_some()
    }
}

/// `<database file>.<table>.idem-lock` beside the database file, from the file's canonical
/// path (a symbolic link or a relative path names the same lock) and the table's name in
/// lower case (SQLite's names ignore case). The database file exists: the store opened it.
fn lock_path(database: &Path, table: &str) -> Result<PathBuf, Error> {
    let database = database
        .canonicalize()
        .map_err(|error| io(database, &error))?;
    Ok(named_beside(&database, table))
}

fn named_beside(database: &Path, table: &str) -> PathBuf {
    let mut name = database
        .file_name()
        .map(|name| name.to_os_string())
        .unwrap_or_default();
    name.push(format!(".{}.idem-lock", table.to_ascii_lowercase()));
    database.with_file_name(name)
}

fn lock_file(path: &Path) -> Result<File, Error> {
    OpenOptions::new()
        .read(true)
        .write(true)
        .create(true)
        .truncate(false)
        .open(path)
        .map_err(|error| io(path, &error))
}

fn io(path: &Path, error: &std::io::Error) -> Error {
    Error::store(
        BACKEND,
        StoreErrorKind::Unavailable,
        format!("cannot lock {}: {error}", path.display()),
    )
}

fn refused(reason: String) -> Error {
    Error::store(BACKEND, StoreErrorKind::Misconfigured, reason)
}

#[cfg(test)]
mod tests {
    use super::{lock_path, named_beside};
    use std::path::Path;

    #[test]
    fn the_lock_file_is_beside_the_database_and_names_the_table() {
        assert_eq!(
            named_beside(Path::new("/srv/shop/idem.db"), "idem_records"),
            Path::new("/srv/shop/idem.db.idem_records.idem-lock")
        );
        assert_eq!(
            named_beside(Path::new("/srv/shop/idem.db"), "IDEM_Records"),
            Path::new("/srv/shop/idem.db.idem_records.idem-lock"),
            "SQLite's table names ignore case"
        );
    }

    #[cfg(unix)]
    #[test]
    fn a_symbolic_link_names_the_same_lock() {
        let dir = tempfile::tempdir().expect("dir");
        let real = dir.path().join("real.db");
        std::fs::write(&real, b"").expect("file");
        let alias = dir.path().join("alias.db");
        std::os::unix::fs::symlink(&real, &alias).expect("link");
        assert_eq!(
            lock_path(&alias, "t").expect("alias"),
            lock_path(&real, "t").expect("real")
        );
    }
}
