//! The engine's event names are one list (C16): `EventKind::ALL` and the table of events in
//! docs/operations.md name the same events, in the same order, and the metrics' outcomes are
//! the rows that table marks `outcome`.

use idem_core::EventKind;

/// The operations guide, read from the repository.
fn operations_md() -> String {
    let path = concat!(env!("CARGO_MANIFEST_DIR"), "/../docs/operations.md");
    std::fs::read_to_string(path)
        .unwrap_or_else(|error| panic!("docs/operations.md cannot be read ({error})"))
}

/// The rows of the table of events: its header is `| event | what happened | in the metrics |`.
/// Each row as its cells, trimmed.
fn event_rows(doc: &str) -> Vec<Vec<String>> {
    let mut lines = doc
        .lines()
        .skip_while(|line| line.trim() != "| event | what happened | in the metrics |");
    assert!(
        lines.next().is_some(),
        "docs/operations.md has no table of events"
    );
    let separator = lines.next().unwrap_or_default();
    assert!(separator.starts_with("|---"), "a table: {separator}");
    lines
        .take_while(|line| line.starts_with('|'))
        .map(|line| {
            line.trim()
                .trim_start_matches('|')
                .trim_end_matches('|')
                .split('|')
                .map(|cell| cell.trim().to_owned())
                .collect()
        })
        .collect()
}

/// The event a row names: its first cell, one name in backquotes.
fn name(row: &[String]) -> &str {
    let cell = row.first().map(String::as_str).unwrap_or_default();
    cell.strip_prefix('`')
        .and_then(|rest| rest.strip_suffix('`'))
        .unwrap_or_else(|| panic!("not one name in backquotes: {cell}"))
}

#[test]
fn c16_the_table_of_events_names_every_event_kind_and_no_other() {
    let doc = operations_md();
    let rows = event_rows(&doc);
    let documented: Vec<&str> = rows.iter().map(|row| name(row)).collect();
    for name in &documented {
        assert!(
            EventKind::from_name(name).is_some(),
            "docs/operations.md lists `{name}`, which is no event"
        );
    }
    for kind in EventKind::ALL {
        assert_eq!(
            documented
                .iter()
                .filter(|name| **name == kind.name())
                .count(),
            1,
            "docs/operations.md lists `{}` once in its table of events",
            kind.name()
        );
    }
    let names: Vec<&str> = EventKind::ALL.iter().map(|kind| kind.name()).collect();
    assert_eq!(documented, names, "in the order of EventKind::ALL");
    for row in &rows {
        assert_eq!(row.len(), 3, "three cells: {row:?}");
        assert!(
            row.iter().all(|cell| !cell.is_empty()),
            "each event says what it means: {row:?}"
        );
    }
}

#[test]
fn c16_the_table_of_events_marks_exactly_the_metric_outcomes() {
    use idem_metrics::OUTCOMES;
    let doc = operations_md();
    let rows = event_rows(&doc);
    let marked: Vec<&str> = rows
        .iter()
        .filter(|row| row.get(2).is_some_and(|cell| cell.starts_with("`outcome`")))
        .map(|row| name(row))
        .collect();
    let outcomes: Vec<&str> = OUTCOMES.iter().map(|kind| kind.name()).collect();
    assert_eq!(marked, outcomes);
}
