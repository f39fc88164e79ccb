//! `idem outbox`: the outbox's deliveries (idem-outbox) in a SQLite or PostgreSQL store's
//! database: count, list, inspect, retry, replay, purge.

use crate::cli::OutboxCommand;
use crate::failure::Failure;
use crate::io::Io;
use crate::store_call::within;
use crate::target::{Names, Target};
use idem_core::{Error, StoreErrorKind};
use idem_outbox::{
    AttemptInfo, DeliveryInfo, DeliveryState, MessageId, OutboxError, PgOutbox, Retention,
    SqliteOutbox,
};
use serde_json::{json, Value};

/// The outbox of the target's database.
enum Outbox {
    Sqlite(SqliteOutbox),
    Postgres(PgOutbox),
}

/// An outbox error as the command reports it: input is a usage error (exit 2), the rest the
/// store's (exit 1).
fn failure(error: OutboxError) -> Failure {
    match error {
        OutboxError::Store(error) => Failure::Idem(error),
        OutboxError::Timeout(after) => Failure::Idem(Error::store(
            "idem-outbox",
            StoreErrorKind::Unavailable,
            format!("no answer within {after:?}"),
        )),
        other => Failure::Usage(other.to_string()),
    }
}

/// Whether the outbox's deliveries table is in the SQLite file.
const OUTBOX_IN_SQLITE: &str =
    "SELECT EXISTS (SELECT 1 FROM sqlite_master WHERE type = 'table' AND name = 'idem_outbox_deliveries')";
/// Whether it is on the PostgreSQL connection's search path, where the outbox creates it.
/// And whether it has the claim's column, which an application's `PgOutbox::open` of this
/// version adds to an earlier table (the command runs no DDL: it would lock the deliveries).
const OUTBOX_IN_POSTGRES: &str = "SELECT to_regclass('idem_outbox_deliveries') IS NOT NULL, \
     EXISTS (SELECT 1 FROM pg_attribute WHERE attrelid = to_regclass('idem_outbox_deliveries') \
     AND attname = 'claimed_until' AND NOT attisdropped)";

fn there(present: bool) -> Result<(), Failure> {
    if present {
        Ok(())
    } else {
        Err(Failure::Usage(
            "this database has no outbox: its tables are created by the application \
             (SqliteOutbox::open, PgOutbox::open), never by the idem command"
                .into(),
        ))
    }
}

/// `call` within the command's deadline.
async fn bounded<T>(
    call: impl std::future::Future<Output = Result<T, OutboxError>>,
) -> Result<T, Failure> {
    within(async { Ok(call.await) })
        .await
        .map_err(Failure::Idem)?
        .map_err(failure)
}

/// The outbox of the target's database, which a command never creates: a database without
/// its tables (an application creates them, `SqliteOutbox::open`, `PgOutbox::open`) is a usage
/// error, nothing written.
async fn open(target: &Target, names: &Names) -> Result<Outbox, Failure> {
    match target {
        Target::Sqlite(_) => {
            let store = within(target.open_sqlite(names)).await?;
            let present = within(store.read(|db| {
                db.query_row(OUTBOX_IN_SQLITE, [], |row| row.get::<_, bool>(0))
                    .map_err(|e| Error::store("idem", StoreErrorKind::Other, e))
            }))
            .await??;
            there(present)?;
            Ok(Outbox::Sqlite(bounded(SqliteOutbox::open(&store)).await?))
        }
        Target::Postgres(_) => {
            let store = within(target.open_postgres(names)).await?;
            let present = within(async {
                let row = idem_postgres::sqlx::raw_sql(OUTBOX_IN_POSTGRES)
                    .fetch_one(store.pool())
                    .await
                    .map_err(|e| Error::store("idem", StoreErrorKind::Unavailable, e))?;
                let column = |i| {
                    idem_postgres::sqlx::Row::try_get::<bool, _>(&row, i)
                        .map_err(|e| Error::store("idem", StoreErrorKind::Other, e))
                };
                Ok((column(0)?, column(1)?))
            })
            .await?;
            let (present, current) = present;
            there(present)?;
            if !current {
                return Err(Failure::Usage(
                    "this database's outbox predates the idem command: the application's \
                     PgOutbox::open of this version brings it up to date"
                        .into(),
                ));
            }
            // Its schema is never run here: its `CREATE INDEX IF NOT EXISTS` would lock the
            // deliveries against the application's enqueues.
            Ok(Outbox::Postgres(PgOutbox::existing(&store)))
        }
        Target::Redis(_) | Target::RedisCluster(_) => Err(Failure::Usage(
            "the outbox lives in a SQL store's database: Redis shares no transaction with the effect (C14)"
                .into(),
        )),
    }
}

impl Outbox {
    async fn deliveries(&self, id: &MessageId) -> Result<Vec<DeliveryInfo>, Failure> {
        match self {
            Outbox::Sqlite(o) => bounded(o.deliveries(id)).await,
            Outbox::Postgres(o) => bounded(o.deliveries(id)).await,
        }
    }

    async fn attempts(&self, delivery: i64) -> Result<Vec<AttemptInfo>, Failure> {
        match self {
            Outbox::Sqlite(o) => bounded(o.attempts(delivery)).await,
            Outbox::Postgres(o) => bounded(o.attempts(delivery)).await,
        }
    }
}

/// Runs an outbox command.
pub(crate) async fn run(
    target: &Target,
    names: &Names,
    command: OutboxCommand,
    io: &mut Io<'_>,
) -> Result<(), Failure> {
    let outbox = open(target, names).await?;
    match command {
        OutboxCommand::Counts => {
            let counts = match &outbox {
                Outbox::Sqlite(o) => bounded(o.counts()).await?,
                Outbox::Postgres(o) => bounded(o.counts()).await?,
            };
            let oldest = match &outbox {
                Outbox::Sqlite(o) => bounded(o.oldest_pending_age()).await?,
                Outbox::Postgres(o) => bounded(o.oldest_pending_age()).await?,
            };
            let value = json!({
                "pending": counts.pending,
                "delayed": counts.delayed,
                "dead": counts.dead,
                "oldest_pending_age_ms": oldest.map(|age| age.as_millis() as u64),
            });
            if io.json {
                return io.json(&value);
            }
            writeln!(
                io.out,
                "pending {}  delayed {}  dead {}",
                counts.pending, counts.delayed, counts.dead
            )?;
            if let Some(age) = oldest {
                writeln!(
                    io.out,
                    "oldest pending: {}",
                    humantime::format_duration(round(age))
                )?;
            }
            Ok(())
        }
        OutboxCommand::List { state, limit } => {
            let state = parse_state(&state)?;
            let listed = match &outbox {
                Outbox::Sqlite(o) => bounded(o.list(state, limit)).await?,
                Outbox::Postgres(o) => bounded(o.list(state, limit)).await?,
            };
            if io.json {
                return io.json(&Value::Array(listed.iter().map(delivery_json).collect()));
            }
            writeln!(
                io.out,
                "MESSAGE\tENDPOINT\tSTATE\tATTEMPTS\tLAST STATUS\tLAST ERROR"
            )?;
            for d in &listed {
                writeln!(io.out, "{}", delivery_line(d))?;
            }
            Ok(())
        }
        OutboxCommand::Inspect { message_id } => {
            let id = MessageId::from_stored(message_id);
            let deliveries = outbox.deliveries(&id).await?;
            if deliveries.is_empty() {
                writeln!(io.err, "no message {id}")?;
                return Err(Failure::NotFound);
            }
            let mut shown = Vec::new();
            for d in &deliveries {
                let attempts = outbox.attempts(d.id).await?;
                shown.push((d, attempts));
            }
            if io.json {
                let value = shown
                    .iter()
                    .map(|(d, attempts)| {
                        let mut value = delivery_json(d);
                        value["attempts_recorded"] =
                            Value::Array(attempts.iter().map(attempt_json).collect());
                        value
                    })
                    .collect();
                return io.json(&Value::Array(value));
            }
            for (d, attempts) in shown {
                writeln!(io.out, "{}", delivery_line(d))?;
                for a in attempts {
                    writeln!(
                        io.out,
                        "  attempt {}  started {} ms  took {} ms  status {}  {}  response {:?}",
                        a.attempt,
                        a.started_at_ms,
                        a.duration_ms,
                        a.status.map_or("-".into(), |s| s.to_string()),
                        a.error.as_deref().unwrap_or(""),
                        String::from_utf8_lossy(&a.response)
                    )?;
                }
            }
            Ok(())
        }
        OutboxCommand::Retry { message_id } => {
            let id = MessageId::from_stored(message_id);
            let n = match &outbox {
                Outbox::Sqlite(o) => bounded(o.retry(&id)).await?,
                Outbox::Postgres(o) => bounded(o.retry(&id)).await?,
            };
            changed(io, "retried", &id, n)
        }
        OutboxCommand::Replay { message_id } => {
            let id = MessageId::from_stored(message_id);
            let n = match &outbox {
                Outbox::Sqlite(o) => bounded(o.replay(&id)).await?,
                Outbox::Postgres(o) => bounded(o.replay(&id)).await?,
            };
            changed(io, "replayed", &id, n)
        }
        OutboxCommand::Purge {
            delivered_for,
            dead_for,
            batch,
        } => {
            let retention = Retention {
                delivered: delivered_for,
                dead: dead_for,
            };
            let batch = batch as usize;
            let mut total = 0;
            loop {
                let purged = match &outbox {
                    Outbox::Sqlite(o) => bounded(o.purge(retention, batch)).await?,
                    Outbox::Postgres(o) => bounded(o.purge(retention, batch)).await?,
                };
                total += purged;
                if purged < batch as u64 {
                    break;
                }
            }
            if io.json {
                return io.json(&json!({ "purged": total }));
            }
            writeln!(io.out, "purged {total} deliveries")?;
            Ok(())
        }
    }
}

fn changed(io: &mut Io<'_>, what: &str, id: &MessageId, n: u64) -> Result<(), Failure> {
    if io.json {
        io.json(&json!({ what: n, "message_id": id.as_str() }))?;
    } else {
        writeln!(io.out, "{what} {n} deliveries of {id}")?;
    }
    if n == 0 {
        return Err(Failure::NotFound);
    }
    Ok(())
}

fn parse_state(text: &str) -> Result<DeliveryState, Failure> {
    match text {
        "pending" => Ok(DeliveryState::Pending),
        "delivered" => Ok(DeliveryState::Delivered),
        "dead" => Ok(DeliveryState::Dead),
        _ => Err(Failure::Usage(format!(
            "--state {text}: pending, delivered or dead"
        ))),
    }
}

fn state_name(state: DeliveryState) -> &'static str {
    match state {
        DeliveryState::Pending => "pending",
        DeliveryState::Delivered => "delivered",
        DeliveryState::Dead => "dead",
        _ => "?",
    }
}

fn delivery_json(d: &DeliveryInfo) -> Value {
    json!({
        "message_id": d.message_id.as_str(),
        "endpoint": d.endpoint,
        "state": state_name(d.state),
        "attempts": d.attempts,
        "last_status": d.last_status,
        "last_error": d.last_error,
    })
}

fn attempt_json(a: &AttemptInfo) -> Value {
    json!({
        "attempt": a.attempt,
        "started_at_ms": a.started_at_ms,
        "duration_ms": a.duration_ms,
        "status": a.status,
        "error": a.error,
        "response": String::from_utf8_lossy(&a.response),
    })
}

fn delivery_line(d: &DeliveryInfo) -> String {
    format!(
        "{}\t{}\t{}\t{}\t{}\t{}",
        d.message_id,
        d.endpoint,
        state_name(d.state),
        d.attempts,
        d.last_status.map_or("-".into(), |s| s.to_string()),
        d.last_error.as_deref().unwrap_or("-")
    )
}

fn round(age: std::time::Duration) -> std::time::Duration {
    std::time::Duration::from_secs(age.as_secs())
}
