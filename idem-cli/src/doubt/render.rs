//! How records in doubt and their audit trail look: tables for people, JSON for scripts. Every
//! stored text (notes, names, answers) is escaped before it reaches a terminal.

use crate::render::{
    bytes_json, doubt_json, hex, printable, printable_bytes, relative, time, Table,
};
use idem_core::store::{Decided, Doubt, Reconciliation};
use idem_core::Timestamp;
use idem_ops::reconcile::InDoubt;
use idem_ops::Noted;
use idem_ops::{Listed, ListedState};
use serde_json::{json, Value};
use std::time::Duration;

/// The columns of `doubt list`.
pub(super) const LIST_COLUMNS: &[&str] = &[
    "RESERVED",
    "AGE",
    "CONSUMER",
    "ROUTE",
    "KEY",
    "STATUS",
    "CAUSE",
    "ATTEMPTS",
    "COMPLETED",
    "NEXT CHECK",
    "EXPIRES",
];

/// A duration to the second, as people write it.
fn seconds(d: Duration) -> String {
    humantime::format_duration(Duration::from_secs(d.as_secs())).to_string()
}

/// When a record is next due for a check: `due now`, `due since 3m 2s`, `in 30s`.
fn next_check(check_at: Option<Timestamp>, now: Timestamp) -> String {
    match check_at {
        None => "-".to_owned(),
        Some(at) if at > now => relative(at, now),
        Some(at) if now.saturating_since(at) < Duration::from_secs(1) => "due now".to_owned(),
        Some(at) => format!("due since {}", seconds(now.saturating_since(at))),
    }
}

/// A listed record in doubt as a row of [`LIST_COLUMNS`].
pub(super) fn listed_row(record: &Listed, now: Timestamp) -> Vec<String> {
    let (status, expires) = match record.state {
        ListedState::Completed { status, expires_at } => (
            status.to_string(),
            format!("{} ({})", time(expires_at), relative(expires_at, now)),
        ),
        // A store lists completed records only; shown as it is if one is not.
        ListedState::InProgress { lease_until } => (
            "in progress".to_owned(),
            format!("lease {}", relative(lease_until, now)),
        ),
    };
    let (cause, attempts) = match &record.doubt {
        Some(Noted::Known(doubt)) => (doubt.cause.name().to_owned(), doubt.attempts.to_string()),
        Some(Noted::Unreadable(why)) => (printable(&format!("unreadable ({why})")), "-".to_owned()),
        Some(Noted::Unknown) => ("unknown".to_owned(), "-".to_owned()),
        None => ("-".to_owned(), "-".to_owned()),
    };
    vec![
        record.reserved_at.map_or("unknown".to_owned(), time),
        record.reserved_at.map_or("unknown".to_owned(), |at| {
            relative(at, now).replace(" ago", "")
        }),
        printable(record.id.consumer()),
        printable(record.id.route()),
        printable(record.id.key()),
        status,
        cause,
        attempts,
        record.completed_at.map_or("unknown".to_owned(), time),
        next_check(record.check_at, now),
        expires,
    ]
}

/// How many checks found a record still unknown, in words.
fn attempts_text(doubt: &Doubt) -> String {
    match doubt.attempts {
        0 => "0 (not checked yet)".to_owned(),
        1 => "1 check found it still unknown".to_owned(),
        n => format!("{n} checks found it still unknown"),
    }
}

/// One record in doubt as `doubt show` prints it: a two-column table. The body's size only:
/// a stored body is printed only by `inspect --body`.
pub(super) fn in_doubt_text(case: &InDoubt, now: Timestamp) -> String {
    let mut table = Table::new(&["FIELD", "VALUE"]);
    let mut field = |name: &str, value: String| table.row(vec![name.to_owned(), value]);
    let at = |t: Option<Timestamp>| {
        t.map_or(
            "unknown (written before the store kept it)".to_owned(),
            |t| format!("{} ({})", time(t), relative(t, now)),
        )
    };
    field(
        "state",
        if case.expires_at > now {
            "in doubt: this answer is replayed to every retry until the record is settled or released"
        } else {
            "in doubt, expired (behaves as absent: the key is new again)"
        }
        .to_owned(),
    );
    field("cause", case.doubt.cause.name().to_owned());
    field(
        "note",
        if case.doubt.note.is_empty() {
            "(none)".to_owned()
        } else {
            printable(&case.doubt.note)
        },
    );
    field("attempts", attempts_text(&case.doubt));
    field("next check", next_check(case.check_at, now));
    field("downstream key", printable(&case.downstream_key()));
    field("status", case.answer.status.to_string());
    for (name, value) in &case.answer.headers {
        field(
            "header",
            format!("{}: {}", printable(name), printable_bytes(value)),
        );
    }
    field(
        "body",
        format!(
            "{} bytes (`idem inspect --body` prints it)",
            case.answer.body.len()
        ),
    );
    field("reserved at", at(case.reserved_at));
    field("completed at", at(case.completed_at));
    field(
        "expires at",
        format!(
            "{} ({})",
            time(case.expires_at),
            relative(case.expires_at, now)
        ),
    );
    field("token", hex(case.token.as_bytes()));
    field("fingerprint", hex(case.fingerprint.as_bytes()));
    table.render()
}

/// One record in doubt as JSON (the body's size, not the body).
pub(super) fn in_doubt_json(case: &InDoubt, now: Timestamp) -> Value {
    let headers: Vec<Value> = case
        .answer
        .headers
        .iter()
        .map(|(name, value)| json!({ "name": name, "value": bytes_json(value) }))
        .collect();
    json!({
        "live": case.expires_at > now,
        "status": case.answer.status,
        "headers": headers,
        "body_bytes": case.answer.body.len(),
        "doubt": doubt_json(&case.doubt),
        "downstream_key": case.downstream_key(),
        "check_at": case.check_at.map(time),
        "check_at_ms": case.check_at.map(Timestamp::as_millis),
        "reserved_at": case.reserved_at.map(time),
        "reserved_at_ms": case.reserved_at.map(Timestamp::as_millis),
        "completed_at": case.completed_at.map(time),
        "completed_at_ms": case.completed_at.map(Timestamp::as_millis),
        "expires_at": time(case.expires_at),
        "expires_at_ms": case.expires_at.as_millis(),
        "token": hex(case.token.as_bytes()),
        "fingerprint": hex(case.fingerprint.as_bytes()),
    })
}

/// A decision of the audit trail in words: `settled 201`, `released`,
/// `still unknown (attempt 2, retry after 1m)`.
pub(super) fn decided_text(decided: &Decided) -> String {
    match decided {
        Decided::Settled { status } => format!("settled {status}"),
        Decided::Released => "released".to_owned(),
        Decided::StillUnknown {
            attempt,
            retry_after,
        } => format!(
            "still unknown (attempt {attempt}, retry after {})",
            seconds(*retry_after)
        ),
        other => other.name().to_owned(),
    }
}

/// The audit trail as a table, oldest first; EXECUTION is the start of the token of the
/// execution decided about (a key released and executed again has another).
pub(super) fn trail_table(trail: &[Reconciliation]) -> String {
    let mut table = Table::new(&["AT", "EXECUTION", "BY", "DECISION", "ASKED", "ANSWER"]);
    for entry in trail {
        let token = hex(entry.token.as_bytes());
        table.row(vec![
            time(entry.at),
            token.get(..8).unwrap_or(&token).to_owned(),
            printable(&entry.by),
            decided_text(&entry.decided),
            printable(&entry.asked),
            printable(&entry.answer),
        ]);
    }
    table.render()
}

/// One audit entry as JSON.
pub(super) fn entry_json(entry: &Reconciliation) -> Value {
    let mut value = json!({
        "at": time(entry.at),
        "at_ms": entry.at.as_millis(),
        "token": hex(entry.token.as_bytes()),
        "by": entry.by,
        "decision": entry.decided.name(),
        "asked": entry.asked,
        "answer": entry.answer,
    });
    let detail = match entry.decided {
        Decided::Settled { status } => json!({ "status": status }),
        Decided::StillUnknown {
            attempt,
            retry_after,
        } => json!({
            "attempt": attempt,
            "retry_after_ms": u64::try_from(retry_after.as_millis()).unwrap_or(u64::MAX),
        }),
        _ => json!({}),
    };
    if let (Value::Object(into), Value::Object(from)) = (&mut value, detail) {
        into.extend(from);
    }
    value
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn decisions_read_as_words() {
        assert_eq!(
            decided_text(&Decided::Settled { status: 201 }),
            "settled 201"
        );
        assert_eq!(decided_text(&Decided::Released), "released");
        assert_eq!(
            decided_text(&Decided::StillUnknown {
                attempt: 2,
                retry_after: Duration::from_secs(60)
            }),
            "still unknown (attempt 2, retry after 1m)"
        );
    }

    #[test]
    fn next_checks_say_when() {
        let now = Timestamp::from_millis(1_700_000_100_000);
        assert_eq!(next_check(None, now), "-");
        assert_eq!(next_check(Some(now), now), "due now");
        assert_eq!(
            next_check(Some(Timestamp::from_millis(1_700_000_000_000)), now),
            "due since 1m 40s"
        );
        assert_eq!(
            next_check(Some(Timestamp::from_millis(1_700_000_130_000)), now),
            "in 30s"
        );
    }
}
