//! Charges on the embedded SQLite file, beside the idempotency records.

use super::{Backend, DbError, Unreachable, READ_DEADLINE};
use crate::charge::Charge;
use crate::settings::Webhook;
use crate::webhooks;
use idem::sqlite::rusqlite::{params, Connection, OptionalExtension, Row};
use idem::sqlite::SqliteStore;
use idem::tower::Reservation;
use idem::{Completion, Idempotency, Policy, RunError};
use idem_outbox::{Dispatching, SqliteOutbox};
use std::time::Duration;

const SCHEMA: &str = include_str!("sql/sqlite/schema.sql");
const HAS_AUTHORIZATION_COLUMN: &str = include_str!("sql/sqlite/has_authorization_column.sql");
const ADD_AUTHORIZATION_COLUMN: &str = include_str!("sql/sqlite/add_authorization_column.sql");
const INSERT_IF_ABSENT: &str = include_str!("sql/sqlite/insert_if_absent.sql");
const GET: &str = include_str!("sql/sqlite/get.sql");
const LIST: &str = include_str!("sql/sqlite/list.sql");
const COUNT: &str = include_str!("sql/sqlite/count.sql");

/// SQLite: writes on the store's writer connection (SQLite has one writer), reads on the
/// store's reader connections (`SqliteStore::read`), which WAL never blocks.
pub(crate) struct Sqlite {
    idem: Idempotency<SqliteStore>,
    /// The outbox of the merchant's webhooks, when the server has one, and its dispatcher.
    webhooks: Option<(SqliteOutbox, Dispatching)>,
}

impl Sqlite {
    /// Opens (or creates) the file, with the charges table, and the outbox of `webhook`.
    pub(crate) async fn open(
        path: &str,
        policy: Policy,
        webhook: Option<&Webhook>,
    ) -> Result<Self, DbError> {
        let store = SqliteStore::open(path).await?;
        store
            .try_call(|db| {
                db.execute_batch(SCHEMA)?;
                // A file made before the card network: its charges get the column.
                let has: i64 = db.query_row(HAS_AUTHORIZATION_COLUMN, [], |row| row.get(0))?;
                if has == 0 {
                    db.execute_batch(ADD_AUTHORIZATION_COLUMN)?;
                }
                Ok(())
            })
            .await?;
        let webhooks = match webhook {
            Some(webhook) => {
                let outbox = SqliteOutbox::open(&store).await?;
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
        row.get(5)?,
    ))
}

/// `charge` of `account` as the parameters of `sql` ([`INSERT_IF_ABSENT`]).
fn insert(
    db: &Connection,
    sql: &str,
    account: &str,
    charge: &Charge,
) -> idem::sqlite::rusqlite::Result<usize> {
    db.prepare_cached(sql)?.execute(params![
        charge.id,
        account,
        charge.amount,
        charge.currency,
        charge.description,
        charge.created,
        charge.authorization
    ])
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
    ) -> Result<Completion, RunError<DbError>> {
        let (account, charge) = (account.to_owned(), charge.clone());
        let outbox = self.webhooks.as_ref().map(|(outbox, _)| outbox.clone());
        // One call: the writer, an IMMEDIATE transaction, the charge, its webhook and its
        // completion, one commit (or nothing, and the key given back by the engine).
        reservation
            .transaction(Box::new(move |tx, _lease| -> Result<_, DbError> {
                // The row may be there already: the reconciler recorded this authorization
                // and then lost its settlement (a release came first), so the key ran again
                // and the network answered the same authorization. Its charge is this one.
                // Its event was enqueued with the row, whoever inserted it: once per charge.
                let inserted = insert(tx, INSERT_IF_ABSENT, &account, &charge)? == 1;
                if let (true, Some(outbox), Some(event)) =
                    (inserted, &outbox, webhooks::charge_succeeded(&charge)?)
                {
                    outbox.enqueue(tx, &event)?;
                }
                if let Some(delay) = delay {
                    std::thread::sleep(delay);
                }
                Ok(charge.response())
            }))
            .await
            .map(|completed| completed.0)
    }

    async fn record(&self, account: &str, charge: &Charge) -> Result<Charge, DbError> {
        let (account, charge) = (account.to_owned(), charge.clone());
        let outbox = self.webhooks.as_ref().map(|(outbox, _)| outbox.clone());
        let event = match &outbox {
            Some(_) => webhooks::charge_succeeded(&charge)?,
            None => None,
        };
        // On the writer, in one transaction: the insert (or nothing, the row being there) with
        // the charge's event when the row is new (a succeeded charge's event, C17, as the
        // handler enqueues it), and the read of the row as stored.
        let stored = self
            .idem
            .store()
            .try_call(move |db| {
                let tx = db.transaction()?;
                let inserted = insert(&tx, INSERT_IF_ABSENT, &account, &charge)? == 1;
                if let (true, Some(outbox), Some(event)) = (inserted, &outbox, &event) {
                    outbox.enqueue(&tx, event).map_err(|e| {
                        idem::sqlite::rusqlite::Error::ToSqlConversionFailure(Box::new(e))
                    })?;
                }
                let stored = tx
                    .prepare_cached(GET)?
                    .query_row(params![charge.id, account], charge_of)
                    .optional()?;
                tx.commit()?;
                Ok(stored)
            })
            .await?;
        stored.ok_or_else(|| "the charge's id is another account's".into())
    }

    async fn get(&self, account: &str, id: &str) -> Result<Option<Charge>, DbError> {
        let (account, id) = (account.to_owned(), id.to_owned());
        self.read(move |db| {
            Ok(db
                .prepare_cached(GET)?
                .query_row(params![id, account], charge_of)
                .optional()?)
        })
        .await
    }

    async fn list(&self, account: &str, limit: u32) -> Result<(Vec<Charge>, bool), DbError> {
        let account = account.to_owned();
        self.read(move |db| {
            let mut statement = db.prepare_cached(LIST)?;
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
        self.read(|db| Ok(db.query_row(COUNT, [], |row| row.get(0))?))
            .await
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::network::Authorization;

    fn authorization() -> Authorization {
        Authorization {
            id: "auth_0123456789abcdefghijklmn".into(),
            amount: 4242,
            currency: "usd".into(),
            description: Some("Tea for two".into()),
            created: 1_700_000_000,
        }
    }

    async fn open(dir: &tempfile::TempDir) -> Sqlite {
        let path = dir.path().join("charges.db");
        Sqlite::open(&path.display().to_string(), Policy::default(), None)
            .await
            .expect("open")
    }

    #[tokio::test]
    async fn recording_an_authorization_twice_makes_one_row() {
        let dir = tempfile::tempdir().expect("temp dir");
        let db = open(&dir).await;
        let charge = Charge::authorized(&authorization());
        assert_eq!(charge.id, "ch_0123456789abcdefghijklmn");
        assert_eq!(db.record("acct_1", &charge).await.expect("first"), charge);
        // The next pass after a crash between the insert and the settlement.
        assert_eq!(db.record("acct_1", &charge).await.expect("again"), charge);
        assert_eq!(db.count().await.expect("count"), 1);
        assert!(
            db.record("acct_2", &charge).await.is_err(),
            "another account's id"
        );
        assert_eq!(
            db.get("acct_1", &charge.id).await.expect("get"),
            Some(charge)
        );
    }

    #[tokio::test]
    async fn a_file_from_before_the_network_gets_its_column() {
        let dir = tempfile::tempdir().expect("temp dir");
        let old = Connection::open(dir.path().join("charges.db")).expect("old file");
        old.execute_batch(include_str!("sql/sqlite/schema_before_network.sql"))
            .expect("old schema");
        drop(old);
        let db = open(&dir).await;
        let before = db
            .get("acct_1", "ch_old")
            .await
            .expect("get")
            .expect("kept");
        assert_eq!(before.authorization, None);
        let charge = Charge::authorized(&authorization());
        assert_eq!(db.record("acct_1", &charge).await.expect("record"), charge);
        assert_eq!(db.count().await.expect("count"), 2);
        // Opened again: the column is there already.
        drop(db);
        assert_eq!(open(&dir).await.count().await.expect("count"), 2);
    }
}
