//! `PgOutbox`: the outbox in a PostgreSQL store's database.

use std::sync::Arc;
use std::time::Duration;

use idem_postgres::sqlx::postgres::{PgConnection, PgRow};
use idem_postgres::sqlx::{self, AssertSqlSafe, Connection, Row};
use idem_postgres::{store_error, Param, PgStore};
use tokio::sync::Notify;

use crate::backend::{bounded, STORE_TIMEOUT};
use crate::claim::{millis, Claimed, Record, Taken, Undecodable};
use crate::inspect::{attempt_info, delivery_info};
use crate::message::headers_from_stored;
use crate::{
    AttemptInfo, Counts, DeliveryInfo, DeliveryState, Dispatcher, Endpoint, Message, MessageId,
    OutboxError, Retention, DEFAULT_MAX_PAYLOAD,
};

/// The outbox's statements.
mod sql {
    pub(super) const SCHEMA: &str = include_str!("../sql/postgres/schema.sql");
    pub(super) const ENDPOINT_UPSERT: &str = include_str!("../sql/postgres/endpoint_upsert.sql");
    pub(super) const ENDPOINT_SELECT: &str = include_str!("../sql/postgres/endpoint_select.sql");
    pub(super) const ENQUEUE: &str = include_str!("../sql/postgres/enqueue.sql");
    pub(super) const CLAIM: &str = include_str!("../sql/postgres/claim.sql");
    pub(super) const RECORD: &str = include_str!("../sql/postgres/record.sql");
    pub(super) const ABANDON: &str = include_str!("../sql/postgres/abandon.sql");
    pub(super) const RECORD_DELIVERED: &str = include_str!("../sql/postgres/record_delivered.sql");
    pub(super) const ENDPOINT_RECOVERED: &str =
        include_str!("../sql/postgres/endpoint_recovered.sql");
    pub(super) const DELIVERIES_OF: &str = include_str!("../sql/postgres/deliveries_of.sql");
    pub(super) const DELIVERIES_BY_ID: &str = include_str!("../sql/postgres/deliveries_by_id.sql");
    pub(super) const ATTEMPTS_OF: &str = include_str!("../sql/postgres/attempts_of.sql");
    pub(super) const COUNTS: &str = include_str!("../sql/postgres/counts.sql");
    pub(super) const LIST: &str = include_str!("../sql/postgres/list.sql");
    pub(super) const REQUEUE: &str = include_str!("../sql/postgres/requeue.sql");
    pub(super) const PURGE: &str = include_str!("../sql/postgres/purge.sql");
    pub(super) const OLDEST_PENDING: &str = include_str!("../sql/postgres/oldest_pending.sql");
}

/// A delivery's row, checked.
fn delivery_row(row: &PgRow) -> Result<DeliveryInfo, OutboxError> {
    let get = || -> Result<_, sqlx::Error> {
        Ok((
            row.try_get::<i64, _>(0)?,
            row.try_get::<String, _>(1)?,
            row.try_get::<String, _>(2)?,
            row.try_get::<String, _>(3)?,
            row.try_get::<i32, _>(4)?,
            row.try_get::<Option<i32>, _>(5)?,
            row.try_get::<Option<String>, _>(6)?,
        ))
    };
    let (id, message_id, endpoint, state, attempts, status, error) = get().map_err(store_error)?;
    delivery_info(
        id,
        message_id,
        endpoint,
        &state,
        attempts.into(),
        status.map(i64::from),
        error,
    )
}

/// A row of `claim.sql`, decoded: `None` for a delivery set aside (its endpoint disabled).
/// One whose endpoint is gone is claimed: the dispatcher ends it dead.
fn claimed_row(row: &PgRow, id: i64) -> Result<Option<Claimed>, OutboxError> {
    let get = || -> Result<_, sqlx::Error> {
        Ok((
            row.try_get::<String, _>(1)?,
            row.try_get::<String, _>(2)?,
            row.try_get::<Vec<u8>, _>(3)?,
            row.try_get::<String, _>(4)?,
            row.try_get::<String, _>(5)?,
            row.try_get::<i32, _>(6)?,
            row.try_get::<Option<bool>, _>(7)?,
        ))
    };
    let (message_id, endpoint, payload, content_type, headers, attempt, enabled) =
        get().map_err(|e| OutboxError::Corrupt(e.to_string()))?;
    // `None`: the endpoint is gone; claimed, and ended dead by the dispatcher.
    if enabled == Some(false) {
        return Ok(None);
    }
    Ok(Some(Claimed {
        id,
        message_id: MessageId::from_stored(message_id),
        endpoint,
        payload,
        content_type,
        headers: headers_from_stored(&headers)?,
        attempt: u32::try_from(attempt).map_err(|_| OutboxError::Corrupt("attempts".into()))?,
    }))
}

/// The channel enqueues notify and dispatchers listen on.
pub const CHANNEL: &str = "idem_outbox";

/// The outbox in the database of a [`PgStore`], beside its records: messages are enqueued in
/// the effect's transaction (`run_in_transaction`'s connection), so the effect, its
/// idempotency record and its messages commit together or not at all (C17).
///
/// Dispatchers in any number of processes claim due deliveries with `FOR UPDATE SKIP LOCKED`
/// and a lease; each is woken by the enqueue's notification (`LISTEN`/`NOTIFY`, sent by
/// PostgreSQL when the enqueuing transaction commits) and polls besides. Times are the
/// server's (C11). Each of its own calls has a deadline ([`store_timeout`](Self::store_timeout)).
/// Cloning is cheap.
///
/// ```no_run
/// use idem_core::{Idempotency, StoredResponse};
/// use idem_outbox::{Endpoint, Message, PgOutbox};
/// use idem_postgres::{PgIdempotency, PgStore};
/// # async fn demo() -> Result<(), Box<dyn std::error::Error>> {
/// let store = PgStore::connect("postgres://app@localhost/payments").await?;
/// let outbox = PgOutbox::open(&store).await?;
/// outbox.register(&Endpoint::new("merchant", "https://merchant.example/hooks", ["whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw"])?).await?;
/// let _dispatching = outbox.dispatcher().start()?;
/// let idem = Idempotency::new(store);
/// let request = idem.request("acct_1", "POST", "/charges").key(Some("k-1")).body(b"{}").build()?;
/// let sender = outbox.clone();
/// idem.run_in_transaction(&request, move |tx, _lease| Box::pin(async move {
///     // ... the charge's own rows ...
///     let message = Message::json(&serde_json::json!({"type": "charge.succeeded"}))?.to("merchant");
///     sender.enqueue(&mut *tx, &message).await?;
///     Ok::<_, idem_outbox::OutboxError>(StoredResponse::new(201, "charged"))
/// })).await?;
/// # Ok(())
/// # }
/// ```
#[derive(Debug, Clone)]
pub struct PgOutbox {
    inner: Arc<Inner>,
}

#[derive(Debug, Clone)]
struct Inner {
    store: PgStore,
    max_payload: usize,
    store_timeout: Duration,
}

impl PgOutbox {
    /// The outbox of `store`'s database: creates its tables if they do not exist, under the
    /// store's migration lock.
    pub async fn open(store: &PgStore) -> Result<Self, OutboxError> {
        bounded(STORE_TIMEOUT, async {
            let mut tx = store.pool().begin().await.map_err(store_error)?;
            store.lock_migrations(&mut tx).await?;
            sqlx::raw_sql(AssertSqlSafe(sql::SCHEMA))
                .execute(&mut *tx)
                .await
                .map_err(store_error)?;
            tx.commit().await.map_err(store_error)?;
            Ok(Self {
                inner: Arc::new(Inner {
                    store: store.clone(),
                    max_payload: DEFAULT_MAX_PAYLOAD,
                    store_timeout: STORE_TIMEOUT,
                }),
            })
        })
        .await
    }

    /// The outbox of `store`'s database as it already is, for tools that read or operate on
    /// its deliveries (the `idem` command): unlike [`open`](Self::open) it runs no DDL and
    /// takes no lock (`CREATE INDEX IF NOT EXISTS` takes a SHARE lock on the deliveries even
    /// when the index exists, waiting for every open transaction that enqueued and holding up
    /// every enqueue behind it). Its tables must exist, as `open` leaves them.
    pub fn existing(store: &PgStore) -> Self {
        Self {
            inner: Arc::new(Inner {
                store: store.clone(),
                max_payload: DEFAULT_MAX_PAYLOAD,
                store_timeout: STORE_TIMEOUT,
            }),
        }
    }

    /// The same outbox with another payload limit (default [`DEFAULT_MAX_PAYLOAD`], 256 KiB).
    #[must_use]
    pub fn max_payload(self, bytes: usize) -> Self {
        Self {
            inner: Arc::new(Inner {
                max_payload: bytes,
                ..(*self.inner).clone()
            }),
        }
    }

    /// The same outbox with another deadline for each of its own calls (default 10 s): a
    /// database that does not answer in time is [`OutboxError::Timeout`], never a hang (C13).
    /// [`enqueue`](Self::enqueue) runs in your transaction, bounded as you bound it; a
    /// dispatcher has its own ([`Dispatcher::store_timeout`]).
    ///
    /// ```no_run
    /// # async fn demo(store: idem_postgres::PgStore) -> Result<(), idem_outbox::OutboxError> {
    /// use std::time::Duration;
    /// let outbox = idem_outbox::PgOutbox::open(&store).await?.store_timeout(Duration::from_secs(2));
    /// println!("{} dead", outbox.counts().await?.dead);
    /// # Ok(())
    /// # }
    /// ```
    #[must_use]
    pub fn store_timeout(self, deadline: Duration) -> Self {
        Self {
            inner: Arc::new(Inner {
                store_timeout: deadline.max(Duration::from_millis(1)),
                ..(*self.inner).clone()
            }),
        }
    }

    /// `call` within this outbox's deadline.
    async fn bounded<T>(
        &self,
        call: impl std::future::Future<Output = Result<T, OutboxError>>,
    ) -> Result<T, OutboxError> {
        bounded(self.inner.store_timeout, call).await
    }

    /// The rows of `sql` with `params` on a connection of the store's pool, sent as the store
    /// sends its own statements (prepared, or inline behind PgBouncer in transaction mode).
    async fn rows(&self, sql: &str, params: &[Param<'_>]) -> Result<Vec<PgRow>, OutboxError> {
        let mut conn = self
            .inner
            .store
            .pool()
            .acquire()
            .await
            .map_err(store_error)?;
        Ok(self.inner.store.fetch_all(&mut conn, sql, params).await?)
    }

    /// The one row of `sql`, which returns one.
    async fn row(&self, sql: &str, params: &[Param<'_>]) -> Result<PgRow, OutboxError> {
        self.rows(sql, params)
            .await?
            .into_iter()
            .next()
            .ok_or_else(|| OutboxError::Corrupt("a statement returned no row".into()))
    }

    /// Registers `endpoint` under its name, or replaces the one of that name (its failures
    /// forgotten).
    pub async fn register(&self, endpoint: &Endpoint) -> Result<(), OutboxError> {
        self.bounded(async {
            let secrets = endpoint.stored_secrets();
            let schedule = endpoint.schedule.to_stored();
            self.rows(
                sql::ENDPOINT_UPSERT,
                &[
                    Param::Text(&endpoint.name),
                    Param::Text(endpoint.url.as_str()),
                    Param::Text(&secrets),
                    Param::Int(millis(endpoint.timeout)),
                    Param::Text(&schedule),
                    Param::Bool(endpoint.enabled),
                ],
            )
            .await?;
            Ok(())
        })
        .await
    }

    /// The endpoint registered as `name`. A column that cannot be decoded (of another type
    /// than the outbox writes) is [`OutboxError::Corrupt`] (C12), never a store error.
    pub async fn endpoint(&self, name: &str) -> Result<Option<Endpoint>, OutboxError> {
        self.bounded(async {
            let row = self
                .rows(sql::ENDPOINT_SELECT, &[Param::Text(name)])
                .await?
                .into_iter()
                .next();
            row.map(|row| {
                let get = |row: &PgRow| -> Result<_, sqlx::Error> {
                    Ok((
                        row.try_get::<String, _>(0)?,
                        row.try_get::<String, _>(1)?,
                        row.try_get::<String, _>(2)?,
                        row.try_get::<i64, _>(3)?,
                        row.try_get::<String, _>(4)?,
                        row.try_get::<bool, _>(5)?,
                    ))
                };
                let (name, url, secrets, timeout, schedule, enabled) =
                    get(&row).map_err(endpoint_error)?;
                Endpoint::from_stored(name, &url, &secrets, timeout, &schedule, enabled)
            })
            .transpose()
        })
        .await
    }

    /// Enqueues `message` **in the effect's transaction** on `conn`: one statement, one
    /// delivery per endpoint it names, all due at once; they commit with the effect or vanish
    /// with it, and the dispatchers are notified when it commits.
    ///
    /// Refused, nothing written: an invalid message or a payload over the limit, an endpoint
    /// that is not registered ([`OutboxError::UnknownEndpoint`]), a connection outside a
    /// transaction ([`OutboxError::NotInEffectTransaction`]: the message would commit alone).
    pub async fn enqueue(
        &self,
        conn: &mut PgConnection,
        message: &Message,
    ) -> Result<MessageId, OutboxError> {
        message.check(self.inner.max_payload)?;
        if !conn.is_in_transaction() {
            return Err(OutboxError::NotInEffectTransaction(
                "the connection is not in a transaction",
            ));
        }
        let headers = message.stored_headers();
        let endpoints = message.stored_endpoints();
        let rows = self
            .inner
            .store
            .fetch_all(
                conn,
                sql::ENQUEUE,
                &[
                    Param::Text(message.id().as_str()),
                    Param::Bytes(message.payload()),
                    Param::Text(message.content_type()),
                    Param::Text(&headers),
                    Param::Text(&endpoints),
                    Param::Text(CHANNEL),
                ],
            )
            .await?;
        let inserted: i64 = match rows.first() {
            Some(row) => row.try_get(0).map_err(store_error)?,
            None => 0,
        };
        if usize::try_from(inserted).ok() != Some(message.endpoints().len()) {
            return Err(OutboxError::UnknownEndpoint(message.endpoints().join(", ")));
        }
        Ok(message.id().clone())
    }

    /// The deliveries of message `id`, by endpoint name.
    pub async fn deliveries(&self, id: &MessageId) -> Result<Vec<DeliveryInfo>, OutboxError> {
        self.bounded(async {
            let rows = self
                .rows(sql::DELIVERIES_OF, &[Param::Text(id.as_str())])
                .await?;
            rows.iter().map(delivery_row).collect()
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
        self.bounded(async {
            let rows = self
                .rows(sql::DELIVERIES_BY_ID, &[Param::Text(&ids)])
                .await?;
            Ok(rows
                .iter()
                .filter_map(|row| {
                    let id = row.try_get::<i64, _>(0).ok()?;
                    Some((id, delivery_row(row).ok()))
                })
                .collect())
        })
        .await
    }

    /// Up to `limit` deliveries in `state`, oldest first (an operator's list).
    pub async fn list(
        &self,
        state: DeliveryState,
        limit: usize,
    ) -> Result<Vec<DeliveryInfo>, OutboxError> {
        self.bounded(async {
            let limit = i64::try_from(limit).unwrap_or(i64::MAX);
            let rows = self
                .rows(sql::LIST, &[Param::Text(state.as_str()), Param::Int(limit)])
                .await?;
            rows.iter().map(delivery_row).collect()
        })
        .await
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
        self.bounded(async {
            let mut tx = self.inner.store.pool().begin().await.map_err(store_error)?;
            let store = &self.inner.store;
            let changed = store
                .execute(
                    &mut tx,
                    sql::REQUEUE,
                    &[Param::Text(id.as_str()), Param::Bool(dead_only)],
                )
                .await?;
            store
                .fetch_all(&mut tx, "SELECT pg_notify($1, '')", &[Param::Text(CHANNEL)])
                .await?;
            tx.commit().await.map_err(store_error)?;
            Ok(changed)
        })
        .await
    }

    /// Deletes at most `batch` deliveries delivered, or dead, longer ago than `retention`
    /// says, with their attempts: how many (call it until it returns less than `batch`).
    pub async fn purge(&self, retention: Retention, batch: usize) -> Result<u64, OutboxError> {
        self.bounded(async {
            let batch = i64::try_from(batch).unwrap_or(i64::MAX);
            let purged: i64 = self
                .row(
                    sql::PURGE,
                    &[
                        Param::Int(millis(retention.delivered)),
                        Param::Int(millis(retention.dead)),
                        Param::Int(batch),
                    ],
                )
                .await?
                .try_get(0)
                .map_err(store_error)?;
            Ok(u64::try_from(purged).unwrap_or(0))
        })
        .await
    }

    /// How long ago the oldest pending delivery was enqueued (`None`: none is pending).
    pub async fn oldest_pending_age(&self) -> Result<Option<Duration>, OutboxError> {
        self.bounded(async {
            let age: Option<i64> = self
                .row(sql::OLDEST_PENDING, &[])
                .await?
                .try_get(0)
                .map_err(store_error)?;
            Ok(age.map(|ms| Duration::from_millis(u64::try_from(ms).unwrap_or(0))))
        })
        .await
    }

    /// The recorded attempts of delivery `delivery` ([`DeliveryInfo::id`]), in order.
    pub async fn attempts(&self, delivery: i64) -> Result<Vec<AttemptInfo>, OutboxError> {
        self.bounded(async {
            let rows = self.rows(sql::ATTEMPTS_OF, &[Param::Int(delivery)]).await?;
            rows.iter()
                .map(|row| {
                    let get = || -> Result<_, sqlx::Error> {
                        Ok((
                            row.try_get::<i32, _>(0)?,
                            row.try_get::<i64, _>(1)?,
                            row.try_get::<i64, _>(2)?,
                            row.try_get::<Option<i32>, _>(3)?,
                            row.try_get::<Option<String>, _>(4)?,
                            row.try_get::<Option<Vec<u8>>, _>(5)?,
                        ))
                    };
                    let (attempt, started, duration, status, error, response) =
                        get().map_err(store_error)?;
                    attempt_info(
                        attempt.into(),
                        started,
                        duration,
                        status.map(i64::from),
                        error,
                        response.unwrap_or_default(),
                    )
                })
                .collect()
        })
        .await
    }

    /// How many deliveries are pending, delayed and dead.
    pub async fn counts(&self) -> Result<Counts, OutboxError> {
        self.bounded(async {
            let row = self.row(sql::COUNTS, &[]).await?;
            let count = |i: usize| -> Result<u64, OutboxError> {
                let n: i64 = row.try_get(i).map_err(store_error)?;
                u64::try_from(n).map_err(|_| OutboxError::Corrupt("a negative count".into()))
            };
            Ok(Counts {
                pending: count(0)?,
                delayed: count(1)?,
                dead: count(2)?,
            })
        })
        .await
    }

    /// A dispatcher of this outbox (not started).
    pub fn dispatcher(&self) -> Dispatcher {
        Dispatcher::new(crate::backend::Backend::Postgres(self.clone()))
    }

    /// Listens for enqueues and wakes `wake` on each, until the task is aborted. A lost
    /// connection is replaced (at once when it had been listening, then every second while
    /// the database refuses), and each new one wakes `wake` as it starts listening: what was
    /// committed while nobody listened is found by the claim that follows, not by the next
    /// poll.
    pub(crate) async fn listen(self, wake: Arc<Notify>) {
        loop {
            let mut listening = false;
            let result: Result<(), String> = async {
                // Where the store's own listener connects: behind a pooler in transaction
                // mode, the server itself (a LISTEN through the pooler stays on a server
                // connection other clients get).
                let store = &self.inner.store;
                let mut listener = store
                    .listener(&[CHANNEL])
                    .await
                    .map_err(|e| e.to_string())?;
                listening = true;
                wake.notify_waiters();
                // `None`: the connection was lost; a new one is opened.
                while listener
                    .try_recv()
                    .await
                    .map_err(|e| e.to_string())?
                    .is_some()
                {
                    wake.notify_waiters();
                }
                Err("the connection was lost".to_owned())
            }
            .await;
            if let Err(error) = result {
                tracing::warn!(%error, "outbox listener lost; listening again");
            }
            let pause = if listening {
                Duration::from_millis(50)
            } else {
                Duration::from_secs(1)
            };
            tokio::time::sleep(pause).await;
        }
    }

    /// Claims up to `limit` due deliveries for `lease` under `token`: the claimed ones, those
    /// whose row cannot be decoded (C12: each row on its own, so one bad row holds up no
    /// other), and how many due ones it set aside for `lease` because their endpoint is
    /// disabled.
    pub(crate) async fn claim(
        &self,
        token: &str,
        lease: Duration,
        limit: usize,
    ) -> Result<Taken, OutboxError> {
        let limit = i64::try_from(limit).unwrap_or(i64::MAX);
        let rows = self
            .rows(
                sql::CLAIM,
                &[
                    Param::Text(token),
                    Param::Int(millis(lease)),
                    Param::Int(limit),
                ],
            )
            .await?;
        let mut taken = Taken::default();
        for row in &rows {
            let id = row.try_get::<i64, _>(0).map_err(store_error)?;
            match claimed_row(row, id) {
                Ok(Some(claimed)) => taken.claimed.push(claimed),
                Ok(None) => taken.set_aside += 1,
                Err(error) => taken.undecodable.push(Undecodable::new(
                    id,
                    row.try_get(1).ok(),
                    row.try_get(2).ok(),
                    row.try_get::<i32, _>(6).ok().map(i64::from),
                    &error,
                )),
            }
        }
        Ok(taken)
    }

    /// Ends claims of `token` that made no attempt, in one statement, each giving its attempt
    /// back: `(delivery, Some(error))` dead, `(delivery, None)` released, due again after `pause`.
    /// For each, whether its claim was still the delivery's (ended).
    pub(crate) async fn abandon(
        &self,
        token: &str,
        ends: &[(i64, Option<String>)],
        pause: Duration,
    ) -> Result<Vec<bool>, OutboxError> {
        if ends.is_empty() {
            return Ok(Vec::new());
        }
        let list: Vec<serde_json::Value> = ends
            .iter()
            .map(|(id, error)| serde_json::json!({ "id": id, "error": error }))
            .collect();
        let list = serde_json::Value::Array(list).to_string();
        let ended = self
            .rows(
                sql::ABANDON,
                &[
                    Param::Text(token),
                    Param::Text(&list),
                    Param::Int(millis(pause)),
                ],
            )
            .await?
            .iter()
            .map(|row| row.try_get::<i64, _>(0))
            .collect::<Result<Vec<i64>, _>>()
            .map_err(store_error)?;
        Ok(ends.iter().map(|(id, _)| ended.contains(id)).collect())
    }

    /// Records attempts' ends, the attempts and their endpoints' health, each under its claim,
    /// in one statement: for each record, `false` when its claim is no longer the delivery's
    /// (nothing of it written). Attempts that all delivered skip the health part, unless one
    /// of their endpoints was failing: a second statement then clears it.
    pub(crate) async fn record(&self, records: &[Record]) -> Result<Vec<bool>, OutboxError> {
        if records.is_empty() {
            return Ok(Vec::new());
        }
        if records
            .iter()
            .all(|r| r.state == DeliveryState::Delivered && r.delay.is_zero())
        {
            return self.record_delivered(records).await;
        }
        let ids: Vec<i64> = records.iter().map(|r| r.delivery).collect();
        // One JSON array of the attempts (the response's first KiB in hex): one parameter,
        // which the simple protocol can carry as well as a prepared statement.
        let attempts: Vec<serde_json::Value> = records
            .iter()
            .map(|r| {
                serde_json::json!({
                    "id": r.delivery,
                    "token": r.token,
                    "state": r.state.as_str(),
                    "delay_ms": millis(r.delay),
                    "status": r.status,
                    "error": r.error,
                    "duration_ms": millis(r.duration),
                    "response": hex(&r.response),
                    "disable_after_ms": millis(r.disable_after),
                    "started_ago_ms": millis(r.started_ago()),
                })
            })
            .collect();
        let attempts = serde_json::Value::Array(attempts).to_string();
        let recorded = self
            .rows(sql::RECORD, &[Param::Text(&attempts)])
            .await?
            .iter()
            .map(|row| row.try_get::<i64, _>(0))
            .collect::<Result<Vec<i64>, _>>()
            .map_err(store_error)?;
        Ok(ids.iter().map(|id| recorded.contains(id)).collect())
    }

    /// [`record`](Self::record) of attempts that all delivered.
    async fn record_delivered(&self, records: &[Record]) -> Result<Vec<bool>, OutboxError> {
        let ids: Vec<i64> = records.iter().map(|r| r.delivery).collect();
        let attempts: Vec<serde_json::Value> = records
            .iter()
            .map(|r| {
                serde_json::json!({
                    "id": r.delivery,
                    "token": r.token,
                    "status": r.status,
                    "error": r.error,
                    "duration_ms": millis(r.duration),
                    "response": hex(&r.response),
                    "started_ago_ms": millis(r.started_ago()),
                })
            })
            .collect();
        let attempts = serde_json::Value::Array(attempts).to_string();
        let rows = self
            .rows(sql::RECORD_DELIVERED, &[Param::Text(&attempts)])
            .await?
            .iter()
            .map(|row| {
                Ok((
                    row.try_get::<i64, _>(0)?,
                    row.try_get::<Option<bool>, _>(1)?,
                ))
            })
            .collect::<Result<Vec<(i64, Option<bool>)>, sqlx::Error>>()
            .map_err(store_error)?;
        let recorded: Vec<bool> = ids
            .iter()
            .map(|id| rows.iter().any(|(row, _)| row == id))
            .collect();
        if rows.iter().any(|(_, failing)| *failing == Some(true)) {
            // The attempts are recorded: an endpoint left marked failing is cleared by its next
            // success, so this statement's failure is only logged.
            let mut endpoints: Vec<&str> = records
                .iter()
                .zip(&recorded)
                .filter(|(_, recorded)| **recorded)
                .map(|(r, _)| r.endpoint.as_str())
                .collect();
            endpoints.sort_unstable();
            endpoints.dedup();
            let endpoints = serde_json::Value::from(endpoints).to_string();
            if let Err(error) = self
                .rows(sql::ENDPOINT_RECOVERED, &[Param::Text(&endpoints)])
                .await
            {
                tracing::warn!(%error, "outbox endpoint's recovery not recorded");
            }
        }
        Ok(recorded)
    }
}

/// An error reading an endpoint's row: a column that cannot be decoded is the row's
/// ([`OutboxError::Corrupt`], C12: its deliveries end dead), anything else the database's.
fn endpoint_error(error: sqlx::Error) -> OutboxError {
    match error {
        sqlx::Error::ColumnDecode { .. } => OutboxError::Corrupt(error.to_string()),
        other => store_error(other).into(),
    }
}

/// `bytes` in lower-case hex (PostgreSQL's `decode(.., 'hex')` reads it back).
fn hex(bytes: &[u8]) -> String {
    const DIGITS: &[u8; 16] = b"0123456789abcdef";
    bytes
        .iter()
        .flat_map(|b| [DIGITS[usize::from(b >> 4)], DIGITS[usize::from(b & 15)]])
        .map(char::from)
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::claim::DeliveryState;
    use idem_postgres::sqlx::Executor;

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

    /// A new database on `IDEM_PG_URL` (a missing server fails the test).
    async fn fresh_database() -> Result<String, Box<dyn std::error::Error>> {
        let base = std::env::var("IDEM_PG_URL")
            .map_err(|_| "IDEM_PG_URL: start the servers (scripts/services.sh)")?;
        let name = format!(
            "outbox_unit_{}",
            &MessageId::generate().as_str()[4..].replace('-', "")
        );
        let mut conn = PgConnection::connect(&base).await?;
        conn.execute(AssertSqlSafe(format!("CREATE DATABASE {name}")))
            .await?;
        let slash = base.rfind('/').ok_or("IDEM_PG_URL names no database")?;
        Ok(format!("{}/{name}", &base[..slash]))
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn c17_pg_one_statement_records_several_attempts_each_under_its_claim(
    ) -> Result<(), Box<dyn std::error::Error>> {
        let store = PgStore::connect(&fresh_database().await?).await?;
        store.migrate().await?;
        let outbox = PgOutbox::open(&store).await?;
        outbox
            .register(&Endpoint::new(
                "m",
                "http://127.0.0.1:9/",
                ["whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw"],
            )?)
            .await?;
        let mut ids = Vec::new();
        for _ in 0..3 {
            let mut tx = store.pool().begin().await?;
            ids.push(
                outbox
                    .enqueue(&mut tx, &Message::bytes("a/b", "x").to("m"))
                    .await?,
            );
            tx.commit().await?;
        }
        let claimed = outbox
            .claim("t", Duration::from_secs(60), 10)
            .await?
            .claimed;
        let delivery = |id: &MessageId| claimed.iter().find(|c| &c.message_id == id).map(|c| c.id);
        let (a, b, c) = (
            delivery(&ids[0]).ok_or("claimed")?,
            delivery(&ids[1]).ok_or("claimed")?,
            delivery(&ids[2]).ok_or("claimed")?,
        );
        let failed = |id, token: &str, status| Record {
            state: DeliveryState::Pending,
            delay: Duration::from_secs(5),
            ..record(id, token, status)
        };
        let failing = || async {
            let row: (Option<bool>, bool) = sqlx::query_as(
                "SELECT failing_since IS NOT NULL, enabled FROM idem_outbox_endpoints WHERE name = 'm'",
            )
            .fetch_one(store.pool())
            .await?;
            Ok::<_, sqlx::Error>(row)
        };
        // A stale token among them changes its delivery only; a success in the statement
        // leaves the endpoint healthy.
        // `a` ended two seconds before it is recorded: its start is told from its end.
        let ended_before = Record {
            ended: std::time::Instant::now()
                .checked_sub(Duration::from_secs(2))
                .ok_or("a monotonic clock two seconds old")?,
            ..record(a, "t", 200)
        };
        assert_eq!(
            outbox
                .record(&[ended_before, failed(b, "stale", 500), failed(c, "t", 503)])
                .await?,
            [true, false, true]
        );
        let now_ms = i64::try_from(
            std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)?
                .as_millis(),
        )?;
        let started = outbox.attempts(a).await?[0].started_at_ms;
        assert!(
            (now_ms - 2_003 - started).abs() < 500,
            "started {} ms before now",
            now_ms - started
        );
        let states = |i: usize| {
            let outbox = outbox.clone();
            let id = ids[i].clone();
            async move {
                let d = outbox.deliveries(&id).await?.remove(0);
                let attempts = outbox.attempts(d.id).await?;
                Ok::<_, OutboxError>((d.state, d.last_status, attempts.len()))
            }
        };
        assert_eq!(states(0).await?, (DeliveryState::Delivered, Some(200), 1));
        assert_eq!(states(1).await?, (DeliveryState::Pending, None, 0));
        assert_eq!(states(2).await?, (DeliveryState::Pending, Some(503), 1));
        assert_eq!(failing().await?, (Some(false), true));
        // Failures only: failing since now; failing longer than allowed: disabled.
        assert_eq!(outbox.record(&[failed(b, "t", 500)]).await?, [true]);
        assert_eq!(failing().await?, (Some(true), true));
        let again = outbox
            .claim("u", Duration::from_secs(60), 10)
            .await?
            .claimed;
        assert!(again.is_empty(), "both pending ones are due in 5 s");
        let hold = |id: i64, token: &'static str| {
            sqlx::query("UPDATE idem_outbox_deliveries SET claim_token = $2 WHERE id = $1")
                .bind(id)
                .bind(token)
                .execute(store.pool())
        };
        // A success on a failing endpoint clears it (attempts that all delivered).
        hold(c, "u").await?;
        assert_eq!(outbox.record(&[record(c, "u", 204)]).await?, [true]);
        assert_eq!(states(2).await?, (DeliveryState::Delivered, Some(204), 2));
        assert_eq!(failing().await?, (Some(false), true));
        hold(b, "v").await?;
        let late = Record {
            disable_after: Duration::ZERO,
            ..failed(b, "v", 500)
        };
        assert_eq!(outbox.record(&[late]).await?, [true]);
        assert_eq!(failing().await?, (Some(true), false));
        assert!(outbox.record(&[]).await?.is_empty());
        Ok(())
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn c17_pg_a_stale_claim_cannot_record_over_a_newer_one(
    ) -> Result<(), Box<dyn std::error::Error>> {
        let store = PgStore::connect(&fresh_database().await?).await?;
        store.migrate().await?;
        let outbox = PgOutbox::open(&store).await?;
        outbox
            .register(&Endpoint::new(
                "m",
                "http://127.0.0.1:9/",
                ["whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw"],
            )?)
            .await?;
        let mut tx = store.pool().begin().await?;
        let id = outbox
            .enqueue(&mut tx, &Message::bytes("a/b", "x").to("m"))
            .await?;
        tx.commit().await?;
        let first = outbox
            .claim("old", Duration::from_millis(100), 10)
            .await?
            .claimed;
        assert_eq!(first.len(), 1);
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
