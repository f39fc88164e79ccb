//! Charges on PostgreSQL, beside the idempotency records.

use super::{Backend, DbError};
use crate::charge::Charge;
use idem::postgres::sqlx::{self, Row};
use idem::postgres::PgStore;
use idem::tower::Reservation;
use idem::{Completion, Idempotency, Policy};
use std::time::Duration;

const SCHEMA: &str = "CREATE TABLE IF NOT EXISTS charges (
    seq bigserial PRIMARY KEY,
    id text NOT NULL UNIQUE,
    account text NOT NULL,
    amount bigint NOT NULL,
    currency text NOT NULL,
    description text,
    created bigint NOT NULL
);
CREATE INDEX IF NOT EXISTS charges_by_account ON charges (account, seq)";

/// PostgreSQL: the charge and the completion in one transaction from the store's pool.
pub struct Postgres {
    idem: Idempotency<PgStore>,
}

impl Postgres {
    /// Connects, migrates the idempotency table and creates the charges table.
    pub async fn connect(url: &str, policy: Policy) -> Result<Self, DbError> {
        let store = PgStore::connect(url).await?;
        store.migrate().await?;
        sqlx::raw_sql(SCHEMA).execute(store.pool()).await?;
        Ok(Self {
            idem: Idempotency::with_policy(store, policy)?,
        })
    }
}

fn charge_of(row: &sqlx::postgres::PgRow) -> Result<Charge, sqlx::Error> {
    Ok(Charge::from_row(
        row.try_get("id")?,
        row.try_get("amount")?,
        row.try_get("currency")?,
        row.try_get("description")?,
        row.try_get("created")?,
    ))
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
        delay: Option<Duration>,
    ) -> Result<Completion, DbError> {
        let completion = reservation.completion(charge.response());
        let store = self.idem.store();
        let mut tx = store.pool().begin().await?;
        sqlx::query(
            "INSERT INTO charges (id, account, amount, currency, description, created) VALUES ($1, $2, $3, $4, $5, $6)",
        )
        .bind(&charge.id)
        .bind(account)
        .bind(charge.amount)
        .bind(&charge.currency)
        .bind(&charge.description)
        .bind(charge.created)
        .execute(&mut *tx)
        .await?;
        if let Some(delay) = delay {
            tokio::time::sleep(delay).await;
        }
        store.complete_in(&mut tx, &completion).await?;
        tx.commit().await?;
        Ok(completion)
    }

    async fn get(&self, account: &str, id: &str) -> Result<Option<Charge>, DbError> {
        let row = sqlx::query(
            "SELECT id, amount, currency, description, created FROM charges WHERE id = $1 AND account = $2",
        )
        .bind(id)
        .bind(account)
        .fetch_optional(self.idem.store().pool())
        .await?;
        Ok(row.as_ref().map(charge_of).transpose()?)
    }

    async fn list(&self, account: &str, limit: u32) -> Result<(Vec<Charge>, bool), DbError> {
        let rows = sqlx::query(
            "SELECT id, amount, currency, description, created FROM charges WHERE account = $1 ORDER BY seq DESC LIMIT $2",
        )
        .bind(account)
        .bind(i64::from(limit) + 1)
        .fetch_all(self.idem.store().pool())
        .await?;
        let mut charges = rows.iter().map(charge_of).collect::<Result<Vec<_>, _>>()?;
        let more = charges.len() > limit as usize;
        charges.truncate(limit as usize);
        Ok((charges, more))
    }

    async fn count(&self) -> Result<i64, DbError> {
        Ok(sqlx::query_scalar("SELECT count(*) FROM charges")
            .fetch_one(self.idem.store().pool())
            .await?)
    }
}
