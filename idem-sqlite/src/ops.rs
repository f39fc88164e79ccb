//! The store's operations as synchronous steps on one connection. The decision is always
//! `idem_core::store::decide`; SQL only reads and applies it with compare-and-set statements.

use crate::error::store_error;
use crate::row;
use crate::sql::Statements;
use idem_core::store::{
    duration_millis, Acquire, BlockingSteps, Claim, Completion, Lease, Record, Reservation,
    Reserved, Resolution,
};
use idem_core::store::{Decided, Reconciliation};
use idem_core::{Begin, Clock, Error, FencingToken, Field, RecordId, Request, Timestamp};
use idem_ops::Holder;
use idem_ops::{Cursor, Inspected, ListQuery, Page, Selection, Stats};
use rusqlite::{params, Connection, Params, TransactionBehavior};
use std::time::Duration;

/// The full record, response decoded (for `lookup`).
pub(crate) fn select(
    conn: &Connection,
    sql: &Statements,
    id: &RecordId,
) -> Result<Option<Record>, Error> {
    let mut stmt = conn
        .prepare_cached(&sql.select_record)
        .map_err(store_error)?;
    let mut rows = stmt
        .query(params![id.consumer(), id.route(), id.key()])
        .map_err(store_error)?;
    rows.next()
        .map_err(store_error)?
        .map(row::decode)
        .transpose()
}

/// The full record, response decoded, with its provenance and its mark of doubt (for
/// `inspect`).
pub(crate) fn inspect(
    conn: &Connection,
    sql: &Statements,
    id: &RecordId,
) -> Result<Option<Inspected>, Error> {
    let mut stmt = conn
        .prepare_cached(&sql.select_inspected)
        .map_err(store_error)?;
    let mut rows = stmt
        .query(params![id.consumer(), id.route(), id.key()])
        .map_err(store_error)?;
    rows.next()
        .map_err(store_error)?
        .map(|found| {
            let record = row::decode(found)?;
            let provenance = row::decode_provenance(found, 6, 7, record.is_completed());
            let (doubt, check_at) = row::decode_doubt(found, 9)?;
            Ok(Inspected {
                record,
                provenance,
                doubt,
                check_at,
            })
        })
        .transpose()
}

/// A whole reservation on `conn`, in this hop: the core's protocol ([`Reservation`]) driven
/// over this store's steps. `conn` is the writer's connection, or a one-commit transaction. A
/// failed step is never sent again: a local file loses no answer, and SQLite may have rolled a
/// one-commit transaction back under the failure (a full disk), where a step sent again would
/// commit the reservation alone (C15).
pub(crate) fn reserve(
    conn: &Connection,
    sql: &Statements,
    clock: &dyn Clock,
    reservation: Reservation<'_>,
) -> Result<Begin, Error> {
    reservation.run_blocking(&mut Steps {
        conn,
        sql,
        clock,
        holder: Holder::this_process_encoded(),
    })
}

/// The reservation this store runs in one hop: without a step sent again (see [`reserve`]).
pub(crate) fn reservation(request: &Request, lease_for: Duration) -> Reservation<'_> {
    Reservation::without_retry(request, lease_for)
}

/// This store's reservation steps on one connection.
pub(crate) struct Steps<'c> {
    pub(crate) conn: &'c Connection,
    pub(crate) sql: &'c Statements,
    pub(crate) clock: &'c dyn Clock,
    /// The stored [`Holder`] each reservation records, for operators; never part of a decision.
    pub(crate) holder: &'c str,
}

impl BlockingSteps for Steps<'_> {
    fn reserve(&mut self, claim: &Claim<'_>) -> Result<Reserved, Error> {
        reserve_step(
            self.conn,
            self.sql,
            self.clock.now(),
            claim.request(),
            claim.token(),
            claim.lease_for(),
            self.holder,
        )
    }

    fn replace(&mut self, claim: &Claim<'_>, acquire: Acquire) -> Result<Reserved, Error> {
        replace_step(
            self.conn,
            self.sql,
            self.clock.now(),
            claim.request(),
            claim.token(),
            claim.lease_for(),
            acquire,
            self.holder,
        )
    }
}

/// The record of `request` as it is at `now`, its response read only for the request's
/// fingerprint or its alternative (C3); `None` when there is none. A read: no write lock.
pub(crate) fn found(
    conn: &Connection,
    sql: &Statements,
    request: &Request,
    now: Timestamp,
) -> Result<Option<Reserved>, Error> {
    let id = request.id();
    let [fingerprint, alternative] = request.fingerprints();
    let mut stmt = conn
        .prepare_cached(&sql.decide_record)
        .map_err(store_error)?;
    let mut rows = stmt
        .query(params![
            id.consumer(),
            id.route(),
            id.key(),
            fingerprint.as_bytes(),
            alternative.as_bytes()
        ])
        .map_err(store_error)?;
    let Some(row) = rows.next().map_err(store_error)? else {
        return Ok(None);
    };
    let record =
        row::decode_head(row)?.try_map_response(|r| Ok::<_, Error>(r.map(<[u8]>::to_vec)))?;
    let in_doubt = row::integer(row, 6, "doubt IS NOT NULL")? == 1;
    Ok(Some(Reserved::Found {
        record,
        now,
        in_doubt,
    }))
}

/// One reservation step (C4): the record as it is, or a fresh in-progress record carrying
/// `token` (the unique constraint decides a race with another process: nothing written, the
/// race reported). No explicit transaction: a reservation commits on its own, before the
/// effect, so duplicates see it at once.
pub(crate) fn reserve_step(
    conn: &Connection,
    sql: &Statements,
    now: Timestamp,
    request: &Request,
    token: FencingToken,
    lease_for: Duration,
    holder: &str,
) -> Result<Reserved, Error> {
    if let Some(found) = found(conn, sql, request, now)? {
        return Ok(found);
    }
    let id = request.id();
    let until = now + lease_for;
    let written = execute(
        conn,
        &sql.insert_reservation,
        params![
            id.consumer(),
            id.route(),
            id.key(),
            request.fingerprint().as_bytes(),
            token.as_bytes(),
            millis(until),
            millis(now),
            holder
        ],
    )?;
    Ok(if written == 1 {
        Reserved::Written { until }
    } else {
        Reserved::Lost
    })
}

/// The compare-and-set of a takeover (C9) or a start over (C10): the previous token, state and
/// expiry the decision saw.
#[allow(clippy::too_many_arguments)]
pub(crate) fn replace_step(
    conn: &Connection,
    sql: &Statements,
    now: Timestamp,
    request: &Request,
    token: FencingToken,
    lease_for: Duration,
    acquire: Acquire,
    holder: &str,
) -> Result<Reserved, Error> {
    let Some((previous, completed)) = acquire.replaces() else {
        return Ok(Reserved::Lost);
    };
    let id = request.id();
    let until = now + lease_for;
    let written = execute(
        conn,
        &sql.replace_reservation,
        params![
            id.consumer(),
            id.route(),
            id.key(),
            request.fingerprint().as_bytes(),
            token.as_bytes(),
            millis(until),
            previous.as_bytes(),
            millis(now),
            i64::from(completed),
            holder,
        ],
    )?;
    Ok(if written == 1 {
        Reserved::Written { until }
    } else {
        Reserved::Lost
    })
}

/// Fenced completion (C6) on `conn`, which may be inside the caller's transaction, with the
/// completion's mark of doubt, due for a check at `now`, or none (store rule 6).
pub(crate) fn complete(
    conn: &Connection,
    sql: &Statements,
    now: Timestamp,
    completion: &Completion,
) -> Result<(), Error> {
    let id = completion.id();
    fenced(
        conn,
        &sql.complete,
        params![
            id.consumer(),
            id.route(),
            id.key(),
            completion.token().as_bytes(),
            completion.encoded(),
            millis(now + completion.retain_for()),
            millis(now),
            completion.doubt()
        ],
    )
}

/// Fenced release (C8).
pub(crate) fn release(conn: &Connection, sql: &Statements, lease: &Lease) -> Result<(), Error> {
    let id = lease.id();
    fenced(
        conn,
        &sql.release,
        params![
            id.consumer(),
            id.route(),
            id.key(),
            lease.token().as_bytes()
        ],
    )
}

/// Fenced renewal (C9); returns the new deadline.
pub(crate) fn renew(
    conn: &Connection,
    sql: &Statements,
    now: Timestamp,
    lease: &Lease,
    lease_for: Duration,
) -> Result<Timestamp, Error> {
    let id = lease.id();
    let until = now + lease_for;
    fenced(
        conn,
        &sql.renew,
        params![
            id.consumer(),
            id.route(),
            id.key(),
            lease.token().as_bytes(),
            millis(until)
        ],
    )?;
    Ok(until)
}

/// One bounded batch of expired records (C10), then of expired audit entries with what is left
/// of `limit` (store rule 7): at most `limit` rows in all.
pub(crate) fn purge_expired(
    conn: &Connection,
    sql: &Statements,
    now: Timestamp,
    limit: usize,
) -> Result<usize, Error> {
    let bound = |n: usize| i64::try_from(n).unwrap_or(i64::MAX);
    let records = execute(conn, &sql.purge_expired, params![millis(now), bound(limit)])?;
    let left = limit.saturating_sub(records);
    if left == 0 {
        return Ok(records);
    }
    let entries = execute(
        conn,
        &sql.reconciliations_purge,
        params![millis(now), bound(left)],
    )?;
    Ok(records + entries)
}

/// A decision about a record in doubt (store rule 7), in one write transaction: the change,
/// fenced on the record's token, its liveness at the store's `now` and the mark as the decider
/// read it; then, if it changed the record, the audit entry. `false`, nothing written, when the
/// record changed since it was read.
pub(crate) fn resolve(
    conn: &mut Connection,
    sql: &Statements,
    clock: &dyn Clock,
    resolution: &Resolution,
) -> Result<bool, Error> {
    // The write lock first, then the clock: `now` is the time the change is made at.
    let tx = conn
        .transaction_with_behavior(TransactionBehavior::Immediate)
        .map_err(store_error)?;
    let now = clock.now();
    let id = resolution.id();
    let (consumer, route, key) = (id.consumer(), id.route(), id.key());
    let token = resolution.token();
    let fence = (token.as_bytes(), millis(now), resolution.read_doubt());
    let changed = match resolution.decided() {
        Decided::Settled { .. } => execute(
            &tx,
            &sql.resolve_settle,
            params![
                consumer,
                route,
                key,
                fence.0,
                fence.1,
                fence.2,
                resolution.response(),
                millis(now + resolution.retain_for())
            ],
        )?,
        Decided::Released => execute(
            &tx,
            &sql.resolve_release,
            params![consumer, route, key, fence.0, fence.1, fence.2],
        )?,
        Decided::StillUnknown { retry_after, .. } => execute(
            &tx,
            &sql.resolve_defer,
            params![
                consumer,
                route,
                key,
                fence.0,
                fence.1,
                fence.2,
                resolution.doubt(),
                millis(now + retry_after)
            ],
        )?,
        _ => {
            return Err(Error::invalid(
                Field::Config,
                "a decision about a record in doubt this store does not know",
            ))
        }
    };
    if changed != 1 {
        // Dropped: rolled back, though nothing was written.
        return Ok(false);
    }
    execute(
        &tx,
        &sql.reconciliation_insert,
        params![
            consumer,
            route,
            key,
            millis(now),
            resolution.entry(),
            millis(now + resolution.keep_entry_for())
        ],
    )?;
    tx.commit().map_err(store_error)?;
    Ok(true)
}

/// The audit trail of `id` at `now` (Operator rule 4): its unexpired entries, the newest
/// [`ListQuery::MAX_LIMIT`], oldest first.
pub(crate) fn reconciliations(
    conn: &Connection,
    sql: &Statements,
    now: Timestamp,
    id: &RecordId,
) -> Result<Vec<Reconciliation>, Error> {
    let limit = i64::try_from(ListQuery::MAX_LIMIT).unwrap_or(i64::MAX);
    let mut stmt = conn
        .prepare_cached(&sql.reconciliations_query)
        .map_err(store_error)?;
    let mut rows = stmt
        .query(params![
            id.consumer(),
            id.route(),
            id.key(),
            millis(now),
            limit
        ])
        .map_err(store_error)?;
    let mut entries = Vec::new();
    while let Some(found) = rows.next().map_err(store_error)? {
        entries.push(row::decode_reconciliation(found)?);
    }
    Ok(entries)
}

/// One page of a listing (store rule 6), at `now`.
pub(crate) fn list(
    conn: &Connection,
    sql: &Statements,
    now: Timestamp,
    query: &ListQuery,
) -> Result<Page, Error> {
    let after = query.cursor().map(Cursor::position).transpose()?;
    let limit = query.limit_value();
    // One more than the page: it says whether a next page exists.
    let fetch = i64::try_from(limit.saturating_add(1)).unwrap_or(i64::MAX);
    let (consumer, route, key) = after.as_ref().map_or(("", "", ""), |p| {
        (p.id.consumer(), p.id.route(), p.id.key())
    });
    let mut records = Vec::with_capacity(limit);
    // The position's reservation time, in the listings ordered by it (-1 for the first page).
    let at = after
        .as_ref()
        .map_or(-1, |p| i64::try_from(p.reserved_at).unwrap_or(i64::MAX));
    match query.selection() {
        Selection::InProgress { older_than } => {
            let cutoff = millis(now).saturating_sub(duration_millis(*older_than));
            let mut stmt = conn
                .prepare_cached(&sql.list_in_progress)
                .map_err(store_error)?;
            let mut rows = stmt
                .query(params![cutoff, at, consumer, route, key, fetch])
                .map_err(store_error)?;
            while let Some(row) = rows.next().map_err(store_error)? {
                records.push(row::decode_listed(row)?);
            }
        }
        Selection::Completed {
            consumer: whose,
            route: only,
        } => {
            let mut stmt = conn
                .prepare_cached(&sql.list_completed)
                .map_err(store_error)?;
            let mut rows = stmt
                .query(params![whose, millis(now), only, route, key, fetch])
                .map_err(store_error)?;
            while let Some(row) = rows.next().map_err(store_error)? {
                records.push(row::decode_listed(row)?);
            }
        }
        Selection::Key { key: wanted } => {
            let mut stmt = conn.prepare_cached(&sql.list_key).map_err(store_error)?;
            let mut rows = stmt
                .query(params![wanted, consumer, route, fetch])
                .map_err(store_error)?;
            while let Some(row) = rows.next().map_err(store_error)? {
                records.push(row::decode_listed(row)?);
            }
        }
        Selection::InDoubt { due } => {
            let mut stmt = conn
                .prepare_cached(&sql.list_in_doubt)
                .map_err(store_error)?;
            let mut rows = stmt
                .query(params![
                    millis(now),
                    i64::from(*due),
                    at,
                    consumer,
                    route,
                    key,
                    fetch
                ])
                .map_err(store_error)?;
            while let Some(row) = rows.next().map_err(store_error)? {
                records.push(row::decode_listed(row)?);
            }
        }
        _ => return Err(unknown_selection()),
    }
    Ok(Page::from_fetched(records, limit))
}

fn unknown_selection() -> Error {
    Error::invalid(
        Field::Config,
        "a listing selection this store does not know",
    )
}

/// Records by state at `now` (store rule 6): one pass over the table.
pub(crate) fn stats(conn: &Connection, sql: &Statements, now: Timestamp) -> Result<Stats, Error> {
    let counts = conn
        .prepare_cached(&sql.stats)
        .and_then(|mut stmt| {
            stmt.query_row(params![millis(now)], |row| {
                Ok((
                    row.get::<_, i64>(0)?,
                    row.get::<_, i64>(1)?,
                    row.get::<_, i64>(2)?,
                    row.get::<_, i64>(3)?,
                    row.get::<_, Option<i64>>(4)?,
                    row.get::<_, i64>(5)?,
                ))
            })
        })
        .map_err(store_error)?;
    let (in_progress, orphaned, completed, expired, oldest, in_doubt) = counts;
    let count = |n: i64| u64::try_from(n).unwrap_or(0);
    let mut stats = Stats::at(now);
    stats.in_progress = count(in_progress);
    stats.orphaned = count(orphaned);
    stats.completed = count(completed);
    stats.expired = count(expired);
    stats.in_doubt = count(in_doubt);
    stats.oldest_in_progress = oldest
        .and_then(|at| u64::try_from(at).ok())
        .map(Timestamp::from_millis);
    Ok(stats)
}

/// A fenced statement changes exactly the holder's row, or nothing: then the lease is lost.
fn fenced(conn: &Connection, statement: &str, params: impl Params) -> Result<(), Error> {
    match execute(conn, statement, params)? {
        1 => Ok(()),
        _ => Err(Error::LeaseLost),
    }
}

fn execute(conn: &Connection, statement: &str, params: impl Params) -> Result<usize, Error> {
    conn.prepare_cached(statement)
        .and_then(|mut stmt| stmt.execute(params))
        .map_err(store_error)
}

/// Milliseconds as SQLite's signed integer (saturating far in the future).
pub(crate) use idem_core::store::timestamp_millis as millis;

#[cfg(test)]
mod tests {
    use super::*;
    use crate::sql::Statements;
    use idem_core::{Fingerprint, IdempotencyKey, Scope};

    fn request() -> Request {
        let id = RecordId::new(
            Scope::new("acct", "POST /charges").expect("scope"),
            IdempotencyKey::new("k").expect("key"),
        );
        Request::from_parts(id, Fingerprint::builder().body(b"{}").finish(), 2)
    }

    /// C9, C10: a takeover replaces only an in-progress record, and a start over only a
    /// completed one, even when the token and the expiry match (a clock stepped back, or two
    /// processes whose clocks disagree, could otherwise make a completed record look like an
    /// orphan and run its effect again).
    #[test]
    fn c09_compare_and_set_requires_the_state_the_decision_saw() {
        let conn = Connection::open_in_memory().expect("db");
        conn.execute_batch(&crate::schema_sql("idem_records"))
            .expect("schema");
        let sql = Statements::for_table("idem_records");
        let req = request();
        let now = Timestamp::from_millis(1_000);
        let Begin::Acquired(lease) = reserve(
            &conn,
            &sql,
            &idem_core::ManualClock::new(now),
            reservation(&req, Duration::from_millis(10)),
        )
        .expect("reserve") else {
            panic!("fresh");
        };
        // Completed by its holder, with a deadline that has passed by the taker's clock.
        conn.execute(
            "UPDATE idem_records SET state = 1, response = X'00', deadline = 1005",
            [],
        )
        .expect("complete");
        let later = Timestamp::from_millis(2_000);
        let previous = lease.token();
        let taken = replace_step(
            &conn,
            &sql,
            later,
            &req,
            FencingToken::generate(),
            Duration::from_secs(1),
            Acquire::take_over(previous),
            Holder::this_process_encoded(),
        )
        .expect("cas");
        assert_eq!(
            taken,
            Reserved::Lost,
            "a completed record was taken over as an orphan"
        );
        let started = replace_step(
            &conn,
            &sql,
            later,
            &req,
            FencingToken::generate(),
            Duration::from_secs(1),
            Acquire::start_over(previous),
            Holder::this_process_encoded(),
        )
        .expect("cas");
        assert!(
            matches!(started, Reserved::Written { .. }),
            "an expired completed record starts over"
        );
    }
}

#[cfg(test)]
mod one_commit_after_a_failed_step {
    use super::*;
    use idem_core::{Fingerprint, IdempotencyKey, Scope};

    fn request(key: &str) -> Request {
        let id = RecordId::new(
            Scope::new("acct", "POST /charges").expect("scope"),
            IdempotencyKey::new(key).expect("key"),
        );
        Request::from_parts(id, Fingerprint::builder().body(b"{}").finish(), 2)
    }

    /// The store's steps, with a real SQLITE_FULL on the first insert (a page limit on a full
    /// page), lifted right after it: a transient failure.
    struct FullOnce<'c> {
        steps: Steps<'c>,
        failed: bool,
    }

    impl BlockingSteps for FullOnce<'_> {
        fn reserve(&mut self, claim: &Claim<'_>) -> Result<Reserved, Error> {
            if self.failed {
                return self.steps.reserve(claim);
            }
            self.failed = true;
            let conn = self.steps.conn;
            let pages: i64 = conn
                .query_row("PRAGMA page_count", [], |r| r.get(0))
                .expect("page_count");
            conn.pragma_update(None, "max_page_count", pages)
                .expect("limit");
            let result = self.steps.reserve(claim);
            conn.pragma_update(None, "max_page_count", 1_073_741_823_i64)
                .expect("unlimit");
            result
        }

        fn replace(&mut self, claim: &Claim<'_>, acquire: Acquire) -> Result<Reserved, Error> {
            self.steps.replace(claim, acquire)
        }
    }

    /// C15: SQLite rolls a one-commit transaction back under a full disk and goes on in
    /// autocommit; the reservation's failed step is never sent again there, where it would
    /// commit the reservation alone and every statement of the effect after it. The execution
    /// fails, and its rollback leaves nothing.
    #[test]
    fn c15_a_failed_step_inside_a_one_commit_transaction_is_not_sent_again() {
        let dir = tempfile::tempdir().expect("dir");
        let path = dir.path().join("full.db");
        let mut conn = Connection::open(&path).expect("db");
        conn.execute_batch(&crate::schema_sql("idem_records"))
            .expect("schema");
        conn.execute_batch("CREATE TABLE charges (id INTEGER PRIMARY KEY, amount INTEGER)")
            .expect("charges");
        let sql = Statements::for_table("idem_records");
        let clock = idem_core::ManualClock::new(Timestamp::from_millis(1_000));
        // Fill the table's last page, so that the next reservation needs a new page.
        for i in 0.. {
            let pages: i64 = conn
                .query_row("PRAGMA page_count", [], |r| r.get(0))
                .expect("page_count");
            conn.pragma_update(None, "max_page_count", pages)
                .expect("limit");
            let filled = reserve(
                &conn,
                &sql,
                &clock,
                reservation(&request(&format!("f{i:05}")), Duration::from_secs(60)),
            );
            conn.pragma_update(None, "max_page_count", 1_073_741_823_i64)
                .expect("unlimit");
            if filled.is_err() {
                break;
            }
        }
        let req = request("k00000");
        let tx = conn
            .transaction_with_behavior(TransactionBehavior::Immediate)
            .expect("begin immediate");
        let begun = reservation(&req, Duration::from_secs(60)).run_blocking(&mut FullOnce {
            steps: Steps {
                conn: &tx,
                sql: &sql,
                clock: &clock,
                holder: Holder::this_process_encoded(),
            },
            failed: false,
        });
        assert!(
            begun.is_err(),
            "the failure is the reservation's: {begun:?}"
        );
        drop(tx);
        let other = Connection::open(&path).expect("other");
        let count = |sql: &str| -> i64 { other.query_row(sql, [], |r| r.get(0)).expect("count") };
        assert_eq!(
            count("SELECT COUNT(*) FROM idem_records WHERE key = 'k00000'"),
            0,
            "nothing of the execution is left (C15)"
        );
    }
}
