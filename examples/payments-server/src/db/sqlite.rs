//! Charges on the embedded SQLite file, beside the idempotency records.

use super::{Backend, DbError, Unreachable, READ_DEADLINE};
use crate::charge::Charge;
use idem::sqlite::rusqlite::{params, Connection, OptionalExtension, Row};
use idem::sqlite::SqliteStore;
use idem::tower::Reservation;
use idem::{Completion, Idempotency, Policy};
use std::time::Duration;

const SCHEMA: &str = "CREATE TABLE IF NOT EXISTS charges (
    seq INTEGER PRIMARY KEY AUTOINCREMENT,
    id TEXT NOT NULL UNIQUE,
    account TEXT NOT NULL,
    amount INTEGER NOT NULL,
    currency TEXT NOT NULL,
    description TEXT,
    created INTEGER NOT NULL
);
CREATE INDEX IF NOT EXISTS charges_by_account ON charges (account, seq);";

/// SQLite: writes on the store's writer connection (SQLite has one writer), reads on the
/// store's reader connections (`SqliteStore::read`), which WAL never blocks.
pub(crate) struct Sqlite {
    idem: Idempotency<SqliteStore>,
}

impl Sqlite {
    /// Opens (or creates) the file, with the charges table.
    pub(crate) async fn open(path: &str, policy: Policy) -> Result<Self, DbError> {
        let store = SqliteStore::open(path).await?;
        store.try_call(|db| db.execute_batch(SCHEMA)).await?;
        Ok(Self {
            idem: Idempotency::with_policy(store, policy)?,
        })
    }

    /// Runs a read on one of the store's readers, within [`READ_DEADLINE`] (past it the read
    /// is [`Unreachable`], and one that had not started yet never runs).
    async fn read<T: Send + 'static>(
        &self,
        work: impl FnOnce(&Connection) -> Result<T, DbError> + Send + 'static,
    ) -> Result<T, DbError> {
        match tokio::time::timeout(READ_DEADLINE, self.idem.store().read(work)).await {
            Ok(ran) => ran?,
            Err(_) => Err(Box::new(Unreachable(format!(
                "no answer within {READ_DEADLINE:?}"
            )))),
        }
    }
}

fn charge_of(row: &Row<'_>) -> idem::sqlite::rusqlite::Result<Charge> {
    Ok(Charge::from_row(
        row.get(0)?,
        row.get(1)?,
        row.get(2)?,
        row.get(3)?,
        row.get(4)?,
    ))
}

#[async_trait::async_trait]
impl Backend for Sqlite {
    type Store = SqliteStore;

    fn idem(&self) -> &Idempotency<SqliteStore> {
        &self.idem
    }

    async fn create(
        &self,
        reservation: &Reservation<SqliteStore>,
        account: &str,
        charge: &Charge,
        delay: Option<Duration>,
    ) -> Result<Completion, DbError> {
        let (account, charge) = (account.to_owned(), charge.clone());
        // One call: the writer, an IMMEDIATE transaction, the charge and its completion, one
        // commit (or nothing, and the key released by the layer).
        reservation
            .sqlite_transaction(move |tx| -> Result<_, DbError> {
                tx.execute(
                    "INSERT INTO charges (id, account, amount, currency, description, created) VALUES (?1, ?2, ?3, ?4, ?5, ?6)",
                    params![charge.id, account, charge.amount, charge.currency, charge.description, charge.created],
                )?;
                if let Some(delay) = delay {
                    std::thread::sleep(delay);
                }
                Ok(charge.response())
            })
            .await
            .map(|completed| completed.0)
    }

    async fn get(&self, account: &str, id: &str) -> Result<Option<Charge>, DbError> {
        let (account, id) = (account.to_owned(), id.to_owned());
        self.read(move |db| {
            Ok(db
                .prepare_cached(
                    "SELECT id, amount, currency, description, created FROM charges WHERE id = ?1 AND account = ?2",
                )?
                .query_row(params![id, account], charge_of)
                .optional()?)
        })
        .await
    }

    async fn list(&self, account: &str, limit: u32) -> Result<(Vec<Charge>, bool), DbError> {
        let account = account.to_owned();
        self.read(move |db| {
            let mut statement = db.prepare_cached(
                "SELECT id, amount, currency, description, created FROM charges WHERE account = ?1 ORDER BY seq DESC LIMIT ?2",
            )?;
            let mut charges = statement
                .query_map(params![account, i64::from(limit) + 1], charge_of)?
                .collect::<Result<Vec<_>, _>>()?;
            let more = charges.len() > limit as usize;
            charges.truncate(limit as usize);
            Ok((charges, more))
        })
        .await
    }

    async fn count(&self) -> Result<i64, DbError> {
        self.read(|db| Ok(db.query_row("SELECT count(*) FROM charges", [], |row| row.get(0))?))
            .await
    }
}
