//! The store's operations as statements on one connection. The decision is always
//! `idem_core::store::decide`; SQL reads and applies it atomically.

use crate::error::BACKEND;
use crate::gate::Gate;
use crate::params::{execute_after, fetch_all_after, fetch_optional_after, Param, StatementMode};
use crate::row;
use crate::sql::Statements;
use idem_core::store::Reconciliation;
use idem_core::store::{
    duration_millis, Acquire, Claim, Completion, Deadline, Decided, Lease, Record, Reserved,
    Resolution,
};
use idem_core::{
    Error, FencingToken, Field, RecordId, Request, StoreErrorKind, StoredResponse, Timestamp,
};
use idem_ops::{Cursor, Inspected, ListQuery, Page, Selection, Stats};
use sqlx::postgres::PgRow;
use sqlx::{PgConnection, Row};
use std::sync::atomic::{AtomicI64, AtomicU64, Ordering};
use std::sync::{Mutex, PoisonError};
use std::time::Duration;

/// The longest age a listing asks PostgreSQL about: two centuries, in milliseconds.
const MAX_AGE_MS: i64 = 200 * 366 * 24 * 3600 * 1000;

/// The statements and how to send them.
#[derive(Debug)]
pub(crate) struct Ops {
    pub(crate) sql: Statements,
    pub(crate) mode: StatementMode,
    /// What precedes each statement run on the store's own connections (`crate::session`).
    pub(crate) preamble: String,
    /// The holder each reservation records, in its stored form (formatted once).
    pub(crate) holder: String,
    /// The records' table, schema-qualified: the gate's lock keys are the table's own
    /// (advisory locks are the whole database's).
    pub(crate) gate_namespace: String,
    /// The gate's key derivations for that table, made once.
    pub(crate) gate: Gate,
    /// Where the next purge's window starts (reservation time in ms, consumer, route, key):
    /// after the last one's; `None`, from the oldest.
    pub(crate) purge_from: Mutex<Option<(i64, String, String, String)>>,
    /// When the server the last reservation step ran on started (ms; 0 before the first).
    pub(crate) server_started: AtomicI64,
    /// How many times that changed (a restart, a failover, even behind a pooler).
    pub(crate) servers: AtomicU64,
}

fn timestamp(ms: i64) -> Result<Timestamp, Error> {
    u64::try_from(ms)
        .map(Timestamp::from_millis)
        .map_err(|_| Error::CorruptRecord(format!("postgres: deadline {ms} before 1970")))
}

fn id_params(id: &RecordId) -> [Param<'_>; 3] {
    [
        Param::Text(id.consumer()),
        Param::Text(id.route()),
        Param::Text(id.key()),
    ]
}

impl Ops {
    /// One reservation step (C4, C5): one statement that returns the current record or
    /// inserts a fresh one carrying `token` (the engine decides on a record found).
    ///
    /// `one_commit` (C15): `conn` is in the execution's transaction, and the reservation (a
    /// fresh one, or a takeover's row lock) holds until that transaction ends; a fresh key takes
    /// its gate's locks exclusively (`sql/reserve.sql`). A record another one-commit execution
    /// holds (its reservation not committed yet) is reported held: for the same request, or
    /// for another body.
    ///
    /// A claim that [expects a fresh key](Claim::expects_fresh) sends the insert alone
    /// (`sql/insert.sql`, the same gate) where `insert_first`: `Lost` when it wrote nothing.
    /// Not in a one-commit transaction at REPEATABLE READ: the insert would take the
    /// transaction's snapshot, and the whole reservation after it would decide on that stale
    /// one (a record committed in between is then a conflict, not a row to read).
    pub(crate) async fn reserve(
        &self,
        conn: &mut PgConnection,
        claim: &Claim<'_>,
        one_commit: bool,
        insert_first: bool,
    ) -> Result<Reserved, Error> {
        let (request, token, lease_for) = (claim.request(), claim.token(), claim.lease_for());
        let id = request.id();
        let [consumer, route, key] = id_params(id);
        // The response is fetched under either of the request's fingerprints (C3).
        let [fingerprint, alternative] = request.fingerprints();
        let gate = self.gate.keys(id, request.fingerprint());
        // Inside the execution's transaction nothing of the store's session settings is sent:
        // `SET TRANSACTION` would change the effect's isolation and `SET LOCAL` its timeouts
        // until COMMIT. The engine's deadline bounds the statement instead, as for
        // `complete_in`.
        let preamble = if one_commit {
            ""
        } else {
            self.preamble.as_str()
        };
        // Which process reserves, for operators; never part of a decision.
        let holder = self.holder.as_str();
        // The insert takes reserve.sql's $1..$10; $11 is the alternative fingerprint.
        let alone = claim.expects_fresh() && insert_first;
        let params = [
            consumer,
            route,
            key,
            Param::Bytes(fingerprint.as_bytes()),
            Param::Bytes(token.as_bytes()),
            Param::Int(duration_millis(lease_for)),
            Param::Text(holder),
            Param::Int(gate.record),
            Param::Int(gate.fingerprint),
            Param::Bool(one_commit),
            Param::Bytes(alternative.as_bytes()),
        ];
        let (sql, params) = if alone {
            (&self.sql.insert, &params[..10])
        } else {
            (&self.sql.reserve, &params[..])
        };
        let found = fetch_optional_after(conn, self.mode, preamble, sql, params).await?;
        // No row: the insert alone wrote nothing (a record is there, or a one-commit execution
        // holds the key), or a reservation committed after this statement's snapshot.
        let Some(found) = found else {
            return Ok(Reserved::Lost);
        };
        self.seen_server(&found)?;
        let source: &str = if alone {
            "inserted"
        } else {
            found.try_get("source").map_err(crate::error::store_error)?
        };
        match source {
            // A one-commit execution's transaction holds the record (its reservation is not
            // committed yet).
            "held_same" => Ok(Reserved::Held { mismatch: false }),
            "held_other" => Ok(Reserved::Held { mismatch: true }),
            "inserted" => Ok(Reserved::Written {
                until: timestamp(row::required_instant(&found, "deadline_at")?)?,
            }),
            _ => found_record(&found),
        }
    }

    /// What [`reserve`](Self::reserve) would find for `request`, writing nothing and taking no
    /// lock (`sql/look.sql`): the record; held, by a one-commit execution; or `Lost` when there
    /// is neither.
    pub(crate) async fn look(
        &self,
        conn: &mut PgConnection,
        request: &Request,
    ) -> Result<Reserved, Error> {
        let [consumer, route, key] = id_params(request.id());
        let [fingerprint, alternative] = request.fingerprints();
        let gate = self.gate.keys(request.id(), request.fingerprint());
        let params = [
            consumer,
            route,
            key,
            Param::Bytes(fingerprint.as_bytes()),
            Param::Bytes(alternative.as_bytes()),
            Param::Int(gate.record),
            Param::Int(gate.fingerprint),
        ];
        let found =
            fetch_optional_after(conn, self.mode, &self.preamble, &self.sql.look, &params).await?;
        let Some(found) = found else {
            return Ok(Reserved::Lost);
        };
        self.seen_server(&found)?;
        let source: &str = found.try_get("source").map_err(crate::error::store_error)?;
        match source {
            "held_same" => Ok(Reserved::Held { mismatch: false }),
            "held_other" => Ok(Reserved::Held { mismatch: true }),
            _ => found_record(&found),
        }
    }

    /// The request's record as [`reserve`](Self::reserve) reports it, by a plain read that
    /// writes nothing (`sql/read.sql`); `Lost` when there is none.
    pub(crate) async fn read(
        &self,
        conn: &mut PgConnection,
        request: &Request,
    ) -> Result<Reserved, Error> {
        let [consumer, route, key] = id_params(request.id());
        let [fingerprint, alternative] = request.fingerprints();
        let found = fetch_optional_after(
            conn,
            self.mode,
            &self.preamble,
            &self.sql.read,
            &[
                consumer,
                route,
                key,
                Param::Bytes(fingerprint.as_bytes()),
                Param::Bytes(alternative.as_bytes()),
            ],
        )
        .await?;
        let Some(found) = found else {
            return Ok(Reserved::Lost);
        };
        self.seen_server(&found)?;
        found_record(&found)
    }

    /// Notes the start time of the server a step ran on (`server_at`): another one than the
    /// last step's moves the store's generation.
    fn seen_server(&self, row: &PgRow) -> Result<(), Error> {
        let started = row::required_instant(row, "server_at")?;
        let before = self.server_started.swap(started, Ordering::AcqRel);
        if before != 0 && before != started {
            self.servers.fetch_add(1, Ordering::AcqRel);
        }
        Ok(())
    }

    /// The compare-and-set of a takeover or a start over, writing `token`; `preamble` is empty
    /// inside the execution's transaction.
    pub(crate) async fn replace(
        &self,
        conn: &mut PgConnection,
        preamble: &str,
        request: &Request,
        token: FencingToken,
        acquired: Acquire,
        lease_for: Duration,
    ) -> Result<Reserved, Error> {
        let Some((previous, completed)) = acquired.replaces() else {
            return Ok(Reserved::Lost);
        };
        let [consumer, route, key] = id_params(request.id());
        let holder = self.holder.as_str();
        let rows = fetch_all_after(
            conn,
            self.mode,
            preamble,
            &self.sql.replace_reservation,
            &[
                consumer,
                route,
                key,
                Param::Bytes(request.fingerprint().as_bytes()),
                Param::Bytes(token.as_bytes()),
                Param::Int(duration_millis(lease_for)),
                Param::Bytes(previous.as_bytes()),
                Param::Int(i64::from(completed)),
                Param::Text(holder),
            ],
        )
        .await?;
        let found = rows.first().ok_or_else(|| {
            Error::store(
                BACKEND,
                StoreErrorKind::Other,
                "replace_reservation returned no row",
            )
        })?;
        let taken: bool = found.try_get("taken").map_err(crate::error::store_error)?;
        let present: bool = found
            .try_get("present")
            .map_err(crate::error::store_error)?;
        let until = row::instant(found, "deadline_at")?;
        Ok(match (taken, present, until) {
            (_, _, Some(until)) => Reserved::Written {
                until: timestamp(until)?,
            },
            // Another transaction holds the row (its holder committing right now).
            (false, true, None) => Reserved::Held { mismatch: false },
            // Not the record the decision saw any more, or gone since it read it.
            (true, _, None) | (false, false, None) => Reserved::Lost,
        })
    }

    /// Fenced completion (C6) on one of the store's own connections.
    pub(crate) async fn complete(
        &self,
        conn: &mut PgConnection,
        completion: &Completion,
    ) -> Result<(), Error> {
        self.complete_after(conn, &self.preamble, completion, false)
            .await
    }

    /// Fenced completion (C6) inside the caller's transaction on `conn`: nothing precedes it,
    /// the transaction's settings are the caller's (the statement sets its lock deadline).
    pub(crate) async fn complete_in(
        &self,
        conn: &mut PgConnection,
        completion: &Completion,
    ) -> Result<(), Error> {
        self.complete_after(conn, "", completion, false).await
    }

    /// Fenced completion (C6) in the transaction the store began for an effect on `conn`,
    /// only while that transaction is still open (`sql/complete.sql`): after an effect's own
    /// `COMMIT` or `ROLLBACK` it changes nothing ([`Error::LeaseLost`]; ask
    /// [`effect_tx_open`](Self::effect_tx_open) which).
    pub(crate) async fn complete_in_effect_tx(
        &self,
        conn: &mut PgConnection,
        completion: &Completion,
    ) -> Result<(), Error> {
        self.complete_after(conn, "", completion, true).await
    }

    /// Whether the transaction the store began for an effect on `conn` is still open (the
    /// effect did not end it with its own `COMMIT` or `ROLLBACK`); an error in a transaction an
    /// error aborted (SQLSTATE 25P02), which is still open.
    pub(crate) async fn effect_tx_open(&self, conn: &mut PgConnection) -> Result<bool, Error> {
        let found = fetch_optional_after(conn, self.mode, "", &self.sql.effect_tx_open, &[])
            .await?
            .ok_or_else(|| {
                Error::store(
                    BACKEND,
                    StoreErrorKind::Other,
                    "effect_tx_open returned no row",
                )
            })?;
        found.try_get("open").map_err(crate::error::store_error)
    }

    async fn complete_after(
        &self,
        conn: &mut PgConnection,
        preamble: &str,
        completion: &Completion,
        in_effect_tx: bool,
    ) -> Result<(), Error> {
        let [consumer, route, key] = id_params(completion.id());
        let token = completion.token();
        fenced(
            execute_after(
                conn,
                self.mode,
                preamble,
                &self.sql.complete,
                &[
                    consumer,
                    route,
                    key,
                    Param::Bytes(token.as_bytes()),
                    Param::Bytes(completion.encoded()),
                    Param::Int(duration_millis(completion.retain_for())),
                    Param::MaybeBytes(completion.doubt()),
                    Param::Bool(in_effect_tx),
                ],
            )
            .await?,
        )
    }

    /// Fenced release (C8).
    pub(crate) async fn release(
        &self,
        conn: &mut PgConnection,
        lease: &Lease,
    ) -> Result<(), Error> {
        let [consumer, route, key] = id_params(lease.id());
        let token = lease.token();
        fenced(
            execute_after(
                conn,
                self.mode,
                &self.preamble,
                &self.sql.release,
                &[consumer, route, key, Param::Bytes(token.as_bytes())],
            )
            .await?,
        )
    }

    /// Fenced renewal (C9); returns the new deadline, in the server's time.
    pub(crate) async fn renew(
        &self,
        conn: &mut PgConnection,
        lease: &Lease,
        lease_for: Duration,
    ) -> Result<Timestamp, Error> {
        let [consumer, route, key] = id_params(lease.id());
        let token = lease.token();
        let rows = fetch_all_after(
            conn,
            self.mode,
            &self.preamble,
            &self.sql.renew,
            &[
                consumer,
                route,
                key,
                Param::Bytes(token.as_bytes()),
                Param::Int(duration_millis(lease_for)),
            ],
        )
        .await?;
        let found = rows.first().ok_or(Error::LeaseLost)?;
        timestamp(row::required_instant(found, "deadline_at")?)
    }

    /// One bounded batch of expired records (C10), then of expired audit entries with what is
    /// left of `limit` (store rules 4 and 7): at most `limit` rows in all, each window one
    /// statement. The records' window starts where the last call's stopped (`purge_from`); a
    /// window that holds fewer expired records than are still wanted moves on to the next one,
    /// to the end of the table, while `deadline` leaves room for another window (stopped by
    /// it, the call returns what it deleted, and the next call goes on from there): records
    /// kept longer (a longer retention, another engine's policy on the same table) never hide
    /// expired ones behind them.
    pub(crate) async fn purge_expired(
        &self,
        conn: &mut PgConnection,
        limit: usize,
        deadline: Deadline,
    ) -> Result<usize, Error> {
        let bound = |n: usize| Param::Int(i64::try_from(n).unwrap_or(i64::MAX));
        let deleted = |n: u64| usize::try_from(n).unwrap_or(usize::MAX);
        let mut records = 0usize;
        let out_of_time = loop {
            let wanted = limit.saturating_sub(records);
            let started = std::time::Instant::now();
            let (purged, full) = self.purge_window(conn, wanted).await?;
            records = records.saturating_add(purged);
            // Another window only while this one was full (not the table's end), expired
            // records are still wanted and the deadline leaves room for one more.
            if records >= limit || !full {
                break false;
            }
            if deadline.remaining() < started.elapsed() * 2 {
                break true;
            }
        };
        let left = limit.saturating_sub(records);
        // A walk the deadline stopped leaves the audit trails to the next call: cut off now,
        // their statement would turn the records deleted into the call's error.
        if left == 0 || out_of_time {
            return Ok(records);
        }
        let entries = deleted(
            execute_after(
                conn,
                self.mode,
                &self.preamble,
                &self.sql.reconciliations_purge,
                &[bound(left)],
            )
            .await?,
        );
        Ok(records.saturating_add(entries))
    }

    /// One window of the records (`sql/purge_expired.sql`): at most `limit` expired records
    /// deleted among the 4 x `limit` after `purge_from`, which moves on past the window unless
    /// the batch was full (the window may hold more). Returns how many were deleted and
    /// whether the window was full (there are records after it).
    async fn purge_window(
        &self,
        conn: &mut PgConnection,
        limit: usize,
    ) -> Result<(usize, bool), Error> {
        let bound = |n: usize| Param::Int(i64::try_from(n).unwrap_or(i64::MAX));
        let from = self
            .purge_from
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone();
        let (at, consumer, route, key) =
            from.unwrap_or((i64::MIN, String::new(), String::new(), String::new()));
        let rows = fetch_all_after(
            conn,
            self.mode,
            &self.preamble,
            &self.sql.purge_expired,
            &[
                bound(limit),
                Param::Int(at),
                Param::Text(&consumer),
                Param::Text(&route),
                Param::Text(&key),
            ],
        )
        .await?;
        let row = rows
            .first()
            .ok_or_else(|| Error::store(BACKEND, StoreErrorKind::Other, "purge returned no row"))?;
        let get = |name: &str| -> Result<Option<i64>, Error> {
            row.try_get(name).map_err(crate::error::store_error)
        };
        let records = usize::try_from(get("purged")?.unwrap_or(0)).unwrap_or(0);
        let scanned = usize::try_from(get("scanned")?.unwrap_or(0)).unwrap_or(0);
        let last = match get("reserved_ms")? {
            Some(at) => {
                let text = |name: &str| -> Result<String, Error> {
                    row.try_get(name).map_err(crate::error::store_error)
                };
                Some((at, text("consumer")?, text("route")?, text("key")?))
            }
            None => None,
        };
        let full = scanned >= limit.saturating_mul(4);
        // A full batch may have left expired records in the window: it is read again. A window
        // short of its size reached the end: the next starts from the oldest.
        if records < limit {
            let next = last.filter(|_| full);
            *self
                .purge_from
                .lock()
                .unwrap_or_else(PoisonError::into_inner) = next;
        }
        Ok((records, full))
    }

    /// A decision about a record in doubt (store rule 7): one statement (`resolve_*.sql`) makes
    /// the change, fenced on the record's token, its liveness by the server's clock and the
    /// mark as the decider read it, and keeps the audit entry, so both commit or neither does,
    /// with no transaction of its own (it runs behind PgBouncer in transaction mode too).
    /// `false`, nothing written, when the record changed since it was read.
    pub(crate) async fn resolve(
        &self,
        conn: &mut PgConnection,
        resolution: &Resolution,
    ) -> Result<bool, Error> {
        let [consumer, route, key] = id_params(resolution.id());
        let token = resolution.token();
        let fence = [
            consumer,
            route,
            key,
            Param::Bytes(token.as_bytes()),
            Param::Bytes(resolution.read_doubt()),
            Param::Bytes(resolution.entry()),
            Param::Int(duration_millis(resolution.keep_entry_for())),
        ];
        let (sql, change) = match resolution.decided() {
            Decided::Settled { .. } => (
                &self.sql.resolve_settle,
                vec![
                    Param::Bytes(resolution.response()),
                    Param::Int(duration_millis(resolution.retain_for())),
                ],
            ),
            Decided::Released => (&self.sql.resolve_release, Vec::new()),
            Decided::StillUnknown { retry_after, .. } => (
                &self.sql.resolve_defer,
                vec![
                    Param::Bytes(resolution.doubt()),
                    Param::Int(duration_millis(retry_after)),
                ],
            ),
            _ => {
                return Err(Error::invalid(
                    Field::Config,
                    "a decision about a record in doubt this store does not know",
                ))
            }
        };
        let params: Vec<Param<'_>> = fence.into_iter().chain(change).collect();
        let entries = execute_after(conn, self.mode, &self.preamble, sql, &params).await?;
        Ok(entries == 1)
    }

    /// The audit trail of `id` (Operator rule 4): its unexpired entries by the server's clock,
    /// the newest [`ListQuery::MAX_LIMIT`], oldest first.
    pub(crate) async fn reconciliations(
        &self,
        conn: &mut PgConnection,
        id: &RecordId,
    ) -> Result<Vec<Reconciliation>, Error> {
        let [consumer, route, key] = id_params(id);
        let limit = Param::Int(i64::try_from(ListQuery::MAX_LIMIT).unwrap_or(i64::MAX));
        let rows = fetch_all_after(
            conn,
            self.mode,
            &self.preamble,
            &self.sql.reconciliations_query,
            &[consumer, route, key, limit],
        )
        .await?;
        rows.iter().map(row::decode_reconciliation).collect()
    }

    /// The record as stored, response decoded.
    pub(crate) async fn select(
        &self,
        conn: &mut PgConnection,
        id: &RecordId,
    ) -> Result<Option<Record>, Error> {
        let rows = fetch_all_after(
            conn,
            self.mode,
            &self.preamble,
            &self.sql.select_record,
            &id_params(id),
        )
        .await?;
        let Some(found) = rows.first() else {
            return Ok(None);
        };
        row::decode(found)?
            .try_map_response(|response| StoredResponse::decode(&row::fetched(response)?))
            .map(Some)
    }

    /// The record as stored, response decoded, with its provenance and its mark of doubt (a
    /// mark that does not decode is [`Error::CorruptRecord`]: a reconciler decides on it).
    pub(crate) async fn inspect(
        &self,
        conn: &mut PgConnection,
        id: &RecordId,
    ) -> Result<Option<Inspected>, Error> {
        let rows = fetch_all_after(
            conn,
            self.mode,
            &self.preamble,
            &self.sql.select_inspected,
            &id_params(id),
        )
        .await?;
        let Some(found) = rows.first() else {
            return Ok(None);
        };
        let record = row::decode(found)?
            .try_map_response(|response| StoredResponse::decode(&row::fetched(response)?))?;
        let provenance = row::decode_provenance(found, record.is_completed());
        let (doubt, check_at) = row::decode_doubt(found)?;
        Ok(Some(Inspected {
            record,
            provenance,
            doubt,
            check_at,
        }))
    }

    /// One page of a listing (store rule 6), by the server's clock.
    pub(crate) async fn list(
        &self,
        conn: &mut PgConnection,
        query: &ListQuery,
    ) -> Result<Page, Error> {
        let after = query.cursor().map(Cursor::position).transpose()?;
        let limit = query.limit_value();
        // One more than the page: it says whether a next page exists.
        let fetch = Param::Int(i64::try_from(limit.saturating_add(1)).unwrap_or(i64::MAX));
        let (consumer, route, key) = after.as_ref().map_or(("", "", ""), |p| {
            (p.id.consumer(), p.id.route(), p.id.key())
        });
        // The position's reservation time, in the listings ordered by it (-1 for the first page).
        let at = after
            .as_ref()
            .map_or(-1, |p| i64::try_from(p.reserved_at).unwrap_or(i64::MAX));
        let rows = match query.selection() {
            Selection::InProgress { older_than } => {
                let params = [
                    // Older than every record (they are all after 1970) without leaving
                    // PostgreSQL's timestamp range, however long the age asked.
                    Param::Int(duration_millis(*older_than).min(MAX_AGE_MS)),
                    Param::Int(at),
                    Param::Text(consumer),
                    Param::Text(route),
                    Param::Text(key),
                    fetch,
                ];
                fetch_all_after(
                    conn,
                    self.mode,
                    &self.preamble,
                    &self.sql.list_in_progress,
                    &params,
                )
                .await?
            }
            Selection::Completed {
                consumer: whose,
                route: only,
            } => {
                let params = [
                    Param::Text(whose),
                    Param::Text(only.as_deref().unwrap_or("")),
                    Param::Text(route),
                    Param::Text(key),
                    fetch,
                ];
                fetch_all_after(
                    conn,
                    self.mode,
                    &self.preamble,
                    &self.sql.list_completed,
                    &params,
                )
                .await?
            }
            Selection::Key { key: wanted } => {
                let params = [
                    Param::Text(wanted),
                    Param::Text(consumer),
                    Param::Text(route),
                    fetch,
                ];
                fetch_all_after(conn, self.mode, &self.preamble, &self.sql.list_key, &params)
                    .await?
            }
            Selection::InDoubt { due } => {
                let params = [
                    Param::Bool(*due),
                    Param::Int(at),
                    Param::Text(consumer),
                    Param::Text(route),
                    Param::Text(key),
                    fetch,
                ];
                fetch_all_after(
                    conn,
                    self.mode,
                    &self.preamble,
                    &self.sql.list_in_doubt,
                    &params,
                )
                .await?
            }
            _ => {
                return Err(Error::invalid(
                    Field::Config,
                    "a listing selection this store does not know",
                ))
            }
        };
        let records = rows
            .iter()
            .map(row::decode_listed)
            .collect::<Result<Vec<_>, Error>>()?;
        Ok(Page::from_fetched(records, limit))
    }

    /// Records by state at the server's now (store rule 6), the live ones in doubt among them:
    /// one pass over the table.
    pub(crate) async fn stats(&self, conn: &mut PgConnection) -> Result<Stats, Error> {
        let rows = fetch_all_after(conn, self.mode, &self.preamble, &self.sql.stats, &[]).await?;
        let found = rows.first().ok_or_else(|| {
            Error::store(BACKEND, StoreErrorKind::Other, "the count returned no row")
        })?;
        let get = |name: &str| -> Result<i64, Error> {
            found.try_get(name).map_err(crate::error::store_error)
        };
        let mut stats = Stats::at(timestamp(get("now_ms")?)?);
        let count = |n: i64| u64::try_from(n).unwrap_or(0);
        stats.in_progress = count(get("in_progress")?);
        stats.orphaned = count(get("orphaned")?);
        stats.completed = count(get("completed")?);
        stats.expired = count(get("expired")?);
        stats.in_doubt = count(get("in_doubt")?);
        let oldest: Option<i64> = found
            .try_get("oldest_ms")
            .map_err(crate::error::store_error)?;
        stats.oldest_in_progress = oldest.map(timestamp).transpose()?;
        Ok(stats)
    }
}

/// A fenced statement changes exactly the holder's row, or nothing: then the lease is lost.
fn fenced(changed: u64) -> Result<(), Error> {
    match changed {
        1 => Ok(()),
        _ => Err(Error::LeaseLost),
    }
}

/// A record a reservation step found (`sql/reserve.sql`, `sql/read.sql`), with the statement's
/// time and whether it is in doubt.
fn found_record(found: &PgRow) -> Result<Reserved, Error> {
    let now = row::required_instant(found, "now_at")?;
    let in_doubt: bool = found
        .try_get("in_doubt")
        .map_err(crate::error::store_error)?;
    Ok(Reserved::Found {
        record: row::decode(found)?,
        now: timestamp(now)?,
        in_doubt,
    })
}
