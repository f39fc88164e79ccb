//! `SqliteOutbox`: the outbox in a SQLite store's file.

use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use idem_sqlite::rusqlite::{params, OptionalExtension, Row, Transaction, TransactionBehavior};
use idem_sqlite::{store_error, SqliteStore};
use tokio::sync::Notify;

use crate::claim::{millis, Claimed, Record, Taken, Undecodable};
use crate::inspect::{attempt_info, delivery_info};
use crate::message::headers_from_stored;
use crate::{
    AttemptInfo, Counts, DeliveryInfo, DeliveryState, Dispatcher, Endpoint, Message, MessageId,
    OutboxError, Retention, DEFAULT_MAX_PAYLOAD,
};

/// The outbox's statements.
mod sql {
    pub(super) const SCHEMA: &str = include_str!("../sql/sqlite/schema.sql");
    pub(super) const ENDPOINT_UPSERT: &str = include_str!("../sql/sqlite/endpoint_upsert.sql");
    pub(super) const ENDPOINT_REENABLED: &str =
        include_str!("../sql/sqlite/endpoint_reenabled.sql");
    pub(super) const ENDPOINT_SELECT: &str = include_str!("../sql/sqlite/endpoint_select.sql");
    pub(super) const ENQUEUE: &str = include_str!("../sql/sqlite/enqueue.sql");
    pub(super) const CLAIM: &str = include_str!("../sql/sqlite/claim.sql");
    pub(super) const RECORD: &str = include_str!("../sql/sqlite/record.sql");
    pub(super) const ABANDON: &str = include_str!("../sql/sqlite/abandon.sql");
    pub(super) const ATTEMPT_INSERT: &str = include_str!("../sql/sqlite/attempt_insert.sql");
    pub(super) const ENDPOINT_HEALTH: &str = include_str!("../sql/sqlite/endpoint_health.sql");
    pub(super) const DELIVERIES_OF: &str = include_str!("../sql/sqlite/deliveries_of.sql");
    pub(super) const DELIVERIES_BY_ID: &str = include_str!("../sql/sqlite/deliveries_by_id.sql");
    pub(super) const ATTEMPTS_OF: &str = include_str!("../sql/sqlite/attempts_of.sql");
    pub(super) const COUNTS: &str = include_str!("../sql/sqlite/counts.sql");
    pub(super) const LIST: &str = include_str!("../sql/sqlite/list.sql");
    pub(super) const REQUEUE: &str = include_str!("../sql/sqlite/requeue.sql");
    pub(super) const PURGE_ATTEMPTS: &str = include_str!("../sql/sqlite/purge_attempts.sql");
    pub(super) const PURGE_DELIVERIES: &str = include_str!("../sql/sqlite/purge_deliveries.sql");
    pub(super) const OLDEST_PENDING: &str = include_str!("../sql/sqlite/oldest_pending.sql");
}

/// The outbox in the file of a [`SqliteStore`], beside its records: messages are enqueued in
/// the effect's transaction on the store's writer (`run_in_transaction`'s `tx`), so the
/// effect, its idempotency record and its messages commit together or not at all (C17).
///
/// Its dispatchers claim due deliveries on the store's writer (SQLite's single writer orders
/// the claims); a dispatcher of this process is woken by each enqueue and claims right after
/// the enqueuing transaction ends, one in another process polls. Times are the process
/// clock's, as the SQLite store's (C11). Cloning is cheap.
///
/// ```
/// use idem_core::{Idempotency, StoredResponse};
/// use idem_outbox::{Endpoint, Message, SqliteOutbox};
/// use idem_sqlite::{SqliteIdempotency, SqliteStore};
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
/// # let dir = tempfile::tempdir()?;
/// let store = SqliteStore::open(dir.path().join("shop.db")).await?;
/// let outbox = SqliteOutbox::open(&store).await?;
/// outbox.register(&Endpoint::new("merchant", "https://merchant.example/hooks", ["whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw"])?).await?;
/// let idem = Idempotency::new(store);
/// let request = idem.request("acct_1", "POST", "/charges").key(Some("k-1")).body(b"{}").build()?;
/// let sender = outbox.clone();
/// idem.run_in_transaction(&request, move |tx, _lease| {
///     // ... the charge's own rows ...
///     sender.enqueue(tx, &Message::json(&serde_json::json!({"type": "charge.succeeded"}))?.to("merchant"))?;
///     Ok::<_, idem_outbox::OutboxError>(StoredResponse::new(201, "charged"))
/// }).await?;
/// assert_eq!(outbox.counts().await?.pending, 1);
/// # Ok(())
/// # }
/// ```
#[derive(Debug, Clone)]
pub struct SqliteOutbox {
    inner: Arc<Inner>,
}

#[derive(Debug)]
struct Inner {
    store: SqliteStore,
    /// The database file, to tell the store's transactions from others.
    path: Option<String>,
    max_payload: usize,
    wake: Arc<Notify>,
}

/// Now, in ms since the Unix epoch, from the process clock.
fn now_ms() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(millis)
        .unwrap_or(0)
}

impl SqliteOutbox {
    /// The outbox of `store`'s file: creates its tables if they do not exist (on the store's
    /// writer).
    pub async fn open(store: &SqliteStore) -> Result<Self, OutboxError> {
        store.try_call(|db| db.execute_batch(sql::SCHEMA)).await?;
        let path = store.read(|db| db.path().map(str::to_owned)).await?;
        Ok(Self {
            inner: Arc::new(Inner {
                store: store.clone(),
                path,
                max_payload: DEFAULT_MAX_PAYLOAD,
                wake: Arc::new(Notify::new()),
            }),
        })
    }

    /// The same outbox with another payload limit (default [`DEFAULT_MAX_PAYLOAD`], 256 KiB).
    #[must_use]
    pub fn max_payload(self, bytes: usize) -> Self {
        let inner = &self.inner;
        Self {
            inner: Arc::new(Inner {
                store: inner.store.clone(),
                path: inner.path.clone(),
                max_payload: bytes,
                wake: Arc::clone(&inner.wake),
            }),
        }
    }

    /// Registers `endpoint` under its name, or replaces the one of that name (its failures
    /// forgotten). An endpoint enabled again gets its waiting deliveries due at once.
    pub async fn register(&self, endpoint: &Endpoint) -> Result<(), OutboxError> {
        let e = endpoint.clone();
        self.inner
            .store
            .try_call(move |db| {
                let now = now_ms();
                let tx = db.transaction_with_behavior(TransactionBehavior::Immediate)?;
                // An endpoint enabled again gets its waiting deliveries due at once.
                tx.execute(sql::ENDPOINT_REENABLED, params![e.name, now, e.enabled])?;
                tx.execute(
                    sql::ENDPOINT_UPSERT,
                    params![
                        e.name,
                        e.url.as_str(),
                        e.stored_secrets(),
                        millis(e.timeout),
                        e.schedule.to_stored(),
                        e.enabled,
                        now
                    ],
                )?;
                tx.commit()
            })
            .await?;
        Ok(())
    }

    /// The endpoint registered as `name`. A row whose columns cannot be decoded (of another
    /// type than the outbox writes) is [`OutboxError::Corrupt`] (C12), never a store error.
    pub async fn endpoint(&self, name: &str) -> Result<Option<Endpoint>, OutboxError> {
        let name = name.to_owned();
        let row = self
            .inner
            .store
            .read(move |db| {
                db.query_row(sql::ENDPOINT_SELECT, [name], |row| Ok(endpoint_row(row)))
                    .optional()
            })
            .await?
            .map_err(store_error)?;
        row.map(|decoded| {
            let (name, url, secrets, timeout, schedule, enabled) =
                decoded.map_err(|e| OutboxError::Corrupt(e.to_string()))?;
            Endpoint::from_stored(name, &url, &secrets, timeout, &schedule, enabled)
        })
        .transpose()
    }

    /// Enqueues `message` **in the effect's transaction** `tx`: one statement, one delivery per
    /// endpoint it names, all due at once; they commit with the effect or vanish with it. A
    /// dispatcher of this process is woken and claims them once the transaction ends.
    ///
    /// Refused, nothing written: an invalid message or a payload over the limit, an endpoint
    /// that is not registered ([`OutboxError::UnknownEndpoint`]), a transaction on another
    /// database than the store's ([`OutboxError::NotInEffectTransaction`]).
    pub fn enqueue(
        &self,
        tx: &Transaction<'_>,
        message: &Message,
    ) -> Result<MessageId, OutboxError> {
        message.check(self.inner.max_payload)?;
        if tx.path() != self.inner.path.as_deref() {
            return Err(OutboxError::NotInEffectTransaction(
                "the transaction is not on the outbox's SQLite database",
            ));
        }
        let inserted = tx
            .execute(
                sql::ENQUEUE,
                params![
                    message.id().as_str(),
                    message.payload(),
                    message.content_type(),
                    message.stored_headers(),
                    now_ms(),
                    message.stored_endpoints()
                ],
            )
            .map_err(store_error)?;
        if inserted != message.endpoints().len() {
            return Err(OutboxError::UnknownEndpoint(message.endpoints().join(", ")));
        }
        self.inner.wake.notify_waiters();
        Ok(message.id().clone())
    }

    /// The deliveries of message `id`, by endpoint name.
    pub async fn deliveries(&self, id: &MessageId) -> Result<Vec<DeliveryInfo>, OutboxError> {
        let id = id.as_str().to_owned();
        self.delivery_rows(move |db| {
            let mut statement = db.prepare_cached(sql::DELIVERIES_OF)?;
            let rows = statement.query_map([id], delivery_row)?;
            rows.collect()
        })
        .await
    }

    /// The deliveries `ids` found, in one statement, each row decoded on its own: `None` for
    /// one that cannot be (C12), so that it never hides the others.
    pub(crate) async fn deliveries_by_id(
        &self,
        ids: &[i64],
    ) -> Result<Vec<(i64, Option<DeliveryInfo>)>, OutboxError> {
        let ids = serde_json::Value::from(ids.to_vec()).to_string();
        let rows = self
            .inner
            .store
            .read(move |db| {
                let mut statement = db.prepare_cached(sql::DELIVERIES_BY_ID)?;
                let rows = statement.query_map([ids], |row| {
                    Ok((row.get::<_, i64>(0)?, delivery_row(row).ok()))
                })?;
                rows.collect::<Result<Vec<_>, _>>()
            })
            .await?
            .map_err(store_error)?;
        Ok(rows
            .into_iter()
            .map(|(id, row)| {
                let info = row.and_then(
                    |(id, message_id, endpoint, state, attempts, status, error)| {
                        delivery_info(id, message_id, endpoint, &state, attempts, status, error)
                            .ok()
                    },
                );
                (id, info)
            })
            .collect())
    }

    /// Up to `limit` deliveries in `state`, oldest first (an operator's list).
    pub async fn list(
        &self,
        state: DeliveryState,
        limit: usize,
    ) -> Result<Vec<DeliveryInfo>, OutboxError> {
        let limit = i64::try_from(limit).unwrap_or(i64::MAX);
        self.delivery_rows(move |db| {
            let mut statement = db.prepare_cached(sql::LIST)?;
            let rows = statement.query_map(params![state.as_str(), limit], delivery_row)?;
            rows.collect()
        })
        .await
    }

    async fn delivery_rows<F>(&self, read: F) -> Result<Vec<DeliveryInfo>, OutboxError>
    where
        F: FnOnce(
                &idem_sqlite::rusqlite::Connection,
            ) -> idem_sqlite::rusqlite::Result<Vec<DeliveryRow>>
            + Send
            + 'static,
    {
        let rows = self.inner.store.read(read).await?.map_err(store_error)?;
        rows.into_iter()
            .map(
                |(id, message_id, endpoint, state, attempts, status, error)| {
                    delivery_info(id, message_id, endpoint, &state, attempts, status, error)
                },
            )
            .collect()
    }

    /// Attempts message `id` again at once, with a fresh schedule and the same id, on each of
    /// its dead deliveries: how many.
    pub async fn retry(&self, id: &MessageId) -> Result<u64, OutboxError> {
        self.requeue(id, true).await
    }

    /// Attempts message `id` again at once, with a fresh schedule and the same id, on each of
    /// its deliveries that no dispatcher holds, delivered ones included: how many.
    pub async fn replay(&self, id: &MessageId) -> Result<u64, OutboxError> {
        self.requeue(id, false).await
    }

    async fn requeue(&self, id: &MessageId, dead_only: bool) -> Result<u64, OutboxError> {
        let id = id.as_str().to_owned();
        let changed = self
            .inner
            .store
            .try_call(move |db| db.execute(sql::REQUEUE, params![id, now_ms(), dead_only]))
            .await?;
        self.inner.wake.notify_waiters();
        Ok(u64::try_from(changed).unwrap_or(u64::MAX))
    }

    /// Deletes at most `batch` deliveries delivered, or dead, longer ago than `retention`
    /// says, with their attempts: how many (call it until it returns less than `batch`).
    pub async fn purge(&self, retention: Retention, batch: usize) -> Result<u64, OutboxError> {
        let now = now_ms();
        let delivered = now.saturating_sub(millis(retention.delivered));
        let dead = now.saturating_sub(millis(retention.dead));
        let batch = i64::try_from(batch).unwrap_or(i64::MAX);
        let purged = self
            .inner
            .store
            .try_call(move |db| {
                let tx = db.transaction()?;
                tx.execute(sql::PURGE_ATTEMPTS, params![delivered, dead, batch])?;
                let purged = tx.execute(sql::PURGE_DELIVERIES, params![delivered, dead, batch])?;
                tx.commit()?;
                Ok(purged)
            })
            .await?;
        Ok(u64::try_from(purged).unwrap_or(u64::MAX))
    }

    /// How long ago the oldest pending delivery was enqueued (`None`: none is pending).
    pub async fn oldest_pending_age(&self) -> Result<Option<Duration>, OutboxError> {
        let oldest: Option<i64> = self
            .inner
            .store
            .read(|db| db.query_row(sql::OLDEST_PENDING, [], |row| row.get(0)))
            .await?
            .map_err(store_error)?;
        Ok(oldest.map(|at| {
            Duration::from_millis(u64::try_from(now_ms().saturating_sub(at)).unwrap_or(0))
        }))
    }

    /// The recorded attempts of delivery `delivery` ([`DeliveryInfo::id`]), in order.
    pub async fn attempts(&self, delivery: i64) -> Result<Vec<AttemptInfo>, OutboxError> {
        let rows = self
            .inner
            .store
            .read(move |db| {
                let mut statement = db.prepare_cached(sql::ATTEMPTS_OF)?;
                let rows = statement.query_map([delivery], attempt_row)?;
                rows.collect::<Result<Vec<_>, _>>()
            })
            .await?
            .map_err(store_error)?;
        rows.into_iter().collect()
    }

    /// How many deliveries are pending, delayed and dead.
    pub async fn counts(&self) -> Result<Counts, OutboxError> {
        let now = now_ms();
        let (pending, delayed, dead) = self
            .inner
            .store
            .read(move |db| {
                db.query_row(sql::COUNTS, [now], |row| {
                    Ok((
                        row.get::<_, i64>(0)?,
                        row.get::<_, i64>(1)?,
                        row.get::<_, i64>(2)?,
                    ))
                })
            })
            .await?
            .map_err(store_error)?;
        let count =
            |n: i64| u64::try_from(n).map_err(|_| OutboxError::Corrupt("a negative count".into()));
        Ok(Counts {
            pending: count(pending)?,
            delayed: count(delayed)?,
            dead: count(dead)?,
        })
    }

    /// A dispatcher of this outbox (not started).
    pub fn dispatcher(&self) -> Dispatcher {
        Dispatcher::new(crate::backend::Backend::Sqlite(self.clone()))
    }

    pub(crate) fn wake(&self) -> Arc<Notify> {
        Arc::clone(&self.inner.wake)
    }

    /// Claims up to `limit` due deliveries for `lease` under `token`: the claimed ones, and
    /// those whose row cannot be decoded (C12: each row on its own, so one bad row holds up no
    /// other).
    pub(crate) async fn claim(
        &self,
        token: &str,
        lease: Duration,
        limit: usize,
    ) -> Result<Taken, OutboxError> {
        let token = token.to_owned();
        let limit = i64::try_from(limit).unwrap_or(i64::MAX);
        let rows = self
            .inner
            .store
            .try_call(move |db| {
                let mut statement = db.prepare_cached(sql::CLAIM)?;
                let rows = statement
                    .query_map(params![token, now_ms(), millis(lease), limit], |row| {
                        Ok((row.get::<_, i64>(0)?, claimed_row(row)))
                    })?;
                rows.collect::<Result<Vec<_>, _>>()
            })
            .await?;
        let mut taken = Taken::default();
        for (id, row) in rows {
            match row {
                Ok(claimed) => taken.claimed.push(claimed),
                Err((columns, error)) => {
                    let (message_id, endpoint, attempt) = columns;
                    let undecodable = Undecodable::new(id, message_id, endpoint, attempt, &error);
                    taken.undecodable.push(undecodable);
                }
            }
        }
        Ok(taken)
    }

    /// Ends claims of `token` that made no attempt, in one transaction, each giving its
    /// attempt back: `(delivery, Some(error))` dead, `(delivery, None)` released, due again
    /// after `pause`. For each, whether its claim was still the delivery's (ended).
    pub(crate) async fn abandon(
        &self,
        token: &str,
        ends: &[(i64, Option<String>)],
        pause: Duration,
    ) -> Result<Vec<bool>, OutboxError> {
        if ends.is_empty() {
            return Ok(Vec::new());
        }
        let (token, ends) = (token.to_owned(), ends.to_vec());
        let ended = self
            .inner
            .store
            .try_call(move |db| {
                let tx = db.transaction()?;
                let now = now_ms();
                let due = now.saturating_add(millis(pause));
                let mut ended = Vec::with_capacity(ends.len());
                for (id, error) in &ends {
                    let changed = tx.execute(sql::ABANDON, params![id, token, error, now, due])?;
                    ended.push(changed == 1);
                }
                tx.commit()?;
                Ok(ended)
            })
            .await?;
        Ok(ended)
    }

    /// Records attempts' ends, the attempts and their endpoints' health, each under its claim,
    /// in one transaction, in order: for each record, `false` when its claim is no longer the
    /// delivery's (nothing of it written).
    pub(crate) async fn record(&self, records: &[Record]) -> Result<Vec<bool>, OutboxError> {
        if records.is_empty() {
            return Ok(Vec::new());
        }
        let records = records.to_vec();
        let recorded = self
            .inner
            .store
            .try_call(move |db| {
                let tx = db.transaction()?;
                let now = now_ms();
                let mut recorded = Vec::with_capacity(records.len());
                for r in &records {
                    let changed = tx.execute(
                        sql::RECORD,
                        params![
                            r.delivery,
                            r.token,
                            r.state.as_str(),
                            now.saturating_add(millis(r.delay)),
                            r.status,
                            r.error,
                            now
                        ],
                    )?;
                    if changed == 1 {
                        tx.execute(
                            sql::ATTEMPT_INSERT,
                            params![
                                r.delivery,
                                now.saturating_sub(millis(r.started_ago())),
                                millis(r.duration),
                                r.status,
                                r.error,
                                r.response
                            ],
                        )?;
                        let ok = r.state == DeliveryState::Delivered;
                        tx.execute(
                            sql::ENDPOINT_HEALTH,
                            params![r.endpoint, ok, now, millis(r.disable_after)],
                        )?;
                    }
                    recorded.push(changed == 1);
                }
                tx.commit()?;
                Ok(recorded)
            })
            .await?;
        Ok(recorded)
    }
}

/// A delivery's columns, as read.
type DeliveryRow = (
    i64,
    String,
    String,
    String,
    i64,
    Option<i64>,
    Option<String>,
);

fn delivery_row(row: &Row<'_>) -> idem_sqlite::rusqlite::Result<DeliveryRow> {
    Ok((
        row.get(0)?,
        row.get(1)?,
        row.get(2)?,
        row.get(3)?,
        row.get(4)?,
        row.get(5)?,
        row.get(6)?,
    ))
}

/// An endpoint's columns, as read.
type EndpointRow = (String, String, String, i64, String, bool);

/// A row of `endpoint_select.sql`, its columns decoded: an error is the row's (C12).
fn endpoint_row(row: &Row<'_>) -> idem_sqlite::rusqlite::Result<EndpointRow> {
    Ok((
        row.get(0)?,
        row.get(1)?,
        row.get(2)?,
        row.get(3)?,
        row.get(4)?,
        row.get(5)?,
    ))
}

/// What of an undecodable claimed row could be read: its message id, endpoint and attempts.
type ReadColumns = (Option<String>, Option<String>, Option<i64>);

/// A row of `claim.sql`, decoded; when it cannot be, what of it could be read, and why.
fn claimed_row(row: &Row<'_>) -> Result<Claimed, (ReadColumns, OutboxError)> {
    let corrupt = |e: idem_sqlite::rusqlite::Error| OutboxError::Corrupt(e.to_string());
    let decode = || -> Result<Claimed, OutboxError> {
        let headers: String = row.get(5).map_err(corrupt)?;
        let attempt: i64 = row.get(6).map_err(corrupt)?;
        Ok(Claimed {
            id: row.get(0).map_err(corrupt)?,
            message_id: MessageId::from_stored(row.get::<_, String>(1).map_err(corrupt)?),
            endpoint: row.get(2).map_err(corrupt)?,
            payload: row.get(3).map_err(corrupt)?,
            content_type: row.get(4).map_err(corrupt)?,
            headers: headers_from_stored(&headers)?,
            attempt: u32::try_from(attempt).map_err(|_| OutboxError::Corrupt("attempts".into()))?,
        })
    };
    decode().map_err(|error| {
        let columns = (row.get(1).ok(), row.get(2).ok(), row.get(6).ok());
        (columns, error)
    })
}

fn attempt_row(row: &Row<'_>) -> idem_sqlite::rusqlite::Result<Result<AttemptInfo, OutboxError>> {
    let attempt: i64 = row.get(0)?;
    let status: Option<i64> = row.get(3)?;
    Ok(attempt_info(
        attempt,
        row.get(1)?,
        row.get(2)?,
        status,
        row.get(4)?,
        row.get::<_, Option<Vec<u8>>>(5)?.unwrap_or_default(),
    ))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::claim::DeliveryState;

    fn record(delivery: i64, token: &str, status: u16) -> Record {
        Record {
            delivery,
            token: token.to_owned(),
            state: DeliveryState::Delivered,
            delay: Duration::ZERO,
            status: Some(status),
            error: None,
            response: b"ok".to_vec(),
            duration: Duration::from_millis(3),
            ended: std::time::Instant::now(),
            endpoint: "m".to_owned(),
            disable_after: Duration::from_secs(60),
        }
    }

    /// A store in a temporary directory with its outbox and `endpoints` registered (a port
    /// nothing listens on).
    async fn with_endpoints(
        endpoints: &[&str],
    ) -> Result<(tempfile::TempDir, SqliteStore, SqliteOutbox), Box<dyn std::error::Error>> {
        let dir = tempfile::tempdir()?;
        let store = SqliteStore::open(dir.path().join("outbox.db")).await?;
        let outbox = SqliteOutbox::open(&store).await?;
        for name in endpoints {
            outbox
                .register(&Endpoint::new(
                    name,
                    "http://127.0.0.1:9/",
                    ["whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw"],
                )?)
                .await?;
        }
        Ok((dir, store, outbox))
    }

    /// C12: the dead ends a dispatcher confirms are read by id in one statement, each row
    /// decoded on its own: an undecodable one is `None` and hides no other; an absent one is
    /// not returned.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn c12_deliveries_by_id_decodes_each_row_on_its_own(
    ) -> Result<(), Box<dyn std::error::Error>> {
        let (_dir, store, outbox) = with_endpoints(&["a", "b"]).await?;
        let sender = outbox.clone();
        let id = store
            .call(move |db| {
                let tx = db.transaction().map_err(store_error)?;
                let id = sender.enqueue(&tx, &Message::bytes("a/b", "x").to("a").to("b"))?;
                tx.execute(
                    "UPDATE idem_outbox_deliveries SET state = 'shelved' WHERE endpoint = 'b'",
                    [],
                )
                .map_err(store_error)?;
                tx.commit().map_err(store_error)?;
                Ok::<_, OutboxError>(id)
            })
            .await??;
        let ids: Vec<i64> = store
            .call(|db| {
                let mut statement = db
                    .prepare("SELECT id FROM idem_outbox_deliveries ORDER BY endpoint")
                    .map_err(store_error)?;
                let rows = statement
                    .query_map([], |row| row.get(0))
                    .map_err(store_error)?;
                rows.collect::<Result<Vec<i64>, _>>().map_err(store_error)
            })
            .await??;
        let mut found = outbox
            .deliveries_by_id(&[ids[0], ids[1], ids[1] + 100])
            .await?;
        found.sort_by_key(|(id, _)| *id);
        assert_eq!(found.len(), 2, "{found:?}");
        let (first, readable) = &found[0];
        let readable = readable.as_ref().ok_or("delivery a decoded")?;
        assert_eq!(
            (*first, &readable.message_id, readable.endpoint.as_str()),
            (ids[0], &id, "a")
        );
        assert_eq!((found[1].0, found[1].1.is_none()), (ids[1], true));
        Ok(())
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn c17_a_stale_claim_cannot_record_over_a_newer_one(
    ) -> Result<(), Box<dyn std::error::Error>> {
        let (_dir, store, outbox) = with_endpoints(&["m"]).await?;
        let sender = outbox.clone();
        let id = store
            .call(move |db| {
                let tx = db.transaction().map_err(store_error)?;
                let id = sender.enqueue(&tx, &Message::bytes("a/b", "x").to("m"))?;
                tx.commit().map_err(store_error)?;
                Ok::<_, OutboxError>(id)
            })
            .await??;
        let first = outbox
            .claim("old", Duration::from_millis(100), 10)
            .await?
            .claimed;
        assert_eq!(first.len(), 1);
        // Claimed: no other dispatcher gets it while the claim lasts.
        assert!(outbox
            .claim("other", Duration::from_millis(100), 10)
            .await?
            .claimed
            .is_empty());
        tokio::time::sleep(Duration::from_millis(150)).await;
        let second = outbox
            .claim("new", Duration::from_secs(60), 10)
            .await?
            .claimed;
        assert_eq!((second.len(), second[0].attempt), (1, 2));
        // The stale dispatcher's result changes nothing; the newer one's lands once.
        assert_eq!(
            outbox.record(&[record(first[0].id, "old", 500)]).await?,
            [false]
        );
        assert_eq!(
            outbox.record(&[record(second[0].id, "new", 200)]).await?,
            [true]
        );
        assert_eq!(
            outbox.record(&[record(second[0].id, "new", 200)]).await?,
            [false]
        );
        let delivery = &outbox.deliveries(&id).await?[0];
        assert_eq!(
            (delivery.state, delivery.last_status),
            (DeliveryState::Delivered, Some(200))
        );
        let attempts = outbox.attempts(delivery.id).await?;
        assert_eq!(
            attempts
                .iter()
                .map(|a| (a.attempt, a.status))
                .collect::<Vec<_>>(),
            [(2, Some(200))]
        );
        Ok(())
    }
}
