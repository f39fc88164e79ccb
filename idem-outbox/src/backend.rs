//! The database a dispatcher works on: one of the SQL stores' outboxes.

use std::sync::Arc;
use std::time::Duration;

use tokio::sync::Notify;
use tokio::task::JoinHandle;

use crate::claim::{Record, Taken};
use crate::{DeliveryInfo, DeliveryState, Endpoint, MessageId, OutboxError};

/// An outbox a dispatcher claims from and records to.
#[derive(Debug, Clone)]
pub(crate) enum Backend {
    #[cfg(feature = "sqlite")]
    Sqlite(crate::SqliteOutbox),
    #[cfg(feature = "postgres")]
    Postgres(crate::PgOutbox),
}

impl Backend {
    /// Claims up to `limit` due deliveries: the claimed ones, those whose row cannot be
    /// decoded, and how many due ones of disabled endpoints were set aside instead.
    pub(crate) async fn claim(
        &self,
        token: &str,
        lease: Duration,
        limit: usize,
    ) -> Result<Taken, OutboxError> {
        match self {
            #[cfg(feature = "sqlite")]
            Backend::Sqlite(outbox) => outbox.claim(token, lease, limit).await,
            #[cfg(feature = "postgres")]
            Backend::Postgres(outbox) => outbox.claim(token, lease, limit).await,
        }
    }

    /// Ends claims of `token` that made no attempt, each giving its attempt back:
    /// `(delivery, Some(error))` dead, `(delivery, None)` released, due again after `pause`.
    /// For each, whether its claim was still the delivery's (ended).
    pub(crate) async fn abandon(
        &self,
        token: &str,
        ends: &[(i64, Option<String>)],
        pause: Duration,
    ) -> Result<Vec<bool>, OutboxError> {
        match self {
            #[cfg(feature = "sqlite")]
            Backend::Sqlite(outbox) => outbox.abandon(token, ends, pause).await,
            #[cfg(feature = "postgres")]
            Backend::Postgres(outbox) => outbox.abandon(token, ends, pause).await,
        }
    }

    /// Records attempts, each under its claim, at once: for each, whether its claim was still
    /// the delivery's (recorded).
    pub(crate) async fn record(&self, records: &[Record]) -> Result<Vec<bool>, OutboxError> {
        match self {
            #[cfg(feature = "sqlite")]
            Backend::Sqlite(outbox) => outbox.record(records).await,
            #[cfg(feature = "postgres")]
            Backend::Postgres(outbox) => outbox.record(records).await,
        }
    }

    /// Whether `record`, the attempt numbered `attempt` of a delivery of `message`, is in the
    /// database though the answer to its record was lost. Only an end the delivery cannot leave
    /// without a record tells it (delivered, dead): the delivery in that state, at that
    /// attempt (no later claim), with the attempt in its table. An attempt's number alone
    /// does not: an operator's retry or replay starts the attempts over (`requeue.sql`), so an
    /// earlier attempt of the same number may be there. A pending end is never told apart
    /// from an unrecorded attempt under a claim that has not run out: `false`.
    pub(crate) async fn landed(
        &self,
        record: &Record,
        message: &MessageId,
        attempt: u32,
    ) -> Result<bool, OutboxError> {
        if !matches!(record.state, DeliveryState::Delivered | DeliveryState::Dead) {
            return Ok(false);
        }
        let deliveries = self.deliveries(message).await?;
        let ended = deliveries.iter().any(|delivery| {
            delivery.id == record.delivery
                && delivery.state == record.state
                && delivery.attempts == attempt
        });
        if !ended {
            return Ok(false);
        }
        let attempts = match self {
            #[cfg(feature = "sqlite")]
            Backend::Sqlite(outbox) => outbox.attempts(record.delivery).await?,
            #[cfg(feature = "postgres")]
            Backend::Postgres(outbox) => outbox.attempts(record.delivery).await?,
        };
        Ok(attempts.iter().any(|info| info.attempt == attempt))
    }

    /// The deliveries of `message`.
    pub(crate) async fn deliveries(
        &self,
        message: &MessageId,
    ) -> Result<Vec<DeliveryInfo>, OutboxError> {
        match self {
            #[cfg(feature = "sqlite")]
            Backend::Sqlite(outbox) => outbox.deliveries(message).await,
            #[cfg(feature = "postgres")]
            Backend::Postgres(outbox) => outbox.deliveries(message).await,
        }
    }

    /// The deliveries `ids` found, in one statement: `None` for a row that cannot be decoded.
    pub(crate) async fn deliveries_by_id(
        &self,
        ids: &[i64],
    ) -> Result<Vec<(i64, Option<DeliveryInfo>)>, OutboxError> {
        match self {
            #[cfg(feature = "sqlite")]
            Backend::Sqlite(outbox) => outbox.deliveries_by_id(ids).await,
            #[cfg(feature = "postgres")]
            Backend::Postgres(outbox) => outbox.deliveries_by_id(ids).await,
        }
    }

    pub(crate) async fn endpoint(&self, name: &str) -> Result<Option<Endpoint>, OutboxError> {
        match self {
            #[cfg(feature = "sqlite")]
            Backend::Sqlite(outbox) => outbox.endpoint(name).await,
            #[cfg(feature = "postgres")]
            Backend::Postgres(outbox) => outbox.endpoint(name).await,
        }
    }

    #[cfg(feature = "metrics")]
    pub(crate) async fn oldest_pending_age(&self) -> Result<Option<Duration>, OutboxError> {
        match self {
            #[cfg(feature = "sqlite")]
            Backend::Sqlite(outbox) => outbox.oldest_pending_age().await,
            #[cfg(feature = "postgres")]
            Backend::Postgres(outbox) => outbox.oldest_pending_age().await,
        }
    }

    /// What wakes a dispatcher when a message is enqueued, and the task that listens for it
    /// (PostgreSQL's `LISTEN`), if any.
    pub(crate) fn waker(&self) -> (Arc<Notify>, Option<JoinHandle<()>>) {
        match self {
            #[cfg(feature = "sqlite")]
            Backend::Sqlite(outbox) => (outbox.wake(), None),
            #[cfg(feature = "postgres")]
            Backend::Postgres(outbox) => {
                let wake = Arc::new(Notify::new());
                let task = tokio::spawn(outbox.clone().listen(Arc::clone(&wake)));
                (wake, Some(task))
            }
        }
    }
}

/// The deadline of each database call of the outbox's own methods and, by default, of a
/// dispatcher's: a database that does not answer is an error, never a hang (C13).
pub(crate) const STORE_TIMEOUT: Duration = Duration::from_secs(10);

/// `call` within `deadline`: [`OutboxError::Timeout`] when it runs out (a frozen database is
/// an error, never a hang).
pub(crate) async fn bounded<T>(
    deadline: Duration,
    call: impl std::future::Future<Output = Result<T, OutboxError>>,
) -> Result<T, OutboxError> {
    tokio::time::timeout(deadline, call)
        .await
        .unwrap_or(Err(OutboxError::Timeout(deadline)))
}
