//! Charges in the SQLite file that holds the idempotency records.

use super::{Backend, DbError, TABLE};
use crate::proto::Charge;
use idem::sqlite::rusqlite::{params, OptionalExtension};
use idem::sqlite::SqliteStore;
use idem::{Completion, Idempotency, Policy, RunError, StoredResponse};
use idem_tower::Reservation;

/// SQLite: the charge and its completion in one `BEGIN IMMEDIATE` transaction on the store's
/// writer (`Reservation::transaction`).
#[derive(Debug)]
pub struct Sqlite {
    idem: Idempotency<SqliteStore>,
}

impl Sqlite {
    /// Opens (or creates) the file, with the charges table.
    pub async fn open(path: &str, policy: Policy) -> Result<Self, DbError> {
        let store = SqliteStore::open(path).await?;
        let schema = format!(
            "CREATE TABLE IF NOT EXISTS {TABLE} (
                seq INTEGER PRIMARY KEY AUTOINCREMENT,
                id TEXT NOT NULL UNIQUE,
                account TEXT NOT NULL,
                amount INTEGER NOT NULL,
                currency TEXT NOT NULL,
                description TEXT NOT NULL,
                created INTEGER NOT NULL
            )"
        );
        store.try_call(move |db| db.execute_batch(&schema)).await?;
        Ok(Self {
            idem: Idempotency::with_policy(store, policy)?,
        })
    }
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
        answer: StoredResponse,
    ) -> Result<Completion, RunError<DbError>> {
        let (account, row) = (account.to_owned(), charge.clone());
        let completed = reservation
            .transaction(Box::new(move |tx, _lease| -> Result<_, DbError> {
                tx.execute(
                    &format!("INSERT INTO {TABLE} (id, account, amount, currency, description, created) VALUES (?1, ?2, ?3, ?4, ?5, ?6)"),
                    params![row.id, account, row.amount, row.currency, row.description, row.created],
                )?;
                Ok(answer)
            }))
            .await?;
        Ok(completed.0)
    }

    async fn get(&self, account: &str, id: &str) -> Result<Option<Charge>, DbError> {
        let store = self.idem.store().clone();
        let (account, id) = (account.to_owned(), id.to_owned());
        let read = tokio::task::spawn_blocking(move || -> Result<Option<Charge>, DbError> {
            let db = store.connect()?;
            Ok(db
                .query_row(
                    &format!("SELECT id, amount, currency, description, created FROM {TABLE} WHERE id = ?1 AND account = ?2"),
                    params![id, account],
                    |row| {
                        Ok(Charge {
                            id: row.get(0)?,
                            amount: row.get(1)?,
                            currency: row.get(2)?,
                            description: row.get(3)?,
                            created: row.get(4)?,
                        })
                    },
                )
                .optional()?)
        });
        read.await?
    }
}
