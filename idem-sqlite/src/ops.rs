//! The store's operations as synchronous steps on one connection. The decision is always
//! `idem_core::decide`; SQL only reads and applies it with compare-and-set statements.

use crate::row;
use crate::sql::Statements;
use idem_core::{
    decide, Begin, Clock, Error, Lease, Record, RecordId, Request, StoredResponse, Timestamp,
};
use rusqlite::{params, Connection, Params};
use std::ops::ControlFlow;
use std::time::Duration;

/// How many times a reservation re-reads after losing a compare-and-set. Each loss means another
/// caller wrote a live record, so the next read answers without writing; the bound only guards
/// against a store that misbehaves.
const MAX_ATTEMPTS: usize = 8;

pub(crate) fn select(
    conn: &Connection,
    sql: &Statements,
    id: &RecordId,
) -> Result<Option<Record>, Error> {
    let mut stmt = conn
        .prepare_cached(&sql.select_record)
        .map_err(Error::unavailable)?;
    let mut rows = stmt
        .query(params![id.consumer(), id.route(), id.key()])
        .map_err(Error::unavailable)?;
    match rows.next().map_err(Error::unavailable)? {
        Some(found) => row::decode(found).map(Some),
        None => Ok(None),
    }
}

/// Reads, lets the core decide, and applies an acquisition with one compare-and-set statement
/// (C4): the unique constraint for a fresh record, the previous token for a takeover or a start
/// over. No explicit transaction: a replay or in-flight answer takes no write lock, and a
/// reservation commits on its own before the effect.
pub(crate) fn reserve(
    conn: &Connection,
    sql: &Statements,
    clock: &dyn Clock,
    request: &Request,
    lease_for: Duration,
) -> Result<Begin, Error> {
    let id = &request.id;
    for _ in 0..MAX_ATTEMPTS {
        let now = clock.now();
        let acquired = match decide(select(conn, sql, id)?, &request.fingerprint, now).next_step() {
            ControlFlow::Break(answer) => return Ok(answer),
            ControlFlow::Continue(acquired) => acquired,
        };
        let lease = Lease::new(request, now + lease_for, acquired);
        let (consumer, route, key) = (id.consumer(), id.route(), id.key());
        let (fingerprint, token) = (request.fingerprint.as_bytes(), lease.token.as_bytes());
        let until = millis(lease.lease_until);
        let written = match acquired.replaces() {
            None => execute(
                conn,
                &sql.insert_reservation,
                params![consumer, route, key, fingerprint, token, until],
            )?,
            Some(previous) => execute(
                conn,
                &sql.replace_reservation,
                params![
                    consumer,
                    route,
                    key,
                    fingerprint,
                    token,
                    until,
                    previous.as_bytes(),
                    millis(now)
                ],
            )?,
        };
        if written == 1 {
            return Ok(Begin::Acquired(lease));
        }
    }
    Err(Error::unavailable(
        "reservation kept losing its compare-and-set",
    ))
}

/// Fenced completion (C6) on `conn`, which may be inside the caller's transaction.
pub(crate) fn complete(
    conn: &Connection,
    sql: &Statements,
    now: Timestamp,
    lease: &Lease,
    response: &StoredResponse,
    retain_for: Duration,
) -> Result<(), Error> {
    let id = &lease.id;
    let encoded = response.encode()?;
    let expires = millis(now + retain_for);
    fenced(
        conn,
        &sql.complete,
        params![
            id.consumer(),
            id.route(),
            id.key(),
            lease.token.as_bytes(),
            encoded,
            expires
        ],
    )
}

/// Fenced release (C8).
pub(crate) fn release(conn: &Connection, sql: &Statements, lease: &Lease) -> Result<(), Error> {
    let id = &lease.id;
    fenced(
        conn,
        &sql.release,
        params![id.consumer(), id.route(), id.key(), lease.token.as_bytes()],
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
    let id = &lease.id;
    let until = now + lease_for;
    fenced(
        conn,
        &sql.renew,
        params![
            id.consumer(),
            id.route(),
            id.key(),
            lease.token.as_bytes(),
            millis(until)
        ],
    )?;
    Ok(until)
}

/// One bounded batch of expired records (C10).
pub(crate) fn purge_expired(
    conn: &Connection,
    sql: &Statements,
    now: Timestamp,
    limit: usize,
) -> Result<usize, Error> {
    let limit = i64::try_from(limit).unwrap_or(i64::MAX);
    execute(conn, &sql.purge_expired, params![millis(now), limit])
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
        .map_err(Error::unavailable)
}

/// Milliseconds as SQLite's signed integer (saturating far in the future).
pub(crate) fn millis(at: Timestamp) -> i64 {
    i64::try_from(at.as_millis()).unwrap_or(i64::MAX)
}
