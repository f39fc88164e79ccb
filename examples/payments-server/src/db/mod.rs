//! Where charges live: the same API on SQLite and on PostgreSQL. Each backend writes a charge
//! and its idempotency completion in one transaction, or (the reconciler's write) a charge
//! alone, idempotently by its id. The SQL is in `sql/<backend>/*.sql`.

mod pg_charge;
mod postgres;
mod sqlite;
mod unavailable;

pub(crate) use postgres::Postgres;
pub(crate) use sqlite::Sqlite;
pub(crate) use unavailable::{is_unavailable, Unreachable, READ_DEADLINE};

use crate::charge::Charge;
use idem::ops::Operator;
use idem::tower::Reservation;
use idem::{Completion, Idempotency, RunError};
use std::time::Duration;

/// A database failure (logged; the client sees a 503 when [`is_unavailable`], else a 500,
/// without the cause).
pub(crate) type DbError = Box<dyn std::error::Error + Send + Sync>;

/// The charges table and the idempotency store of one database.
#[async_trait::async_trait]
pub(crate) trait Backend: Send + Sync + 'static {
    /// The idempotency store on the same database (an [`Operator`]: the reconciler lists
    /// and settles its records in doubt).
    type Store: Operator + 'static;

    /// The idempotency engine over it.
    fn idem(&self) -> &Idempotency<Self::Store>;

    /// Inserts `charge` for `account` and completes the reservation with its response, in
    /// one transaction: both commit or neither does. `delay` (a test hook) sleeps between
    /// the two, inside the transaction. [`RunError::Released`] and [`RunError::Idem`]: rolled
    /// back, nothing happened; [`RunError::InDoubt`]: it may have happened, the key is kept.
    async fn create(
        &self,
        reservation: &Reservation<Self::Store>,
        account: &str,
        charge: &Charge,
        delay: Option<Duration>,
    ) -> Result<Completion, RunError<DbError>>;

    /// Inserts `charge` for `account` unless a charge with its id is there already, and
    /// answers the row as stored: the reconciler's record of an authorization whose handler
    /// never heard back from the network. Settling the record in doubt is a separate step, so
    /// a crash between the two must not make a second row at the next pass: the charge's id
    /// is derived from its authorization's, and a second insert of it inserts nothing.
    async fn record(&self, account: &str, charge: &Charge) -> Result<Charge, DbError>;

    /// One of `account`'s charges.
    async fn get(&self, account: &str, id: &str) -> Result<Option<Charge>, DbError>;

    /// `account`'s newest charges, at most `limit`, and whether there are more.
    async fn list(&self, account: &str, limit: u32) -> Result<(Vec<Charge>, bool), DbError>;

    /// Every committed charge row (a test hook).
    async fn count(&self) -> Result<i64, DbError>;
}
