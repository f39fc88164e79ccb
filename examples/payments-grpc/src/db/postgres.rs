//! Charges in the PostgreSQL database that holds the idempotency records.

use super::{Backend, DbError, TABLE};
use crate::proto::Charge;
use idem::postgres::sqlx::{self, Row};
use idem::postgres::PgStore;
use idem::{Completion, Idempotency, Policy, RunError, StoredResponse};
use idem_tower::Reservation;

/// PostgreSQL: the charge and its completion (`PgStore::complete_in`) in one transaction from
/// the store's pool.
#[derive(Debug)]
pub struct Postgres {
    idem: Idempotency<PgStore>,
}

impl Postgres {
    /// Connects, migrates the idempotency table and creates the charges table.
    pub async fn connect(url: &str, policy: Policy) -> Result<Self, DbError> {
        let store = PgStore::connect(url).await?;
        store.migrate().await?;
        let schema = format!(
            "CREATE TABLE IF NOT EXISTS {TABLE} (
                seq bigserial PRIMARY KEY,
                id text NOT NULL UNIQUE,
                account text NOT NULL,
                amount bigint NOT NULL,
                currency text NOT NULL,
                description text NOT NULL,
                created bigint NOT NULL
            )"
        );
        sqlx::raw_sql(sqlx::AssertSqlSafe(schema))
            .execute(store.pool())
            .await?;
        Ok(Self {
            idem: Idempotency::with_policy(store, policy)?,
        })
    }
}

#[async_trait::async_trait]
impl Backend for Postgres {
    type Store = PgStore;

    fn idem(&self) -> &Idempotency<PgStore> {
        &self.idem
    }

    async fn create(
        &self,
        reservation: &Reservation<PgStore>,
        account: &str,
        charge: &Charge,
        answer: StoredResponse,
    ) -> Result<Completion, RunError<DbError>> {
        // A failure rolled the transaction back, or lost the COMMIT's answer: the layer gives
        // the key back, fenced; a completion that did commit is found and answered instead.
        self.charge(reservation, account, charge, answer)
            .await
            .map_err(RunError::Released)
    }

    async fn get(&self, account: &str, id: &str) -> Result<Option<Charge>, DbError> {
        self.read(account, id).await
    }
}

impl Postgres {
    /// The charge and the completion of `reservation` with `answer` in one transaction.
    async fn charge(
        &self,
        reservation: &Reservation<PgStore>,
        account: &str,
        charge: &Charge,
        answer: StoredResponse,
    ) -> Result<Completion, DbError> {
        let completion = reservation.completion(answer);
        let store = self.idem.store();
        let mut tx = store.pool().begin().await?;
        sqlx::query(sqlx::AssertSqlSafe(format!(
            "INSERT INTO {TABLE} (id, account, amount, currency, description, created) VALUES ($1, $2, $3, $4, $5, $6)"
        )))
        .bind(&charge.id)
        .bind(account)
        .bind(charge.amount)
        .bind(&charge.currency)
        .bind(&charge.description)
        .bind(charge.created)
        .execute(&mut *tx)
        .await?;
        store.complete_in(&mut tx, &completion).await?;
        tx.commit().await?;
        Ok(completion)
    }

    /// The account's charge `id`.
    async fn read(&self, account: &str, id: &str) -> Result<Option<Charge>, DbError> {
        let row = sqlx::query(sqlx::AssertSqlSafe(format!(
            "SELECT id, amount, currency, description, created FROM {TABLE} WHERE id = $1 AND account = $2"
        )))
        .bind(id)
        .bind(account)
        .fetch_optional(self.idem.store().pool())
        .await?;
        let Some(row) = row else { return Ok(None) };
        Ok(Some(Charge {
            id: row.try_get("id")?,
            amount: row.try_get("amount")?,
            currency: row.try_get("currency")?,
            description: row.try_get("description")?,
            created: row.try_get("created")?,
        }))
    }
}
