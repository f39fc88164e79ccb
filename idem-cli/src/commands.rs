//! What each command does: read or maintain the store, and say what it found.

use crate::cli::{Cli, Command, PageArgs};
use crate::failure::{usage, Failure};
use crate::io::Io;
use crate::render::{self, Table, COMPLETED_COLUMNS, KEY_COLUMNS, PENDING_COLUMNS};
use crate::route::looks_concrete;
use crate::store_call::deadline;
use crate::store_call::{fetch, record_id, within};
use crate::target::{Names, Target, Usage};
use idem_core::{Error, Field, RecordId};
use idem_ops::{ListQuery, Listed, ListingOrder, Operator};
use serde_json::{json, Value};
use std::collections::HashSet;
use std::sync::OnceLock;
use std::time::Duration;

/// The most records a lookup by key shows.
pub(crate) const KEY_LOOKUP_MAX: usize = 50;

/// What a lookup by key says beside its answer.
const SHARED_KEYS: &str = "keys are chosen by clients: two clients may send the same key, and each (consumer, route, key) is a record of its own (C2)";

/// The most `inspect KEY` spends on a scanning store (`--scan-budget`), set once per run.
static SCAN_BUDGET: OnceLock<Duration> = OnceLock::new();

/// Runs the command the command line names.
pub(crate) async fn run(cli: Cli, io: &mut Io<'_>) -> Result<(), Failure> {
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
    crate::store_call::set_deadline(Duration::from_secs(cli.timeout));
    let _ = SCAN_BUDGET.set(Duration::from_secs(cli.scan_budget));
    match cli.command {
        Command::Migrate { print } => migrate(&target, &names, print, io).await,
        Command::Inspect {
            consumer_or_key,
            route,
            key,
            body,
        } => match (route, key) {
            (Some(route), Some(key)) => {
                let id = record_id(&consumer_or_key, &route, &key)?;
                let store = open(&target, &names).await?;
                inspect(&*store, &id, body, io).await
            }
            (None, None) => {
                let query = ListQuery::key(&consumer_or_key).map_err(usage)?;
                let store = open(&target, &names).await?;
                inspect_key(&*store, query, body, io).await
            }
            _ => Err(Failure::Usage(
                "inspect takes CONSUMER ROUTE KEY, or the KEY alone".into(),
            )),
        },
        Command::Pending {
            older_than,
            page,
            watch,
        } => {
            let what = Watched::Pending(ListQuery::in_progress(older_than), page);
            watching(&target, &names, &what, watch.watch, io).await
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
            let store = open(&target, &names).await?;
            list(&*store, query, &page, io).await
        }
        Command::Purge { batch, all } => {
            let store = open(&target, &names).await?;
            purge(&*store, batch, all, io).await
        }
        Command::Stats { watch } => {
            watching(&target, &names, &Watched::Stats, watch.watch, io).await
        }
        Command::Doubt { command } => {
            let store = open(&target, &names).await?;
            crate::doubt::run(store, command, cli.timeout, io).await
        }
        Command::Outbox { command } => crate::outbox::run(&target, &names, command, io).await,
    }
}

async fn open(target: &Target, names: &Names) -> Result<Box<dyn Operator>, Failure> {
    within(target.open(names)).await.map_err(opening)
}

/// A failure to open the store; a table at another schema version than this command's gets
/// the advice that helps.
fn opening(error: Error) -> Failure {
    let Error::SchemaVersion {
        table,
        found,
        expected,
    } = &error
    else {
        return Failure::Idem(error);
    };
    let advice = if found > expected {
        format!("table {table} has schema version {found}, newer than this command's {expected}. This idem command is older than the table: upgrade the command (the idem-cli of the release that migrated the table); `idem migrate` cannot help")
    } else if *found == 0 {
        format!("no idem table {table} in this database: migrate first (`idem migrate`, or deploy the release that migrates it)")
    } else {
        format!("table {table} has schema version {found}, older than this command's {expected}: migrate first (`idem migrate`, or deploy the release that migrates it)")
    };
    Failure::Idem(Error::invalid(Field::Config, advice))
}

/// A command `--watch` can run again and again.
enum Watched {
    Pending(ListQuery, PageArgs),
    Stats,
}

/// Runs `what` once, or with `every` seconds every that many seconds until Ctrl-C. While
/// watching, a store error is printed and the next run tries again (the store recovers by
/// itself, C13); a mistake on the command line or in the configuration, which no retry can
/// fix, ends the watch with its exit status.
async fn watching(
    target: &Target,
    names: &Names,
    what: &Watched,
    every: Option<u64>,
    io: &mut Io<'_>,
) -> Result<(), Failure> {
    let Some(secs) = every else {
        let store = open(target, names).await?;
        return once(&*store, what, io).await;
    };
    let interval = Duration::from_secs(secs);
    // Installed before the first run, so Ctrl-C stops a watch whatever it is doing (opening
    // the store, waiting for an answer, sleeping).
    let mut stop = interrupt()?;
    let mut store: Option<Box<dyn Operator>> = None;
    loop {
        let tick = async {
            if io.terminal {
                // Clear the screen and go home: only a terminal gets escape sequences.
                write!(io.out, "\x1b[2J\x1b[H")?;
            }
            if !io.json {
                writeln!(
                    io.out,
                    "every {secs}s, at {} (Ctrl-C stops)",
                    render::time(render::now())
                )?;
            }
            let result = match &store {
                Some(open) => once(&**open, what, io).await,
                None => match open(target, names).await {
                    Ok(opened) => once(&**store.insert(opened), what, io).await,
                    Err(failure) => Err(failure),
                },
            };
            match result {
                Err(Failure::Idem(error)) if heals(&error) => {
                    writeln!(
                        io.err,
                        "idem: {} (trying again in {secs}s)",
                        crate::describe(&error)
                    )?;
                }
                other => other?,
            }
            io.out.flush()?;
            tokio::time::sleep(interval).await;
            Ok::<(), Failure>(())
        };
        tokio::select! {
            ticked = tick => ticked?,
            () = stop.recv() => return Ok(()),
        }
    }
}

/// Ctrl-C (SIGINT), listened for from now on.
struct Interrupt(tokio::signal::unix::Signal);

impl Interrupt {
    async fn recv(&mut self) {
        self.0.recv().await;
    }
}

fn interrupt() -> Result<Interrupt, Failure> {
    tokio::signal::unix::signal(tokio::signal::unix::SignalKind::interrupt())
        .map(Interrupt)
        .map_err(Failure::Output)
}

/// Whether a store error may go away by itself (a store down or not answering, a corrupt
/// record being fixed), so that a watch tries again; a configuration or usage mistake does not,
/// and neither does a table of another schema version than this command's (older: migrate
/// first; newer: upgrade the command).
fn heals(error: &Error) -> bool {
    !matches!(
        error,
        Error::InvalidInput { .. } | Error::KeyMissing | Error::SchemaVersion { .. }
    )
}

async fn once(store: &dyn Operator, what: &Watched, io: &mut Io<'_>) -> Result<(), Failure> {
    match what {
        Watched::Pending(query, page) => list(store, query.clone(), page, io).await,
        Watched::Stats => {
            let stats = store.stats(deadline()).await?;
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
    match within(target.migrate(names)).await? {
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
    store: &dyn Operator,
    id: &RecordId,
    body: bool,
    io: &mut Io<'_>,
) -> Result<(), Failure> {
    let Some(record) = store.inspect(id, deadline()).await? else {
        if io.json {
            io.json(&Value::Null)?;
        } else {
            writeln!(io.err, "no record for this consumer, route and key")?;
        }
        not_found_hints(store, id, io).await?;
        return Err(Failure::NotFound);
    };
    let now = render::now();
    if io.json {
        let mut value = render::inspected_json(&record, now, body);
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

/// Every record of the query's key, at most [`KEY_LOOKUP_MAX`] (a scanning store's pages are
/// followed until that many are found, the scan ends or `--scan-budget` has passed), by
/// consumer then route; whether more exist; and whether the budget stopped the scan.
async fn records_of_key(
    store: &dyn Operator,
    query: ListQuery,
) -> Result<(Vec<Listed>, bool, bool), Failure> {
    let budget = *SCAN_BUDGET.get_or_init(|| Duration::from_secs(30));
    let started = std::time::Instant::now();
    let mut query = query.limit(KEY_LOOKUP_MAX + 1);
    let mut found: Vec<Listed> = Vec::new();
    let mut seen = HashSet::new();
    let mut stopped = false;
    loop {
        let page = store.list(&query, deadline()).await?;
        found.extend(
            page.records
                .into_iter()
                .filter(|r| seen.insert(r.id.clone())),
        );
        match page.next {
            Some(_) if started.elapsed() >= budget => {
                stopped = true;
                break;
            }
            Some(next) if found.len() <= KEY_LOOKUP_MAX => query = query.after(next),
            _ => break,
        }
    }
    let more = found.len() > KEY_LOOKUP_MAX;
    found.truncate(KEY_LOOKUP_MAX);
    found.sort_by(|a, b| (a.id.consumer(), a.id.route()).cmp(&(b.id.consumer(), b.id.route())));
    Ok((found, more, stopped))
}

/// `inspect KEY`: the records of one key under every consumer and route; the whole record too
/// when there is just one.
async fn inspect_key(
    store: &dyn Operator,
    query: ListQuery,
    body: bool,
    io: &mut Io<'_>,
) -> Result<(), Failure> {
    let (records, more, stopped) = records_of_key(store, query).await?;
    if stopped {
        writeln!(
            io.err,
            "the scan stopped after {}s (--scan-budget reached): records of this key may exist beyond what is shown",
            SCAN_BUDGET.get().map_or(0, Duration::as_secs)
        )?;
    }
    let now = render::now();
    let single = match records.as_slice() {
        [only] => store.inspect(&only.id, deadline()).await?,
        _ => None,
    };
    if io.json {
        let listed: Vec<Value> = records.iter().map(render::listed_json).collect();
        io.json(&json!({
            "records": listed,
            "more": more,
            "limit": KEY_LOOKUP_MAX,
            "scan_budget_reached": stopped,
            "record": single.as_ref().map(|r| render::inspected_json(r, now, body)),
            "note": SHARED_KEYS,
        }))?;
    } else if !records.is_empty() {
        let mut table = Table::new(KEY_COLUMNS);
        for record in &records {
            table.row(render::key_row(record, now));
        }
        write!(io.out, "{}", table.render())?;
        if let Some(single) = &single {
            writeln!(io.out)?;
            write!(io.out, "{}", render::record_text(single, now, body))?;
        }
        writeln!(io.err, "note: {SHARED_KEYS}")?;
        if more {
            writeln!(io.err, "more than {KEY_LOOKUP_MAX} records have this key: the first {KEY_LOOKUP_MAX} are shown; inspect one with `idem inspect CONSUMER ROUTE KEY`")?;
        } else if records.len() > 1 {
            writeln!(io.err, "inspect one with `idem inspect CONSUMER ROUTE KEY`")?;
        }
    } else {
        writeln!(
            io.err,
            "no record has this key, under any consumer or route"
        )?;
    }
    if records.is_empty() {
        return Err(Failure::NotFound);
    }
    Ok(())
}

/// After `inspect CONSUMER ROUTE KEY` found nothing, on stderr: a route that looks like a
/// concrete path (records are stored under the template), and the consumers and routes the key
/// does have records under. A store that cannot look up by key adds nothing.
async fn not_found_hints(
    store: &dyn Operator,
    id: &RecordId,
    io: &mut Io<'_>,
) -> Result<(), Failure> {
    if let Some(segment) = looks_concrete(id.route()) {
        writeln!(
            io.err,
            "hint: the route looks like a concrete path ({:?} looks like an id); records are stored under the route template the application names, for example \"POST /v1/customers/{{id}}/refunds\"",
            render::printable(segment)
        )?;
    }
    if store.listing_order() == ListingOrder::Scan {
        // Finding a key means scanning every record of this store: only when asked.
        writeln!(
            io.err,
            "hint: to list the records of this key under every consumer and route, try `idem inspect {}` (on Redis it scans every record)",
            render::printable(id.key())
        )?;
        return Ok(());
    }
    let Ok(query) = ListQuery::key(id.key()) else {
        return Ok(());
    };
    let Ok((records, more, _)) = records_of_key(store, query).await else {
        return Ok(());
    };
    if records.is_empty() {
        writeln!(io.err, "no record has this key under any consumer or route")?;
        return Ok(());
    }
    writeln!(io.err, "this key has records under:")?;
    for record in &records {
        writeln!(
            io.err,
            "  {}  {}",
            render::printable(record.id.consumer()),
            render::printable(record.id.route())
        )?;
    }
    if more {
        writeln!(
            io.err,
            "  … and more (`idem inspect KEY` lists {KEY_LOOKUP_MAX})"
        )?;
    }
    Ok(())
}

async fn list(
    store: &dyn Operator,
    query: ListQuery,
    page: &PageArgs,
    io: &mut Io<'_>,
) -> Result<(), Failure> {
    let (records, next) = fetch(store, query.clone(), page).await?;
    if io.json {
        let records: Vec<Value> = records.iter().map(render::listed_json).collect();
        return io.json(&json!({ "records": records, "next": next.map(|c| c.to_string()) }));
    }
    let in_progress = matches!(query.selection(), idem_ops::Selection::InProgress { .. });
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

async fn purge(
    store: &dyn Operator,
    batch: u32,
    all: bool,
    io: &mut Io<'_>,
) -> Result<(), Failure> {
    if store.capabilities().server_ttl {
        note(
            io,
            "this store expires records by itself (a TTL): nothing to purge",
        )?;
        return Ok(());
    }
    let batch = usize::try_from(batch).unwrap_or(usize::MAX);
    let (mut purged, mut batches) = (0usize, 0usize);
    loop {
        let deleted = store.purge_expired(batch, deadline()).await?;
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
