//! Where charges live: SQLite (the default) or PostgreSQL, each writing a charge and the
//! idempotency key's completion in one transaction of the database that holds the records.

mod postgres;
mod sqlite;

pub use postgres::Postgres;
pub use sqlite::Sqlite;

use crate::proto::Charge;
use idem::store::Store;
use idem::{Completion, Idempotency, RunError, StoredResponse};
use idem_tower::Reservation;

/// An error of the database.
pub type DbError = Box<dyn std::error::Error + Send + Sync>;

/// The charges table of either database (named so as not to meet another program's table).
pub const TABLE: &str = "grpc_charges";

/// A database for charges, beside the idempotency records.
#[async_trait::async_trait]
pub trait Backend: Send + Sync + 'static {
    /// The idempotency store in the same database.
    type Store: Store + 'static;

    /// The engine over that store.
    fn idem(&self) -> &Idempotency<Self::Store>;

    /// Inserts `charge` for `account` and completes `reservation` with `answer`, in one
    /// transaction: both commit or neither does (C6). [`RunError::Released`] and
    /// [`RunError::Idem`]: rolled back, nothing happened; [`RunError::InDoubt`]: it may have
    /// happened, the key is kept.
    async fn create(
        &self,
        reservation: &Reservation<Self::Store>,
        account: &str,
        charge: &Charge,
        answer: StoredResponse,
    ) -> Result<Completion, RunError<DbError>>;

    /// The account's charge `id`.
    async fn get(&self, account: &str, id: &str) -> Result<Option<Charge>, DbError>;
}
