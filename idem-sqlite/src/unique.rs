//! The unique-constraint alternative: an idempotent create without an idempotency table, when
//! the resource already has an identifier the client chooses (an order number, a partner
//! reference). See [`insert_or_fetch`] and the repository's docs/unique-constraint.md.

use crate::error::{store_error, BACKEND};
use idem_core::store::existing_row;
use idem_core::store::unresolved_insert_or_fetch;
use idem_core::Begin;
use idem_core::Error;
use rusqlite::Connection;

/// How often the INSERT is tried when it inserts nothing and the fetch finds no row either.
const ATTEMPTS: usize = 3;

/// Creates a row once under a unique constraint, or fetches the row that is already there.
///
/// The unique constraint on the client's identifier (an order number, a partner reference)
/// makes the create happen once however often the request arrives, and every later attempt
/// gets the row that exists, so the handler answers the same body again and can tell a retry
/// from the identifier reused with other parameters. There is nothing to expire and nothing to
/// purge; but nothing except the row is remembered: the answer is rebuilt from it, and a
/// request that failed (a 4xx, a decline) is not remembered at all. The repository's
/// docs/unique-constraint.md compares this with the idempotency table and says when each fits.
///
/// - `insert` runs the caller's `INSERT .. ON CONFLICT (key) DO NOTHING RETURNING ..` (with
///   `query_row(..).optional()`): `Some(row)` if it inserted, `None` if the key's constraint
///   was already taken. Name the key in the conflict target: a bare `ON CONFLICT DO NOTHING`
///   would also swallow another constraint's violation.
/// - `fetch` runs the caller's `SELECT .. WHERE key = ..` for the existing row.
/// - `same_request` compares the existing row with what this request asked for (the
///   parameters stored on the row, or a fingerprint of the request stored in a column): `true`
///   is a retry (the row replayed, [`Answer::Replay`](idem_core::Answer::Replay)), `false` a
///   reuse of the identifier ([`Answer::Mismatch`](idem_core::Answer::Mismatch)). It is not
///   asked about a row this request inserted ([`Begin::Acquired`]).
///
/// Run it in a write transaction (`TransactionBehavior::Immediate`) that also holds the rest of
/// the create, and commit after: SQLite's single writer then makes it race-free (see below).
/// Outside a transaction it still works: if the row is deleted between the INSERT and the
/// fetch, the INSERT runs again.
///
/// `POST /orders` with a partner reference: 201 the first time, 200 with the same body for every
/// retry, 422 when the reference comes back with another amount.
///
/// ```
/// use idem_sqlite::rusqlite::{self, params, Connection, OptionalExtension, Row, TransactionBehavior};
/// use idem_sqlite::{insert_or_fetch, SqliteStore};
/// use idem_core::{Answer, Begin};
///
/// struct Order { id: i64, partner_ref: String, cents: i64 }
///
/// impl Order {
///     fn from_row(row: &Row<'_>) -> rusqlite::Result<Self> {
///         Ok(Order { id: row.get(0)?, partner_ref: row.get(1)?, cents: row.get(2)? })
///     }
///     /// The body is rendered from the row alone, so every answer about it is the same bytes
///     /// (serde_json in a real service; references are `[A-Za-z0-9-]` here).
///     fn to_json(&self) -> String {
///         format!(r#"{{"id":{},"partner_ref":"{}","cents":{}}}"#, self.id, self.partner_ref, self.cents)
///     }
/// }
///
/// type BoxError = Box<dyn std::error::Error + Send + Sync>;
///
/// /// `POST /orders`: the status and the body.
/// fn create_order(db: &mut Connection, partner_ref: &str, cents: i64) -> Result<(u16, String), BoxError> {
///     let tx = db.transaction_with_behavior(TransactionBehavior::Immediate)?;
///     let created = insert_or_fetch(
///         &tx,
///         |db| db.query_row(
///             "INSERT INTO orders (partner_ref, cents) VALUES (?1, ?2) \
///              ON CONFLICT (partner_ref) DO NOTHING RETURNING id, partner_ref, cents",
///             params![partner_ref, cents],
///             Order::from_row,
///         ).optional(),
///         |db| db.query_row(
///             "SELECT id, partner_ref, cents FROM orders WHERE partner_ref = ?1",
///             params![partner_ref],
///             Order::from_row,
///         ).optional(),
///         |order| order.cents == cents, // the same request, or the reference reused?
///     )?;
///     tx.commit()?;
///     Ok(match created {
///         Begin::Acquired(order) => (201, order.to_json()),
///         Begin::Answered(Answer::Replay(order)) => (200, order.to_json()),
///         Begin::Answered(_) => (422, r#"{"error":"partner_ref was used for another order"}"#.into()),
///     })
/// }
///
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> Result<(), BoxError> {
/// # let dir = tempfile::tempdir()?;
/// let store = SqliteStore::open(dir.path().join("shop.db")).await?;
/// store.try_call(|db| db.execute_batch(
///     "CREATE TABLE orders (id INTEGER PRIMARY KEY, partner_ref TEXT NOT NULL UNIQUE, cents INTEGER NOT NULL)",
/// )).await?;
///
/// let first = store.call(|db| create_order(db, "PO-1001", 2500)).await??;
/// let retry = store.call(|db| create_order(db, "PO-1001", 2500)).await??;
/// let reused = store.call(|db| create_order(db, "PO-1001", 9900)).await??;
/// assert_eq!(first, (201, r#"{"id":1,"partner_ref":"PO-1001","cents":2500}"#.to_string()));
/// assert_eq!(retry, (200, first.1.clone())); // the same body
/// assert_eq!(reused.0, 422);
/// # Ok(())
/// # }
/// ```
///
/// # Why `INSERT .. ON CONFLICT (key) DO NOTHING RETURNING ..`
///
/// The INSERT names the key's constraint in its conflict target, so SQLite itself decides which
/// violation is a duplicate: a conflict on the key inserts nothing and returns no row, and any
/// other violation (a unique email, a `CHECK`, a foreign key) is still an error. Catching the
/// error of a plain INSERT would work in SQLite (a failed statement does not abort the
/// transaction), but its extended code `SQLITE_CONSTRAINT_UNIQUE` does not say which constraint
/// failed: only the message's text does. It is also the form PostgreSQL needs
/// (`idem_postgres::insert_or_fetch`), so the SQL reads the same on both.
///
/// It is race-free because SQLite has one writer: with the INSERT and the fetch in one write
/// transaction (`TransactionBehavior::Immediate`; on the store's writer through
/// [`SqliteStore::call`](crate::SqliteStore::call) as well, since other connections and
/// processes may write the same file), no other connection can insert, change or delete the
/// row between them. A concurrent duplicate waits for the write lock (the store's queue, or the
/// busy timeout on a connection of its own), then finds the row committed. `RETURNING` needs
/// SQLite 3.35 or newer; the bundled SQLite (feature `bundled`, on by default) is.
///
/// # Errors
///
/// Errors of `insert` and `fetch` become [`Error::Store`] (backend `sqlite`) the way the store's
/// own do, with the rusqlite error as the source: another constraint's violation is one, and
/// [`unique_violation`] tells which columns. If the INSERT inserts nothing and the fetch finds
/// nothing three times, the conflict target and the fetch do not describe the same key (or
/// the ON CONFLICT clause is missing its target): a [`StoreErrorKind::Misconfigured`](idem_core::StoreErrorKind::Misconfigured) error.
pub fn insert_or_fetch<T, I, F, S>(
    conn: &Connection,
    mut insert: I,
    mut fetch: F,
    same_request: S,
) -> Result<Begin<T, T>, Error>
where
    I: FnMut(&Connection) -> rusqlite::Result<Option<T>>,
    F: FnMut(&Connection) -> rusqlite::Result<Option<T>>,
    S: FnOnce(&T) -> bool,
{
    for _ in 0..ATTEMPTS {
        if let Some(row) = insert(conn).map_err(store_error)? {
            return Ok(Begin::Acquired(row));
        }
        if let Some(row) = fetch(conn).map_err(store_error)? {
            let same = same_request(&row);
            return Ok(existing_row(row, same));
        }
        // The conflicting row is gone (deleted by another connection between the two
        // statements, outside a transaction): the key is free again.
    }
    Err(unresolved_insert_or_fetch(BACKEND, ATTEMPTS))
}

/// If `error` is a unique or primary-key violation (`SQLITE_CONSTRAINT_UNIQUE`,
/// `SQLITE_CONSTRAINT_PRIMARYKEY`), what SQLite says failed: the columns, as `table.column`
/// (comma-separated when the constraint has several). For telling "this email is taken" (a 409
/// of your own) from a store failure after [`insert_or_fetch`] or any other call.
///
/// ```
/// use idem_sqlite::rusqlite::Connection;
/// use idem_sqlite::unique_violation;
/// let db = Connection::open_in_memory()?;
/// db.execute_batch("CREATE TABLE users (email TEXT UNIQUE); INSERT INTO users VALUES ('a@example.com')")?;
/// let taken = db.execute("INSERT INTO users VALUES ('a@example.com')", []).expect_err("a duplicate");
/// let error = idem_core::Error::store("sqlite", idem_core::StoreErrorKind::Other, taken);
/// assert_eq!(unique_violation(&error), Some("users.email"));
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
pub fn unique_violation(error: &Error) -> Option<&str> {
    let source = error
        .as_store()?
        .source_ref()
        .downcast_ref::<rusqlite::Error>()?;
    let rusqlite::Error::SqliteFailure(failure, message) = source else {
        return None;
    };
    if !matches!(
        failure.extended_code,
        rusqlite::ffi::SQLITE_CONSTRAINT_UNIQUE | rusqlite::ffi::SQLITE_CONSTRAINT_PRIMARYKEY
    ) {
        return None;
    }
    let message = message.as_deref().unwrap_or("");
    Some(
        message
            .strip_prefix("UNIQUE constraint failed: ")
            .unwrap_or(message),
    )
}
