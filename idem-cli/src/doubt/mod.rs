//! `idem doubt`: the records in doubt (C8; docs/state-machine.md, "Records in doubt"). `list`
//! and `show` read; `settle` and `release` decide one record through the library's one fenced
//! path ([`resolve`](idem_ops::reconcile::resolve)), which writes the decision
//! and its audit entry in one step, or nothing if the record changed since it was read.

mod decide;
mod render;

use crate::cli::{DoubtCommand, PageArgs};
use crate::failure::Failure;
use crate::io::Io;
use crate::render::{now, printable, Table};
use crate::store_call::deadline;
use crate::store_call::{fetch, record_id};
use idem_core::store::RecordState;
use idem_core::{RecordId, Timestamp};
use idem_ops::reconcile::InDoubt;
use idem_ops::{Inspected, ListQuery, ListingOrder, Operator};
use serde_json::{json, Value};
use std::time::Duration;

/// Runs a `doubt` command on `store`; `timeout` is `--timeout`, in seconds.
pub(crate) async fn run(
    store: Box<dyn Operator>,
    command: DoubtCommand,
    timeout: u64,
    io: &mut Io<'_>,
) -> Result<(), Failure> {
    match command {
        DoubtCommand::List { due, page } => list(&*store, due, &page, io).await,
        DoubtCommand::Show { record } => {
            let id = record_id(&record.consumer, &record.route, &record.key)?;
            show(&*store, &id, io).await
        }
        DoubtCommand::Settle {
            record,
            status,
            body,
            body_file,
            headers,
            retention,
            decision,
        } => {
            let id = record_id(&record.consumer, &record.route, &record.key)?;
            let answer = decide::Answer::from_flags(status, body, body_file, &headers)?;
            let decision = decide::Decision::from_flags(decision, Duration::from_secs(timeout))?;
            decide::settle(store, &id, answer, retention, decision, io).await
        }
        DoubtCommand::Release { record, decision } => {
            let id = record_id(&record.consumer, &record.route, &record.key)?;
            let decision = decide::Decision::from_flags(decision, Duration::from_secs(timeout))?;
            decide::release(store, &id, decision, io).await
        }
    }
}

/// `doubt list`: the live records in doubt (only those due with `due`), oldest first.
async fn list(
    store: &dyn Operator,
    due: bool,
    page: &PageArgs,
    io: &mut Io<'_>,
) -> Result<(), Failure> {
    let query = if due {
        ListQuery::due_for_reconciliation()
    } else {
        ListQuery::in_doubt()
    };
    let (mut records, next) = fetch(store, query, page).await?;
    if store.listing_order() == ListingOrder::Scan {
        // A scanning store (Redis) lists in its scan's order: what was fetched, oldest first.
        records.sort_by(|a, b| {
            let at = |r: &idem_ops::Listed| r.reserved_at.map_or(0, Timestamp::as_millis);
            (at(a), a.id.consumer(), a.id.route(), a.id.key()).cmp(&(
                at(b),
                b.id.consumer(),
                b.id.route(),
                b.id.key(),
            ))
        });
    }
    if io.json {
        let records: Vec<Value> = records.iter().map(crate::render::listed_json).collect();
        return io.json(&json!({ "records": records, "next": next.map(|c| c.to_string()) }));
    }
    let now = now();
    let mut table = Table::new(render::LIST_COLUMNS);
    for record in &records {
        table.row(render::listed_row(record, now));
    }
    if records.is_empty() {
        let none = if due {
            "no record in doubt is due for a check"
        } else {
            "no records in doubt"
        };
        writeln!(io.err, "{none}")?;
    } else {
        write!(io.out, "{}", table.render())?;
        writeln!(
            io.err,
            "show one with `idem doubt show CONSUMER ROUTE KEY`; decide it with `idem doubt settle` or `idem doubt release`"
        )?;
    }
    if let Some(next) = next {
        writeln!(io.err, "more: --after {next}")?;
    }
    Ok(())
}

/// What the record of an id is, when it is not in doubt: for the messages that say so.
pub(super) fn not_in_doubt(inspected: Option<&Inspected>, now: Timestamp) -> String {
    let Some(inspected) = inspected else {
        return "no record (released, purged, expired on its own, or never made)".to_owned();
    };
    let live = inspected.record.is_live(now);
    match (&inspected.record.state, live) {
        (RecordState::InProgress { .. }, true) => "the record is in progress".to_owned(),
        (RecordState::InProgress { .. }, false) => {
            "the record is in progress, orphaned (lease passed)".to_owned()
        }
        (RecordState::Completed { response, .. }, true) => format!(
            "the record is completed with {} and not in doubt (settled, or never in doubt)",
            response.status
        ),
        (RecordState::Completed { response, .. }, false) => format!(
            "the record is completed with {}, expired (behaves as absent)",
            response.status
        ),
    }
}

/// The state's name in JSON, when the record is not in doubt.
fn state_name(inspected: Option<&Inspected>) -> &'static str {
    match inspected.map(|i| &i.record.state) {
        None => "absent",
        Some(RecordState::InProgress { .. }) => "in_progress",
        Some(RecordState::Completed { .. }) => "completed",
    }
}

/// `doubt show`: the record in doubt and its audit trail; a record not in doubt, its trail.
async fn show(store: &dyn Operator, id: &RecordId, io: &mut Io<'_>) -> Result<(), Failure> {
    let inspected = store.inspect(id, deadline()).await?;
    let trail = store.reconciliations(id, deadline()).await?;
    let now = now();
    let case = inspected
        .clone()
        .and_then(|inspected| InDoubt::from_inspected(id.clone(), inspected));
    if io.json {
        let trail: Vec<Value> = trail.iter().map(render::entry_json).collect();
        let state = if case.is_some() {
            "in_doubt"
        } else {
            state_name(inspected.as_ref())
        };
        io.json(&json!({
            "consumer": id.consumer(),
            "route": id.route(),
            "key": id.key(),
            "in_doubt": case.is_some(),
            "state": state,
            "record": case.as_ref().map(|case| render::in_doubt_json(case, now)),
            "trail": trail,
        }))?;
    } else if inspected.is_none() && trail.is_empty() {
        writeln!(
            io.err,
            "no record and no audit trail for this consumer, route and key"
        )?;
    } else {
        match &case {
            Some(case) => write!(io.out, "{}", render::in_doubt_text(case, now))?,
            None => writeln!(
                io.err,
                "not in doubt: {}",
                not_in_doubt(inspected.as_ref(), now)
            )?,
        }
        if trail.is_empty() {
            writeln!(
                io.err,
                "no audit trail: nobody decided about this record yet"
            )?;
        } else {
            if case.is_some() {
                writeln!(io.out)?;
            }
            writeln!(
                io.out,
                "audit trail of {}  {}  {} ({} {}, oldest first):",
                printable(id.consumer()),
                printable(id.route()),
                printable(id.key()),
                trail.len(),
                if trail.len() == 1 { "entry" } else { "entries" }
            )?;
            write!(io.out, "{}", render::trail_table(&trail))?;
        }
    }
    if inspected.is_none() && trail.is_empty() {
        return Err(Failure::NotFound);
    }
    Ok(())
}
