//! How a `SqliteStore` is opened.

use idem_core::{Clock, Error, Field, SystemClock};
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

/// SQLite's `synchronous` setting, which trades durability for write latency.
///
/// With WAL (which the store always uses), [`Synchronous::Normal`] never corrupts the database
/// and survives a crash of the application, but a power loss or OS crash may lose the last
/// transactions; [`Synchronous::Full`] survives those too, at the cost of an fsync per commit.
/// A lost completion is lost with its effect (they share a transaction), so the retry runs the
/// effect once: no double effect either way.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
#[non_exhaustive]
pub enum Synchronous {
    /// No syncs at all: fastest, not durable across power loss.
    Off,
    /// Sync at checkpoints (the default; durable across application crashes).
    #[default]
    Normal,
    /// Sync every commit.
    Full,
    /// Like `Full`, and sync the directory too.
    Extra,
}

impl Synchronous {
    pub(crate) fn pragma_value(self) -> &'static str {
        match self {
            Synchronous::Off => "OFF",
            Synchronous::Normal => "NORMAL",
            Synchronous::Full => "FULL",
            Synchronous::Extra => "EXTRA",
        }
    }
}

/// Settings of a [`SqliteStore`](crate::SqliteStore), set through
/// [`SqliteStore::builder`](crate::SqliteStore::builder).
#[derive(Debug, Clone)]
pub(crate) struct SqliteConfig {
    pub(crate) path: PathBuf,
    pub(crate) table: String,
    /// Reader connections (the writer is one more).
    pub(crate) readers: usize,
    pub(crate) busy_timeout: Duration,
    pub(crate) synchronous: Synchronous,
    pub(crate) clock: Arc<dyn Clock>,
    /// Whether opening creates the file and applies the migrations (else both must exist).
    pub(crate) migrate: bool,
    /// Whether the store is opened for one commit (C15): the only store reserving in its table.
    pub(crate) one_commit: bool,
    /// The files the store opened, which its path must still name while it runs (set at open).
    pub(crate) opened: Option<crate::opened::OpenedFiles>,
}

impl SqliteConfig {
    pub(crate) fn new(path: PathBuf) -> Self {
        Self {
            path,
            table: "idem_records".to_owned(),
            readers: 4,
            busy_timeout: Duration::from_secs(5),
            synchronous: Synchronous::Normal,
            clock: Arc::new(SystemClock),
            migrate: true,
            one_commit: false,
            opened: None,
        }
    }
}

/// Accepts a plain SQL identifier: an ASCII letter or `_`, then letters, digits or `_`, at most
/// 63 bytes in all, and not starting with `sqlite_` (reserved). Anything else could inject SQL
/// through configuration and is [`Error::InvalidInput`].
///
/// ```
/// use idem_sqlite::validate_table_name;
/// assert!(validate_table_name("idem_records").is_ok());
/// assert!(validate_table_name("records; DROP TABLE charges").is_err());
/// assert!(validate_table_name("sqlite_master").is_err());
/// ```
pub fn validate_table_name(name: &str) -> Result<(), Error> {
    let mut bytes = name.bytes();
    let first_ok = bytes
        .next()
        .is_some_and(|b| b.is_ascii_alphabetic() || b == b'_');
    let rest_ok = bytes.all(|b| b.is_ascii_alphanumeric() || b == b'_');
    if !first_ok || !rest_ok || name.len() > 63 {
        return Err(Error::invalid(
            Field::Config,
            format!("table name {name:?} is not a plain identifier ([A-Za-z_][A-Za-z0-9_]*, at most 63 bytes)"),
        ));
    }
    if name.to_ascii_lowercase().starts_with("sqlite_") {
        return Err(Error::invalid(
            Field::Config,
            "table names starting with sqlite_ are reserved",
        ));
    }
    Ok(())
}
