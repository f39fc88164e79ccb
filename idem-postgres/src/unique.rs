//! The unique-constraint alternative: an idempotent create without an idempotency table, when
//! the resource already has an identifier the client chooses (an order number, a partner
//! reference). See [`insert_or_fetch`] and the repository's docs/unique-constraint.md.

use crate::error::{store_error, BACKEND};
use idem_core::store::existing_row;
use idem_core::store::unresolved_insert_or_fetch;
use idem_core::Begin;
use idem_core::Error;
use sqlx::postgres::{PgArguments, PgRow};
use sqlx::query::QueryAs;
use sqlx::{FromRow, PgConnection, Postgres};

/// How often the INSERT is tried when it inserts nothing and the fetch finds no row either.
const ATTEMPTS: usize = 3;

/// PostgreSQL's `unique_violation`.
const UNIQUE_VIOLATION: &str = "23505";

/// Creates a row once under a unique constraint, or fetches the row that is already there, in
/// the caller's transaction (or on a bare connection, each statement committing on its own).
///
/// The unique constraint on the client's identifier (an order number, a partner reference)
/// makes the create happen once however often the request arrives, and every later attempt
/// gets the row that exists, so the handler answers the same body again and can tell a retry
/// from the identifier reused with other parameters. There is nothing to expire and nothing to
/// purge; but nothing except the row is remembered: the answer is rebuilt from it, and a
/// request that failed (a 4xx, a decline) is not remembered at all. The repository's
/// docs/unique-constraint.md compares this with the idempotency table and says when each fits.
///
/// - `insert` builds the caller's `INSERT .. ON CONFLICT (key) DO NOTHING RETURNING ..`: a row
///   if it inserted, none if the key was already taken. Name the key in the conflict target: a
///   bare `ON CONFLICT DO NOTHING` would also swallow another constraint's violation.
/// - `fetch` builds the caller's `SELECT .. WHERE key = ..` for the existing row.
/// - `same_request` compares the existing row with what this request asked for (the
///   parameters stored on the row, or a fingerprint of the request stored in a column): `true`
///   is a retry (the row replayed, [`Answer::Replay`](idem_core::Answer::Replay)), `false` a
///   reuse of the identifier ([`Answer::Mismatch`](idem_core::Answer::Mismatch)). It is not
///   asked about a row this request inserted ([`Begin::Acquired`]).
///
/// `insert` and `fetch` build a query each time they are called
/// (`|| sqlx::query_as(..).bind(..)`): if the conflicting row is deleted between the two
/// statements, the INSERT runs again. One round trip for a new row, two for an existing one.
/// Why this form is race-free is below the example.
///
/// `POST /orders` with a partner reference: 201 the first time, 200 with the same body for every
/// retry, 422 when the reference comes back with another amount.
///
/// ```no_run
/// use idem_postgres::sqlx::{self, postgres::PgRow, FromRow, PgPool, Row};
/// use idem_postgres::insert_or_fetch;
/// use idem_core::{Answer, Begin};
///
/// // CREATE TABLE orders (id bigserial PRIMARY KEY, partner_ref text NOT NULL UNIQUE, cents bigint NOT NULL);
/// struct Order { id: i64, partner_ref: String, cents: i64 }
///
/// impl FromRow<'_, PgRow> for Order {
///     fn from_row(row: &PgRow) -> sqlx::Result<Self> {
///         Ok(Order { id: row.try_get("id")?, partner_ref: row.try_get("partner_ref")?, cents: row.try_get("cents")? })
///     }
/// }
///
/// impl Order {
///     /// The body is rendered from the row alone, so every answer about it is the same bytes
///     /// (serde_json in a real service; references are `[A-Za-z0-9-]` here).
///     fn to_json(&self) -> String {
///         format!(r#"{{"id":{},"partner_ref":"{}","cents":{}}}"#, self.id, self.partner_ref, self.cents)
///     }
/// }
///
/// /// `POST /orders`: the status and the body.
/// async fn create_order(pool: &PgPool, partner_ref: &str, cents: i64) -> Result<(u16, String), Box<dyn std::error::Error>> {
///     let mut tx = pool.begin().await?;
///     let created = insert_or_fetch(
///         &mut tx,
///         || sqlx::query_as(
///             "INSERT INTO orders (partner_ref, cents) VALUES ($1, $2) \
///              ON CONFLICT (partner_ref) DO NOTHING RETURNING id, partner_ref, cents",
///         ).bind(partner_ref).bind(cents),
///         || sqlx::query_as("SELECT id, partner_ref, cents FROM orders WHERE partner_ref = $1").bind(partner_ref),
///         |order: &Order| order.cents == cents, // the same request, or the reference reused?
///     ).await?;
///     // ... the rest of the create (order lines, an outbox message) in the same transaction ...
///     tx.commit().await?;
///     Ok(match created {
///         Begin::Acquired(order) => (201, order.to_json()),
///         Begin::Answered(Answer::Replay(order)) => (200, order.to_json()),
///         Begin::Answered(_) => (422, r#"{"error":"partner_ref was used for another order"}"#.into()),
///     })
/// }
///
/// # async fn demo() -> Result<(), Box<dyn std::error::Error>> {
/// let pool = PgPool::connect("postgres://app@localhost/shop").await?;
/// let first = create_order(&pool, "PO-1001", 2500).await?;  // (201, {"id":1,...})
/// let retry = create_order(&pool, "PO-1001", 2500).await?;  // (200, the same body)
/// assert_eq!(retry, (200, first.1.clone()));
/// assert_eq!(create_order(&pool, "PO-1001", 9900).await?.0, 422);
/// # Ok(())
/// # }
/// ```
///
/// # Why `INSERT .. ON CONFLICT (key) DO NOTHING RETURNING ..`, then `SELECT`
///
/// - **It keeps the caller's transaction alive.** A unique violation (SQLSTATE 23505) aborts
///   the whole transaction in PostgreSQL: catching it would need a savepoint around every
///   INSERT (two round trips more, and a subtransaction). `ON CONFLICT .. DO NOTHING` is not an
///   error: the INSERT returns no row and the transaction goes on to the `SELECT`.
/// - **It tells the key's conflict from any other.** The conflict target (`(partner_ref)` or
///   `ON CONSTRAINT orders_partner_ref_key`) names the key's constraint: a conflict there inserts
///   nothing, and another constraint's violation (a unique email) is still a 23505 error.
/// - **It is race-free.** When another transaction has inserted the same key and not committed
///   yet, the INSERT waits for it: if it commits, the INSERT does nothing and the `SELECT` (a new
///   snapshot at READ COMMITTED) reads its row; if it rolls back, the INSERT inserts. Two
///   creates of one key never both insert, and the second never sees "no row". At REPEATABLE
///   READ and SERIALIZABLE, a conflict with a row the transaction's snapshot cannot see is a
///   serialization failure instead ([`StoreErrorKind::TransactionConflict`](idem_core::StoreErrorKind::TransactionConflict)): retry the whole
///   transaction, and the retry reads the row.
///
/// A concurrent duplicate therefore waits for the first request's transaction to end (keep it
/// short) instead of being answered 409 at once as the idempotency table does.
///
/// # Errors
///
/// Errors of the two statements become [`Error::Store`] (backend `postgres`) the way the store's
/// own do, with the sqlx error as the source: a serialization failure or a deadlock is
/// [`StoreErrorKind::TransactionConflict`](idem_core::StoreErrorKind::TransactionConflict) (the transaction is lost: retry it whole), another
/// constraint's violation is [`StoreErrorKind::Other`](idem_core::StoreErrorKind::Other), and [`unique_violation`] names its
/// constraint. If the INSERT inserts nothing and the fetch finds nothing three times, the
/// conflict target and the fetch do not describe the same key (or the ON CONFLICT clause is
/// missing its target): a [`StoreErrorKind::Misconfigured`](idem_core::StoreErrorKind::Misconfigured) error.
pub async fn insert_or_fetch<'q, T, I, F, S>(
    conn: &mut PgConnection,
    mut insert: I,
    mut fetch: F,
    same_request: S,
) -> Result<Begin<T, T>, Error>
where
    T: for<'r> FromRow<'r, PgRow> + Send + Unpin,
    I: FnMut() -> QueryAs<'q, Postgres, T, PgArguments>,
    F: FnMut() -> QueryAs<'q, Postgres, T, PgArguments>,
    S: FnOnce(&T) -> bool,
{
    for _ in 0..ATTEMPTS {
        if let Some(row) = insert()
            .fetch_optional(&mut *conn)
            .await
            .map_err(store_error)?
        {
            return Ok(Begin::Acquired(row));
        }
        if let Some(row) = fetch()
            .fetch_optional(&mut *conn)
            .await
            .map_err(store_error)?
        {
            let same = same_request(&row);
            return Ok(existing_row(row, same));
        }
        // The conflicting row is gone (deleted and committed by another transaction between
        // the two statements): the key is free again.
    }
    Err(unresolved_insert_or_fetch(BACKEND, ATTEMPTS))
}

/// If `error` is a unique violation (SQLSTATE 23505), the name of the constraint it violated
/// (`users_email_key`), or `""` if the server did not say. For telling "this email is taken" (a
/// 409 of your own) from a store failure after [`insert_or_fetch`] or any other call.
///
/// ```no_run
/// use idem_postgres::{insert_or_fetch, unique_violation};
/// # async fn demo(conn: &mut sqlx::PgConnection, partner_ref: &str, email: &str) -> Result<(), idem_core::Error> {
/// let created = insert_or_fetch(
///     conn,
///     || sqlx::query_as::<_, (i64,)>(
///         "INSERT INTO orders (partner_ref, email) VALUES ($1, $2) ON CONFLICT (partner_ref) DO NOTHING RETURNING id",
///     ).bind(partner_ref).bind(email),
///     || sqlx::query_as("SELECT id FROM orders WHERE partner_ref = $1").bind(partner_ref),
///     |_| true,
/// ).await;
/// match created {
///     Err(e) if unique_violation(&e) == Some("orders_email_key") => { /* 409: the email is taken */ }
///     other => { other?; }
/// }
/// # Ok(())
/// # }
/// ```
pub fn unique_violation(error: &Error) -> Option<&str> {
    let database = error
        .as_store()?
        .source_ref()
        .downcast_ref::<sqlx::Error>()?
        .as_database_error()?;
    if database.code().as_deref() != Some(UNIQUE_VIOLATION) {
        return None;
    }
    Some(database.constraint().unwrap_or(""))
}
