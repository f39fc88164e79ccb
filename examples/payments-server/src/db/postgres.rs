//! Charges on PostgreSQL, beside the idempotency records.

use super::pg_charge::charge_and_complete;
use super::{is_unavailable, Backend, DbError, Unreachable, READ_DEADLINE};
use crate::charge::Charge;
use crate::settings::Webhook;
use crate::webhooks;
use idem::postgres::sqlx::{self, pool::PoolConnection, Row};
use idem::postgres::PgStore;
use idem::tower::Reservation;
use idem::{Completion, Idempotency, Policy, RunError};
use idem_outbox::{Dispatching, PgOutbox};
use std::time::Duration;
use tokio::time::error::Elapsed;

const SCHEMA: &str = include_str!("sql/postgres/schema.sql");
const INSERT_IF_ABSENT: &str = include_str!("sql/postgres/insert_if_absent.sql");
const GET: &str = include_str!("sql/postgres/get.sql");
const LIST: &str = include_str!("sql/postgres/list.sql");
const COUNT: &str = include_str!("sql/postgres/count.sql");

/// PostgreSQL: the charge and the completion in one transaction from the store's pool.
pub(crate) struct Postgres {
    idem: Idempotency<PgStore>,
    /// The outbox of the merchant's webhooks, when the server has one, and its dispatcher.
    webhooks: Option<(PgOutbox, Dispatching)>,
}

impl Postgres {
    /// Connects, migrates the idempotency table, creates the charges table, and opens the
    /// outbox of `webhook`.
    pub(crate) async fn connect(
        url: &str,
        policy: Policy,
        webhook: Option<&Webhook>,
    ) -> Result<Self, DbError> {
        let store = PgStore::connect(url).await?;
        store.migrate().await?;
        sqlx::raw_sql(SCHEMA).execute(store.pool()).await?;
        let webhooks = match webhook {
            Some(webhook) => {
                let outbox = PgOutbox::open(&store).await?;
                outbox.register(&webhooks::endpoint(webhook)?).await?;
                let dispatching = webhooks::start(outbox.dispatcher(), webhook)?;
                Some((outbox, dispatching))
            }
            None => None,
        };
        Ok(Self {
            idem: Idempotency::with_policy(store, policy)?,
            webhooks,
        })
    }

    /// A pooled connection for a read (or the reconciler's insert), within [`READ_DEADLINE`]. A
    /// connection that cannot be had (refused, reset, the database not accepting connections,
    /// no answer) is [`Unreachable`]; a wrong password, database name or TLS setting stays
    /// what it is.
    async fn reader(&self) -> Result<PoolConnection<sqlx::Postgres>, DbError> {
        match tokio::time::timeout(READ_DEADLINE, self.idem.store().pool().acquire()).await {
            Err(_) => Err(Box::new(Unreachable(format!(
                "no connection within {READ_DEADLINE:?}"
            )))),
            Ok(Err(error)) if misconfigured(&error) => Err(error.into()),
            Ok(Err(error)) => Err(Box::new(Unreachable(error.to_string()))),
            Ok(Ok(conn)) => Ok(conn),
        }
    }
}

/// A read's result: past the deadline the read is [`Unreachable`]. A connection that timed out
/// or saw the database unavailable is closed, never given to another read (its link may be
/// frozen or its session ended).
fn settle<T>(
    conn: &mut PoolConnection<sqlx::Postgres>,
    outcome: Result<Result<T, sqlx::Error>, Elapsed>,
) -> Result<T, DbError> {
    match outcome {
        Ok(Err(error)) => {
            let error: DbError = error.into();
            if is_unavailable(&error) {
                conn.close_on_drop();
            }
            Err(error)
        }
        Ok(Ok(value)) => Ok(value),
        Err(_) => {
            conn.close_on_drop();
            Err(Box::new(Unreachable(format!(
                "no answer within {READ_DEADLINE:?}"
            ))))
        }
    }
}

/// Errors of connecting that an operator must fix: retrying does not help.
fn misconfigured(error: &sqlx::Error) -> bool {
    match error {
        sqlx::Error::Configuration(_) | sqlx::Error::Tls(_) => true,
        sqlx::Error::Database(db) => db
            .code()
            .is_some_and(|code| matches!(code.as_ref(), "28P01" | "28000" | "3D000" | "42501")),
        _ => false,
    }
}

fn charge_of(row: &sqlx::postgres::PgRow) -> Result<Charge, sqlx::Error> {
    Ok(Charge::from_row(
        row.try_get("id")?,
        row.try_get("amount")?,
        row.try_get("currency")?,
        row.try_get("description")?,
        row.try_get("created")?,
        row.try_get("authorization_id")?,
    ))
}

/// `sql` ([`INSERT_IF_ABSENT`]) with `charge` of `account` bound.
fn insert<'q>(
    sql: &'static str,
    account: &'q str,
    charge: &'q Charge,
) -> sqlx::query::Query<'q, sqlx::Postgres, sqlx::postgres::PgArguments> {
    sqlx::query(sql)
        .bind(&charge.id)
        .bind(account)
        .bind(charge.amount)
        .bind(&charge.currency)
        .bind(&charge.description)
        .bind(charge.created)
        .bind(&charge.authorization)
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
    ) -> Result<Completion, RunError<DbError>> {
        // The layer's engine is a clone of `self.idem`: the same store and pool. A failure
        // rolled the transaction back: nothing happened (the layer gives the key back).
        let webhook = match &self.webhooks {
            Some((outbox, _)) => webhooks::charge_succeeded(charge)
                .map_err(|e| RunError::Released(e.into()))?
                .map(|event| (outbox, event)),
            None => None,
        };
        // The row may be there already: the reconciler recorded this authorization and then
        // lost its settlement (a release came first), so the key ran again and the network
        // answered the same authorization. Its charge is this one.
        charge_and_complete(
            reservation,
            insert(INSERT_IF_ABSENT, account, charge),
            webhook,
            charge.response(),
            delay,
        )
        .await
        .map_err(RunError::Released)
    }

    async fn record(&self, account: &str, charge: &Charge) -> Result<Charge, DbError> {
        let webhook = match &self.webhooks {
            Some((outbox, _)) => webhooks::charge_succeeded(charge)?.map(|event| (outbox, event)),
            None => None,
        };
        let mut conn = self.reader().await?;
        // One transaction: the row (or nothing, the row being there) with the charge's event
        // when the row is new (a succeeded charge's event, C17, as the handler enqueues it).
        let outcome = tokio::time::timeout(READ_DEADLINE, async {
            let mut tx = sqlx::Connection::begin(&mut *conn).await?;
            let inserted = insert(INSERT_IF_ABSENT, account, charge)
                .execute(&mut *tx)
                .await?
                .rows_affected()
                == 1;
            if let (true, Some((outbox, event))) = (inserted, &webhook) {
                outbox
                    .enqueue(&mut tx, event)
                    .await
                    .map_err(|e| sqlx::Error::Protocol(e.to_string()))?;
            }
            tx.commit().await
        })
        .await;
        settle(&mut conn, outcome)?;
        let query = sqlx::query(GET).bind(&charge.id).bind(account);
        let outcome = tokio::time::timeout(READ_DEADLINE, query.fetch_optional(&mut *conn)).await;
        match settle(&mut conn, outcome)? {
            Some(row) => Ok(charge_of(&row)?),
            None => Err("the charge's id is another account's".into()),
        }
    }

    async fn get(&self, account: &str, id: &str) -> Result<Option<Charge>, DbError> {
        let mut conn = self.reader().await?;
        let query = sqlx::query(GET).bind(id).bind(account);
        let outcome = tokio::time::timeout(READ_DEADLINE, query.fetch_optional(&mut *conn)).await;
        let row = settle(&mut conn, outcome)?;
        Ok(row.as_ref().map(charge_of).transpose()?)
    }

    async fn list(&self, account: &str, limit: u32) -> Result<(Vec<Charge>, bool), DbError> {
        let mut conn = self.reader().await?;
        let query = sqlx::query(LIST).bind(account).bind(i64::from(limit) + 1);
        let outcome = tokio::time::timeout(READ_DEADLINE, query.fetch_all(&mut *conn)).await;
        let rows = settle(&mut conn, outcome)?;
        let mut charges = rows.iter().map(charge_of).collect::<Result<Vec<_>, _>>()?;
        let more = charges.len() > limit as usize;
        charges.truncate(limit as usize);
        Ok((charges, more))
    }

    async fn count(&self) -> Result<i64, DbError> {
        let mut conn = self.reader().await?;
        let query = sqlx::query_scalar(COUNT);
        let outcome = tokio::time::timeout(READ_DEADLINE, query.fetch_one(&mut *conn)).await;
        settle(&mut conn, outcome)
    }
}
