//! How records look: aligned tables for people, JSON for scripts. Everything a client or a
//! handler could have chosen (consumer, route, key, header values, bodies) is escaped before it
//! reaches a terminal, so a stored value cannot move the cursor or rewrite the screen.

use crate::alive::liveness_here;
use idem_core::store::Doubt;
use idem_core::store::{Record, RecordState};
use idem_core::Timestamp;
use idem_ops::Holder;
use idem_ops::{Inspected, Listed, ListedState, Stats};
use idem_ops::{Noted, Provenance};
use serde_json::{json, Value};
use std::fmt::Write as _;
use std::time::{Duration, UNIX_EPOCH};

/// An instant as RFC 3339 in UTC, to the millisecond.
pub(crate) fn time(at: Timestamp) -> String {
    let system = UNIX_EPOCH + Duration::from_millis(at.as_millis());
    humantime::format_rfc3339_millis(system).to_string()
}

/// How far `at` is from `now`: `in 4m 59s` or `3m 2s ago`, to the second.
pub(crate) fn relative(at: Timestamp, now: Timestamp) -> String {
    let seconds = |d: Duration| humantime::format_duration(Duration::from_secs(d.as_secs()));
    if at > now {
        format!("in {}", seconds(at.saturating_since(now)))
    } else {
        format!("{} ago", seconds(now.saturating_since(at)))
    }
}

/// This machine's clock, for the ages shown beside the store's instants.
pub(crate) fn now() -> Timestamp {
    idem_core::Clock::now(&idem_core::SystemClock)
}

/// Whether a terminal could act on `c` instead of showing it: control characters (C0, DEL,
/// C1) and the invisible or bidirectional formatting ones.
fn hostile(c: char) -> bool {
    c.is_control()
        || matches!(c, '\u{200b}'..='\u{200f}' | '\u{2028}'..='\u{202e}' | '\u{2066}'..='\u{2069}')
}

/// A JSON document on one line, with every character a terminal could act on written as a
/// `\uXXXX` escape (JSON escapes C0 controls itself; the others can only occur inside strings,
/// where the escape means the same character).
pub(crate) fn json_text(value: &Value) -> String {
    let mut out = String::new();
    for c in value.to_string().chars() {
        if hostile(c) && !c.is_ascii() {
            let mut units = [0u16; 2];
            for unit in c.encode_utf16(&mut units) {
                let _ = write!(out, "\\u{unit:04x}");
            }
        } else {
            out.push(c);
        }
    }
    out
}

/// `text` with control and bidirectional-formatting characters escaped (`\u{1b}`), the rest
/// as it is.
pub(crate) fn printable(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    for c in text.chars() {
        if hostile(c) {
            let _ = write!(out, "\\u{{{:x}}}", u32::from(c));
        } else {
            out.push(c);
        }
    }
    out
}

/// Bytes shown as escaped text when they are UTF-8, else as hex.
pub(crate) fn printable_bytes(bytes: &[u8]) -> String {
    match std::str::from_utf8(bytes) {
        Ok(text) => printable(text),
        Err(_) => format!("(not UTF-8) hex {}", hex(bytes)),
    }
}

/// Lowercase hex.
pub(crate) fn hex(bytes: &[u8]) -> String {
    bytes
        .iter()
        .fold(String::with_capacity(bytes.len() * 2), |mut out, b| {
            let _ = write!(out, "{b:02x}");
            out
        })
}

/// Bytes as a JSON string when they are UTF-8, else as `{"hex": …}`.
pub(crate) fn bytes_json(bytes: &[u8]) -> Value {
    match std::str::from_utf8(bytes) {
        Ok(text) => json!(text),
        Err(_) => json!({ "hex": hex(bytes) }),
    }
}

/// Rows under headers, each column as wide as its widest cell.
#[derive(Debug)]
pub(crate) struct Table {
    headers: Vec<&'static str>,
    rows: Vec<Vec<String>>,
}

impl Table {
    /// An empty table with these columns.
    pub(crate) fn new(headers: &[&'static str]) -> Self {
        Self {
            headers: headers.to_vec(),
            rows: Vec::new(),
        }
    }

    /// Adds a row (cells already printable).
    pub(crate) fn row(&mut self, cells: Vec<String>) {
        self.rows.push(cells);
    }

    /// The table as text, one line per row, cells separated by two spaces.
    pub(crate) fn render(&self) -> String {
        let width = |i: usize| {
            self.rows
                .iter()
                .filter_map(|row| row.get(i))
                .map(|cell| cell.chars().count())
                .chain([self.headers[i].len()])
                .max()
                .unwrap_or(0)
        };
        let widths: Vec<usize> = (0..self.headers.len()).map(width).collect();
        let line = |cells: Vec<&str>| {
            let mut line = String::new();
            for (i, cell) in cells.iter().enumerate() {
                if i + 1 == cells.len() {
                    line.push_str(cell);
                } else {
                    let pad = widths[i].saturating_sub(cell.chars().count()) + 2;
                    line.push_str(cell);
                    line.extend(std::iter::repeat_n(' ', pad));
                }
            }
            line.trim_end().to_owned() + "\n"
        };
        let mut out = line(self.headers.clone());
        for row in &self.rows {
            out.push_str(&line(row.iter().map(String::as_str).collect()));
        }
        out
    }
}

/// The columns of a pending (in-progress) listing.
pub(crate) const PENDING_COLUMNS: &[&str] = &[
    "RESERVED", "AGE", "LEASE", "HOLDER", "ALIVE", "CONSUMER", "ROUTE", "KEY",
];
/// The columns of the records of one key.
pub(crate) const KEY_COLUMNS: &[&str] = &[
    "CONSUMER",
    "ROUTE",
    "STATE",
    "RESERVED",
    "COMPLETED",
    "HOLDER",
    "ALIVE",
];

/// A holder as a table cell: `pid 4242 on web-1`, `unknown` for a record written before
/// the store kept it, `unreadable (…)` for one this version does not read.
pub(crate) fn holder_cell(holder: &Noted<Holder>) -> String {
    match holder {
        Noted::Known(h) => printable(&format!("pid {} on {}", h.pid(), h.host())),
        other => printable(&other.to_string()),
    }
}

/// Whether an in-progress record's holder still runs, as a cell: `-` for a completed record
/// (nobody holds it) and `unknown` without a holder.
fn alive_cell(holder: &Noted<Holder>, in_progress: bool) -> String {
    match (holder.known(), in_progress) {
        (_, false) => "-".to_owned(),
        (None, true) => "unknown".to_owned(),
        (Some(h), true) => liveness_here(h).as_str().to_owned(),
    }
}

/// A holder as JSON: host, pid, start id, start time, and whether it runs where this machine
/// can tell (`alive`, in progress only).
fn holder_json(holder: &Noted<Holder>, in_progress: bool) -> Value {
    match holder {
        Noted::Unknown => Value::Null,
        Noted::Unreadable(why) => json!({ "unreadable": why }),
        Noted::Known(h) => json!({
            "host": h.host(),
            "pid": h.pid(),
            "start_id": format!("{:016x}", h.start_id()),
            "started": h.started(),
            "boot_id": h.boot_id(),
            "pid_namespace": h.pid_namespace(),
            "alive": in_progress.then(|| liveness_here(h).as_str()),
        }),
    }
}

/// The records of one key as a table row.
pub(crate) fn key_row(record: &Listed, now: Timestamp) -> Vec<String> {
    let in_progress = matches!(record.state, ListedState::InProgress { .. });
    let state = match record.state {
        ListedState::InProgress { lease_until } if lease_until > now => "in progress".to_owned(),
        ListedState::InProgress { .. } => "orphaned".to_owned(),
        ListedState::Completed { status, expires_at } if expires_at > now => {
            format!("completed {status}{}", in_doubt_suffix(record))
        }
        ListedState::Completed { status, .. } => format!("expired {status}"),
    };
    vec![
        printable(record.id.consumer()),
        printable(record.id.route()),
        state,
        record.reserved_at.map_or("unknown".to_owned(), time),
        record
            .completed_at
            .map_or(if in_progress { "-" } else { "unknown" }.to_owned(), time),
        holder_cell(&record.holder),
        alive_cell(&record.holder, in_progress),
    ]
}

/// ` in doubt` for a listed record whose answer is in doubt, else nothing.
fn in_doubt_suffix(record: &Listed) -> &'static str {
    if record.doubt.is_some() {
        " in doubt"
    } else {
        ""
    }
}

/// The columns of a completed listing.
pub(crate) const COMPLETED_COLUMNS: &[&str] = &["ROUTE", "KEY", "STATUS", "RESERVED", "EXPIRES"];

/// A listed record as a table row of its selection's columns.
pub(crate) fn listed_row(record: &Listed, now: Timestamp) -> Vec<String> {
    let reserved = record.reserved_at.map_or("unknown".to_owned(), time);
    match record.state {
        ListedState::InProgress { lease_until } => vec![
            reserved,
            record.reserved_at.map_or("unknown".to_owned(), |at| {
                relative(at, now).replace(" ago", "")
            }),
            if lease_until > now {
                format!("holds, ends {}", relative(lease_until, now))
            } else {
                format!("orphaned {}", relative(lease_until, now))
            },
            holder_cell(&record.holder),
            alive_cell(&record.holder, true),
            printable(record.id.consumer()),
            printable(record.id.route()),
            printable(record.id.key()),
        ],
        ListedState::Completed { status, expires_at } => vec![
            printable(record.id.route()),
            printable(record.id.key()),
            format!("{status}{}", in_doubt_suffix(record)),
            reserved,
            format!("{} ({})", time(expires_at), relative(expires_at, now)),
        ],
    }
}

/// A listed record as JSON.
pub(crate) fn listed_json(record: &Listed) -> Value {
    let mut value = json!({
        "consumer": record.id.consumer(),
        "route": record.id.route(),
        "key": record.id.key(),
        "reserved_at": record.reserved_at.map(time),
        "reserved_at_ms": record.reserved_at.map(Timestamp::as_millis),
        "completed_at": record.completed_at.map(time),
        "completed_at_ms": record.completed_at.map(Timestamp::as_millis),
        "holder": holder_json(
            &record.holder,
            matches!(record.state, ListedState::InProgress { .. }),
        ),
    });
    let fields = match record.state {
        ListedState::InProgress { lease_until } => json!({
            "state": "in_progress",
            "lease_until": time(lease_until),
            "lease_until_ms": lease_until.as_millis(),
        }),
        ListedState::Completed { status, expires_at } => json!({
            "state": "completed",
            "status": status,
            "expires_at": time(expires_at),
            "expires_at_ms": expires_at.as_millis(),
        }),
    };
    merge(&mut value, fields);
    if let Some(doubt) = &record.doubt {
        merge(
            &mut value,
            json!({
                "doubt": noted_doubt_json(doubt),
                "check_at": record.check_at.map(time),
                "check_at_ms": record.check_at.map(Timestamp::as_millis),
            }),
        );
    }
    value
}

/// A mark of doubt as JSON: cause, note, attempts.
pub(crate) fn doubt_json(doubt: &Doubt) -> Value {
    json!({
        "cause": doubt.cause.name(),
        "note": doubt.note,
        "attempts": doubt.attempts,
    })
}

/// A listed mark of doubt as JSON: the mark, or `{"unreadable": …}`, or null.
fn noted_doubt_json(doubt: &Noted<Doubt>) -> Value {
    match doubt {
        Noted::Known(doubt) => doubt_json(doubt),
        Noted::Unreadable(why) => json!({ "unreadable": why }),
        Noted::Unknown => Value::Null,
    }
}

/// One record as `inspect` shows it: a two-column table, the body only when asked.
pub(crate) fn record_text(inspected: &Inspected, now: Timestamp, with_body: bool) -> String {
    let (record, provenance) = (&inspected.record, &inspected.provenance);
    let mut table = Table::new(&["FIELD", "VALUE"]);
    let mut field = |name: &str, value: String| table.row(vec![name.to_owned(), value]);
    let deadline = record.deadline();
    let live = record.is_live(now);
    match &record.state {
        RecordState::InProgress { lease_until } => {
            field(
                "state",
                if live {
                    "in progress"
                } else {
                    "in progress, orphaned (lease passed)"
                }
                .into(),
            );
            field(
                "lease until",
                format!("{} ({})", time(*lease_until), relative(deadline, now)),
            );
        }
        RecordState::Completed {
            response,
            expires_at,
        } => {
            field(
                "state",
                if live {
                    "completed"
                } else {
                    "completed, expired (behaves as absent)"
                }
                .into(),
            );
            field(
                "expires at",
                format!("{} ({})", time(*expires_at), relative(deadline, now)),
            );
            field("status", response.status.to_string());
            for (name, value) in &response.headers {
                field(
                    "header",
                    format!("{}: {}", printable(name), printable_bytes(value)),
                );
            }
            field(
                "body",
                if with_body {
                    printable_bytes(&response.body)
                } else {
                    format!("{} bytes (--body prints it)", response.body.len())
                },
            );
            if let Some(doubt) = &inspected.doubt {
                field(
                    "in doubt",
                    format!(
                        "{} (`idem doubt show` for its note and audit trail)",
                        doubt.cause
                    ),
                );
            }
        }
    }
    let at = |t: Option<Timestamp>, none: &str| {
        t.map_or(none.to_owned(), |t| {
            format!("{} ({})", time(t), relative(t, now))
        })
    };
    field(
        "reserved at",
        at(
            provenance.reserved_at,
            "unknown (written before the store kept it)",
        ),
    );
    field(
        "completed at",
        at(
            provenance.completed_at,
            if record.is_in_progress() {
                "-"
            } else {
                "unknown (written before the store kept it)"
            },
        ),
    );
    field(
        "holder",
        match &provenance.holder {
            Noted::Unknown => "unknown (written before the store kept it)".to_owned(),
            other => printable(&other.to_string()),
        },
    );
    if record.is_in_progress() {
        field("holder alive", alive_cell(&provenance.holder, true));
    }
    field("token", hex(record.token.as_bytes()));
    field("fingerprint", hex(record.fingerprint.as_bytes()));
    table.render()
}

/// The provenance as JSON fields.
fn provenance_json(provenance: &Provenance, in_progress: bool) -> Value {
    json!({
        "reserved_at": provenance.reserved_at.map(time),
        "reserved_at_ms": provenance.reserved_at.map(Timestamp::as_millis),
        "completed_at": provenance.completed_at.map(time),
        "completed_at_ms": provenance.completed_at.map(Timestamp::as_millis),
        "holder": holder_json(&provenance.holder, in_progress),
    })
}

/// One record as JSON, with its provenance; `body` only when asked.
pub(crate) fn inspected_json(inspected: &Inspected, now: Timestamp, with_body: bool) -> Value {
    let mut value = record_json(&inspected.record, now, with_body);
    merge(
        &mut value,
        provenance_json(&inspected.provenance, inspected.record.is_in_progress()),
    );
    merge(
        &mut value,
        json!({
            "doubt": inspected.doubt.as_ref().map(doubt_json),
            "check_at": inspected.check_at.map(time),
            "check_at_ms": inspected.check_at.map(Timestamp::as_millis),
        }),
    );
    value
}

/// One record as JSON; `body` only when asked.
fn record_json(record: &Record, now: Timestamp, with_body: bool) -> Value {
    let mut value = json!({
        "live": record.is_live(now),
        "token": hex(record.token.as_bytes()),
        "fingerprint": hex(record.fingerprint.as_bytes()),
    });
    let fields = match &record.state {
        RecordState::InProgress { lease_until } => json!({
            "state": "in_progress",
            "lease_until": time(*lease_until),
            "lease_until_ms": lease_until.as_millis(),
        }),
        RecordState::Completed {
            response,
            expires_at,
        } => {
            let headers: Vec<Value> = response
                .headers
                .iter()
                .map(|(name, value)| json!({ "name": name, "value": bytes_json(value) }))
                .collect();
            let mut completed = json!({
                "state": "completed",
                "expires_at": time(*expires_at),
                "expires_at_ms": expires_at.as_millis(),
                "status": response.status,
                "headers": headers,
                "body_bytes": response.body.len(),
            });
            if with_body {
                merge(
                    &mut completed,
                    json!({ "body": bytes_json(&response.body) }),
                );
            }
            completed
        }
    };
    merge(&mut value, fields);
    value
}

/// The counts as a table.
pub(crate) fn stats_text(stats: &Stats) -> String {
    let mut table = Table::new(&["RECORDS", "COUNT"]);
    for (name, count) in [
        ("in progress", stats.in_progress),
        ("orphaned (lease passed)", stats.orphaned),
        ("completed", stats.completed),
        ("in doubt (counted in completed)", stats.in_doubt),
        ("expired (awaiting purge)", stats.expired),
        ("total", stats.total()),
    ] {
        table.row(vec![name.to_owned(), count.to_string()]);
    }
    let mut out = table.render();
    if let Some(oldest) = stats.oldest_in_progress {
        let _ = writeln!(
            out,
            "oldest in progress reserved {} ({})",
            time(oldest),
            relative(oldest, stats.now)
        );
    }
    if stats.in_doubt > 0 {
        let _ = writeln!(
            out,
            "{} in doubt: `idem doubt list` lists them",
            stats.in_doubt
        );
    }
    let _ = writeln!(out, "counted at {} by the store's clock", time(stats.now));
    out
}

/// The counts as JSON.
pub(crate) fn stats_json(stats: &Stats) -> Value {
    json!({
        "now": time(stats.now),
        "now_ms": stats.now.as_millis(),
        "in_progress": stats.in_progress,
        "orphaned": stats.orphaned,
        "completed": stats.completed,
        "in_doubt": stats.in_doubt,
        "expired": stats.expired,
        "total": stats.total(),
        "oldest_in_progress": stats.oldest_in_progress.map(time),
        "oldest_in_progress_ms": stats.oldest_in_progress.map(Timestamp::as_millis),
    })
}

fn merge(into: &mut Value, from: Value) {
    if let (Value::Object(into), Value::Object(from)) = (into, from) {
        into.extend(from);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hostile_text_cannot_reach_the_terminal_raw() {
        assert_eq!(printable("ok é 💳"), "ok é 💳");
        assert_eq!(printable("\u{1b}[2Jx"), "\\u{1b}[2Jx");
        assert_eq!(printable("a\u{202e}b\nc"), "a\\u{202e}b\\u{a}c");
        // Line and paragraph separators break a line on some terminals and viewers.
        assert_eq!(printable("a\u{2028}b\u{2029}"), "a\\u{2028}b\\u{2029}");
        assert_eq!(printable_bytes(&[0xff, 0x00]), "(not UTF-8) hex ff00");
    }

    #[test]
    fn json_for_scripts_escapes_what_a_terminal_would_act_on() {
        let value = json!({ "v": "a\u{9b}2J\u{202e}b\u{1b}é" });
        let text = json_text(&value);
        assert_eq!(text, r#"{"v":"a\u009b2J\u202eb\u001bé"}"#);
        let back: Value = serde_json::from_str(&text).expect("still JSON");
        assert_eq!(back, value);
    }

    #[test]
    fn times_are_utc_and_ages_are_to_the_second() {
        let at = Timestamp::from_millis(1_700_000_000_123);
        assert_eq!(time(at), "2023-11-14T22:13:20.123Z");
        let later = Timestamp::from_millis(1_700_000_302_999);
        assert_eq!(relative(at, later), "5m 2s ago");
        assert_eq!(relative(later, at), "in 5m 2s");
    }

    #[test]
    fn columns_align() {
        let mut table = Table::new(&["A", "LONGER"]);
        table.row(vec!["wide cell".into(), "x".into()]);
        assert_eq!(table.render(), "A          LONGER\nwide cell  x\n");
    }
}
