//! What each command does: read or maintain the store, and say what it found.

use crate::cli::{Cli, Command, PageArgs};
use crate::render::{self, Table, COMPLETED_COLUMNS, PENDING_COLUMNS};
use crate::target::{Names, Target, Usage};
use idem_core::store::{Cursor, Expiry, ListQuery, Listed, Page, Store};
use idem_core::{Error, Field, IdempotencyKey, RecordId, Scope};
use serde_json::{json, Value};
use std::collections::HashSet;
use std::io::Write;

/// How a command ended, for the exit status.
#[derive(Debug)]
pub enum Failure {
    /// The command line was wrong (exit 2).
    Usage(String),
    /// The store refused or failed (exit 1).
    Idem(Error),
    /// `inspect` found no record (exit 3).
    NotFound,
    /// Writing the output failed (a closed pipe): exit 1, nothing to add.
    Output(std::io::Error),
}

/// Input the command line gave that idem refuses (a key, a consumer, a cursor): exit 2.
fn usage(error: Error) -> Failure {
    Failure::Usage(error.to_string())
}

impl From<Error> for Failure {
    fn from(error: Error) -> Self {
        Failure::Idem(error)
    }
}

impl From<Usage> for Failure {
    fn from(usage: Usage) -> Self {
        Failure::Usage(usage.0)
    }
}

impl From<std::io::Error> for Failure {
    fn from(error: std::io::Error) -> Self {
        Failure::Output(error)
    }
}

/// Where a command writes: the answer on `out`, progress and notes on `err`.
pub struct Io<'a> {
    /// The answer (a table or one JSON document).
    pub out: &'a mut dyn Write,
    /// Progress, notes, the next cursor of a table listing.
    pub err: &'a mut dyn Write,
    /// `--json`.
    pub json: bool,
}

impl Io<'_> {
    fn json(&mut self, value: &Value) -> Result<(), Failure> {
        writeln!(self.out, "{}", render::json_text(value))?;
        Ok(())
    }
}

/// Runs the command the command line names.
pub async fn run(cli: Cli, io: &mut Io<'_>) -> Result<(), Failure> {
    let url = cli
        .url
        .as_deref()
        .ok_or_else(|| Usage("no store: pass --url or set IDEM_URL".into()))?;
    let target = Target::parse(url)?;
    let names = Names {
        table: cli.table,
        schema: cli.schema,
        prefix: cli.prefix,
    };
    target.check(&names)?;
    match cli.command {
        Command::Migrate { print } => migrate(&target, &names, print, io).await,
        Command::Inspect {
            consumer,
            route,
            key,
            body,
        } => {
            let id = RecordId::new(
                Scope::new(&consumer, &route).map_err(usage)?,
                IdempotencyKey::new(&key).map_err(usage)?,
            );
            let store = target.open(&names).await?;
            inspect(&*store, &id, body, io).await
        }
        Command::Pending { older_than, page } => {
            let store = target.open(&names).await?;
            list(&*store, ListQuery::in_progress(older_than), &page, io).await
        }
        Command::Completed {
            consumer,
            route,
            page,
        } => {
            let mut query = ListQuery::completed(&consumer).map_err(usage)?;
            if let Some(route) = route {
                query = query.route(&route).map_err(usage)?;
            }
            let store = target.open(&names).await?;
            list(&*store, query, &page, io).await
        }
        Command::Purge { batch, all } => {
            let store = target.open(&names).await?;
            purge(&*store, batch, all, io).await
        }
        Command::Stats => {
            let store = target.open(&names).await?;
            let stats = store.stats().await?;
            if io.json {
                io.json(&render::stats_json(&stats))
            } else {
                write!(io.out, "{}", render::stats_text(&stats))?;
                Ok(())
            }
        }
    }
}

async fn migrate(
    target: &Target,
    names: &Names,
    print: bool,
    io: &mut Io<'_>,
) -> Result<(), Failure> {
    if print {
        return match target.schema_sql(names)? {
            Some(sql) if io.json => io.json(&json!({ "sql": sql })),
            Some(sql) => Ok(writeln!(io.out, "{sql}")?),
            None => note(io, "Redis has no schema: records are hashes with a TTL"),
        };
    }
    match target.migrate(names).await? {
        Some(()) if io.json => io.json(&json!({ "migrated": true })),
        Some(()) => Ok(writeln!(io.out, "the schema is up to date")?),
        None => note(io, "Redis has no schema: nothing to migrate"),
    }
}

/// A remark that is not the answer: on stderr for people, `{"note": …}` for scripts.
fn note(io: &mut Io<'_>, text: &str) -> Result<(), Failure> {
    if io.json {
        io.json(&json!({ "note": text }))
    } else {
        writeln!(io.err, "{text}")?;
        Ok(())
    }
}

async fn inspect(
    store: &dyn Store,
    id: &RecordId,
    body: bool,
    io: &mut Io<'_>,
) -> Result<(), Failure> {
    let Some(record) = store.lookup(id).await? else {
        if io.json {
            io.json(&Value::Null)?;
        } else {
            writeln!(io.err, "no record for this consumer, route and key")?;
        }
        return Err(Failure::NotFound);
    };
    let now = render::now();
    if io.json {
        let mut value = render::record_json(&record, now, body);
        if let Value::Object(map) = &mut value {
            map.insert("consumer".into(), json!(id.consumer()));
            map.insert("route".into(), json!(id.route()));
            map.insert("key".into(), json!(id.key()));
        }
        io.json(&value)
    } else {
        write!(io.out, "{}", render::record_text(&record, now, body))?;
        Ok(())
    }
}

async fn list(
    store: &dyn Store,
    query: ListQuery,
    page: &PageArgs,
    io: &mut Io<'_>,
) -> Result<(), Failure> {
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
        } = store.list(&query).await.map_err(|error| match error {
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
    if io.json {
        let records: Vec<Value> = records.iter().map(render::listed_json).collect();
        return io.json(&json!({ "records": records, "next": next.map(|c| c.to_string()) }));
    }
    let in_progress = matches!(
        query.selection(),
        idem_core::store::Selection::InProgress { .. }
    );
    let mut table = Table::new(if in_progress {
        PENDING_COLUMNS
    } else {
        COMPLETED_COLUMNS
    });
    let now = render::now();
    for record in &records {
        table.row(render::listed_row(record, now));
    }
    if records.is_empty() {
        writeln!(io.err, "no records")?;
    } else {
        write!(io.out, "{}", table.render())?;
    }
    if let Some(next) = next {
        writeln!(io.err, "more: --after {next}")?;
    }
    Ok(())
}

async fn purge(store: &dyn Store, batch: u32, all: bool, io: &mut Io<'_>) -> Result<(), Failure> {
    if store.capabilities().expiry == Expiry::ServerTtl {
        note(
            io,
            "this store expires records by itself (a TTL): nothing to purge",
        )?;
        return Ok(());
    }
    let batch = usize::try_from(batch).unwrap_or(usize::MAX);
    let (mut purged, mut batches) = (0usize, 0usize);
    loop {
        let deleted = store.purge_expired(batch).await?;
        purged += deleted;
        batches += 1;
        if !io.json {
            writeln!(
                io.err,
                "batch {batches}: {deleted} deleted ({purged} in all)"
            )?;
        }
        if !all || deleted < batch {
            break;
        }
    }
    if io.json {
        io.json(&json!({ "purged": purged, "batches": batches }))
    } else {
        writeln!(io.out, "{purged} expired records deleted")?;
        Ok(())
    }
}
