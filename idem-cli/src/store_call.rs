//! Calls to the store, each bounded by `--timeout`, and the reads two commands share.

use crate::cli::PageArgs;
use crate::failure::{usage, Failure};
use idem_core::store::Deadline;
use idem_core::{Error, Field, IdempotencyKey, RecordId, Scope, StoreErrorKind};
use idem_ops::{Cursor, ListQuery, Listed, Operator, Page};
use std::collections::HashSet;
use std::future::Future;
use std::sync::OnceLock;
use std::time::Duration;

/// The most each call to the store may take (`--timeout`), set once per run.
static CALL_DEADLINE: OnceLock<Duration> = OnceLock::new();

/// Sets `--timeout` for this run (once; later calls change nothing).
pub(crate) fn set_deadline(limit: Duration) {
    let _ = CALL_DEADLINE.set(limit);
}

/// The deadline of one store call made now: `--timeout` from now.
pub(crate) fn deadline() -> Deadline {
    Deadline::after(*CALL_DEADLINE.get_or_init(|| Duration::from_secs(10)))
}

/// `call`, or a store error (unavailable) once it has taken longer than `--timeout`: a store
/// that accepts a connection and never answers does not hang the command.
pub(crate) async fn within<T>(call: impl Future<Output = Result<T, Error>>) -> Result<T, Error> {
    let limit = *CALL_DEADLINE.get_or_init(|| Duration::from_secs(10));
    match tokio::time::timeout(limit, call).await {
        Ok(result) => result,
        Err(_) => Err(Error::store(
            "idem",
            StoreErrorKind::Unavailable,
            format!(
                "the store did not answer within {}s (--timeout)",
                limit.as_secs()
            ),
        )),
    }
}

/// The record of (`consumer`, `route`, `key`), each checked as idem checks them (exit 2 if not).
pub(crate) fn record_id(consumer: &str, route: &str, key: &str) -> Result<RecordId, Failure> {
    Ok(RecordId::new(
        Scope::new(consumer, route).map_err(usage)?,
        IdempotencyKey::new(key).map_err(usage)?,
    ))
}

/// The records of `query` a listing shows: one page from `--after`, or every page with
/// `--all`, each record once; and the cursor of the next page.
pub(crate) async fn fetch(
    store: &dyn Operator,
    query: ListQuery,
    page: &PageArgs,
) -> Result<(Vec<Listed>, Option<Cursor>), Failure> {
    let mut query = query.limit(usize::from(page.limit));
    if let Some(after) = &page.after {
        query = query.after(Cursor::new(after.clone()));
    }
    let mut records: Vec<Listed> = Vec::new();
    // A scanning store (Redis) may return a record on two pages: show it once.
    let mut seen = HashSet::new();
    let next = loop {
        let Page {
            records: found,
            next,
        } = store
            .list(&query, deadline())
            .await
            .map_err(|error| match error {
                // A cursor the store did not make came from the command line.
                Error::InvalidInput {
                    field: Field::Cursor,
                    ..
                } => usage(error),
                other => Failure::Idem(other),
            })?;
        records.extend(found.into_iter().filter(|r| seen.insert(r.id.clone())));
        match next {
            Some(next) if page.all => query = query.after(next),
            next => break next,
        }
    };
    Ok((records, next))
}
