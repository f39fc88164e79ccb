//! Opening connections with the store's settings.

use crate::config::SqliteConfig;
use crate::error::{is_busy, store_error};
use crate::migrate::{migrate, require_current};
use idem_core::{Error, Field};
use rusqlite::{Connection, OpenFlags};
use std::time::{Duration, Instant};

/// Opens one connection with the store's settings: WAL, busy timeout, synchronous. Without
/// migrations (`config.migrate` false) a file not in WAL mode is refused, not switched.
pub(crate) fn connect(config: &SqliteConfig) -> Result<Connection, Error> {
    let conn = if config.migrate {
        Connection::open(&config.path)
    } else {
        // Never creates the file: a mistyped path is an error, not a new empty database.
        Connection::open_with_flags(
            &config.path,
            OpenFlags::SQLITE_OPEN_READ_WRITE
                | OpenFlags::SQLITE_OPEN_URI
                | OpenFlags::SQLITE_OPEN_NO_MUTEX,
        )
    }
    .map_err(store_error)?;
    conn.busy_timeout(config.busy_timeout)
        .map_err(store_error)?;
    // Switching the journal mode needs an exclusive lock, so it is only asked for when the
    // file is not in WAL mode yet: opening must not fail while another process writes.
    let journal_mode = |sql: &str| -> Result<String, Error> {
        conn.query_row(sql, [], |row| row.get(0))
            .map_err(store_error)
    };
    let mut mode = journal_mode("PRAGMA journal_mode")?;
    if !config.migrate && !mode.eq_ignore_ascii_case("wal") {
        // Opening without migrations changes nothing, and switching to WAL is a write: an idem
        // store always puts its file in WAL mode, so this file is not one (a wrong path?).
        return Err(Error::invalid(
            Field::Config,
            format!(
                "{} is not a database an idem store has opened (journal mode {mode}; an idem store always puts its file in WAL mode); it was left unchanged",
                config.path.display()
            ),
        ));
    }
    if !mode.eq_ignore_ascii_case("wal") {
        mode = journal_mode("PRAGMA journal_mode = WAL")?;
    }
    if !mode.eq_ignore_ascii_case("wal") {
        return Err(Error::invalid(
            Field::Config,
            format!("{} cannot use WAL (journal mode {mode}); an in-memory database is not shared between connections", config.path.display()),
        ));
    }
    conn.pragma_update(None, "synchronous", config.synchronous.pragma_value())
        .map_err(store_error)?;
    Ok(conn)
}

/// Opens the writer, brings the schema up to date on it, then opens the readers. SQLite
/// answers "busy" without waiting when another process switches a new file to WAL at the same
/// moment, so a busy open is retried until the busy timeout has passed.
pub(crate) fn open_all(config: &SqliteConfig) -> Result<(Connection, Vec<Connection>), Error> {
    let started = Instant::now();
    loop {
        let attempt = || -> Result<(Connection, Vec<Connection>), Error> {
            let mut writer = connect(config)?;
            if config.migrate {
                migrate(&mut writer, &config.table)?;
            } else {
                require_current(&writer, &config.table)?;
            }
            let readers = (0..config.readers)
                .map(|_| connect(config).and_then(read_only))
                .collect::<Result<_, _>>()?;
            Ok((writer, readers))
        };
        match attempt() {
            Err(error) if is_busy(&error) && started.elapsed() < config.busy_timeout => {
                std::thread::sleep(Duration::from_millis(10));
            }
            result => return result,
        }
    }
}

/// Makes a reader connection `query_only`: the connections that answer replays never take
/// SQLite's write lock, whatever work an application hands them (C5).
pub(crate) fn read_only(conn: Connection) -> Result<Connection, Error> {
    conn.pragma_update(None, "query_only", true)
        .map_err(store_error)?;
    Ok(conn)
}

/// Puts a connection back in autocommit after a use: a caller's batch that failed half-way, or a
/// panic, can leave a transaction open, and the next caller would then read uncommitted data
/// and its writes would never commit. Returns the connection if it is clean, `None` if it
/// could not be cleaned (the pool then opens a new one).
pub(crate) fn clean(conn: Connection) -> Option<Connection> {
    if conn.is_autocommit() {
        return Some(conn);
    }
    tracing::warn!(target: "idem", "a SQLite connection came back inside a transaction; rolling back");
    match conn.execute_batch("ROLLBACK") {
        Ok(()) if conn.is_autocommit() => Some(conn),
        _ => None,
    }
}

/// `work` with another process's write lock waited for until `until` at most (C13), not for
/// the store's whole busy timeout: a write its caller gave up on at its deadline never lands
/// afterwards, nor holds the writer past it; one queued on the writer past its deadline does
/// not run. The busy timeout is the store's again after `work`, whose own steps may shorten it
/// further ([`wait_at_most`]).
pub(crate) fn waiting_until<T>(
    conn: &mut Connection,
    config: &SqliteConfig,
    until: Instant,
    work: impl FnOnce(&mut Connection) -> Result<T, Error>,
) -> Result<T, Error> {
    if let Some(opened) = &config.opened {
        opened.still_named()?;
    }
    wait_at_most(
        conn,
        config,
        until.saturating_duration_since(Instant::now()),
    )?;
    let result = work(conn);
    let _ = conn.busy_timeout(config.busy_timeout);
    result
}

/// Makes `conn` wait for another process's write lock `left` at most, when that is shorter
/// than the store's busy timeout; nothing left is unavailable, and nothing is run.
pub(crate) fn wait_at_most(
    conn: &Connection,
    config: &SqliteConfig,
    left: Duration,
) -> Result<(), Error> {
    if left.is_zero() {
        return Err(Error::store(
            crate::error::BACKEND,
            idem_core::StoreErrorKind::Unavailable,
            "the store call's deadline passed before SQLite's writer could start it",
        ));
    }
    if left < config.busy_timeout {
        conn.busy_timeout(left).map_err(store_error)?;
    }
    Ok(())
}
