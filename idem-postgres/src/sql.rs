//! The store's SQL, read from the `.sql` files beside this crate, for one schema and table.

use crate::deadlines::Deadlines;
use std::sync::Arc;

/// The table name the `.sql` files are written with.
const DEFAULT_TABLE: &str = "idem_records";
/// The index (and constraint) names the migrations are written with: `idem_records_<suffix>`,
/// which become `<table>_<suffix>` (the audit trail's indexes too: `trail_…`, short, so that a
/// table name that leaves room for the trail's own leaves room for them; `state_check`, the
/// name PostgreSQL gave version 1's CHECK, dropped by version 6).
const INDEX_SUFFIXES: &[&str] = &[
    "deadline",
    "in_progress",
    "reserved",
    "key",
    "in_doubt",
    "trail_record",
    "trail_kept",
    "state_check",
];
/// The tables beside the records the migrations are written with: `idem_records_<suffix>`,
/// which become `"schema"."<table>_<suffix>"`: the audit trail of records in doubt.
const TABLE_SUFFIXES: &[&str] = &["reconciliations"];
/// The migrations table the `.sql` files are written with.
const MIGRATIONS: &str = "idem_schema_migrations";
/// The schema qualifier the `.sql` files are written with, where a name needs one (`DROP INDEX`).
const SCHEMA: &str = "idem_schema.";

/// The lock deadline the `.sql` files of fenced writes are written with (the default); the
/// store writes its own in its place.
const LOCK_TIMEOUT_MARK: &str = "set_config('lock_timeout', '3s', true)";

/// `sql` with `lock_ms` milliseconds as the lock deadline it sets.
fn with_lock_timeout(sql: &str, lock_ms: i64) -> String {
    sql.replace(
        LOCK_TIMEOUT_MARK,
        &format!("set_config('lock_timeout', '{lock_ms}', true)"),
    )
}

/// The idle deadline the completion's `.sql` file is written with (the default); the store
/// writes its own in its place.
const IDLE_TIMEOUT_MARK: &str = "set_config('idle_in_transaction_session_timeout', '30s', true)";

/// `sql` with `idle_ms` milliseconds as the idle-in-transaction deadline it sets.
fn with_idle_timeout(sql: &str, idle_ms: i64) -> String {
    sql.replace(
        IDLE_TIMEOUT_MARK,
        &format!("set_config('idle_in_transaction_session_timeout', '{idle_ms}', true)"),
    )
}

/// The versioned migrations, in order: (version, SQL for the default names).
pub(crate) const MIGRATION_FILES: &[(i64, &str)] = &[
    (1, include_str!("../sql/migrations/0001_create_records.sql")),
    (
        2,
        include_str!("../sql/migrations/0002_reservation_time.sql"),
    ),
    (
        3,
        include_str!("../sql/migrations/0003_completion_time_and_holder.sql"),
    ),
    (
        4,
        include_str!("../sql/migrations/0004_records_in_doubt.sql"),
    ),
    (5, include_str!("../sql/migrations/0005_hot_completion.sql")),
    (6, include_str!("../sql/migrations/0006_no_state_check.sql")),
];

/// The index of purge and the in-progress listing, built after the migrations, concurrently,
/// outside a transaction.
pub(crate) const INDEX_RESERVED: &str = include_str!("../sql/index_reserved.sql");
/// The index of a lookup by key, built the same way.
pub(crate) const INDEX_KEY: &str = include_str!("../sql/index_key.sql");
/// The index of the in-doubt listing, built the same way.
pub(crate) const INDEX_IN_DOUBT: &str = include_str!("../sql/index_in_doubt.sql");
/// The indexes of versions before 5 on columns the completion changes, dropped concurrently
/// once `INDEX_RESERVED` is valid.
pub(crate) const INDEX_DROP_DEADLINE: &str = include_str!("../sql/index_drop_deadline.sql");
/// See [`INDEX_DROP_DEADLINE`].
pub(crate) const INDEX_DROP_IN_PROGRESS: &str = include_str!("../sql/index_drop_in_progress.sql");

/// The names of the table's indexes and of the tables beside it, `<table>_<suffix>`: each must
/// be a valid identifier too, or PostgreSQL would cut it at 63 bytes and two cut names could
/// meet.
pub(crate) fn derived_names(table: &str) -> impl Iterator<Item = String> + '_ {
    INDEX_SUFFIXES
        .iter()
        .chain(TABLE_SUFFIXES)
        .map(move |suffix| format!("{table}_{suffix}"))
}

/// Every statement, with the configured schema and table in place of the defaults.
#[derive(Debug)]
pub(crate) struct Statements {
    pub(crate) read: Arc<str>,
    pub(crate) insert: Arc<str>,
    pub(crate) reserve: Arc<str>,
    pub(crate) look: Arc<str>,
    pub(crate) replace_reservation: Arc<str>,
    pub(crate) complete: Arc<str>,
    pub(crate) effect_tx_open: Arc<str>,
    pub(crate) release: Arc<str>,
    pub(crate) renew: Arc<str>,
    pub(crate) purge_expired: Arc<str>,
    pub(crate) select_record: Arc<str>,
    pub(crate) select_inspected: Arc<str>,
    pub(crate) select_settled: Arc<str>,
    pub(crate) list_in_progress: Arc<str>,
    pub(crate) list_completed: Arc<str>,
    pub(crate) list_key: Arc<str>,
    pub(crate) stats: Arc<str>,
    pub(crate) list_in_doubt: Arc<str>,
    pub(crate) resolve_settle: Arc<str>,
    pub(crate) resolve_release: Arc<str>,
    pub(crate) resolve_defer: Arc<str>,
    pub(crate) reconciliations_query: Arc<str>,
    pub(crate) reconciliations_purge: Arc<str>,
    pub(crate) migrations_table: Arc<str>,
    pub(crate) migrations_applied: Arc<str>,
    pub(crate) migration_record: Arc<str>,
    pub(crate) migration_lock: Arc<str>,
    pub(crate) migration_lock_timeout: Arc<str>,
    pub(crate) index_reserved: Arc<str>,
    pub(crate) index_drop_reserved: Arc<str>,
    pub(crate) index_drop_deadline: Arc<str>,
    pub(crate) index_drop_in_progress: Arc<str>,
    pub(crate) index_key: Arc<str>,
    pub(crate) index_drop_key: Arc<str>,
    pub(crate) index_in_doubt: Arc<str>,
    pub(crate) index_drop_in_doubt: Arc<str>,
    pub(crate) index_valid: Arc<str>,
    pub(crate) index_lock: Arc<str>,
}

impl Statements {
    /// `schema` and `table` must have passed [`validate_identifier`](crate::validate_identifier);
    /// fenced writes wait for a held row at most the `deadlines`' lock deadline (a renewal a
    /// quarter of it).
    pub(crate) fn new(schema: &str, table: &str, deadlines: &Deadlines) -> Self {
        let sql = |text: &str| strip_comments(&for_table(text, schema, table)).into();
        let lock = deadlines.lock_ms();
        Self {
            read: sql(include_str!("../sql/read.sql")),
            insert: sql(include_str!("../sql/insert.sql")),
            reserve: sql(include_str!("../sql/reserve.sql")),
            look: sql(include_str!("../sql/look.sql")),
            replace_reservation: sql(include_str!("../sql/replace_reservation.sql")),
            complete: with_idle_timeout(
                &with_lock_timeout(&sql(include_str!("../sql/complete.sql")), lock),
                deadlines.idle_in_transaction_ms(),
            )
            .into(),
            effect_tx_open: strip_comments(include_str!("../sql/effect_tx_open.sql")).into(),
            release: with_lock_timeout(&sql(include_str!("../sql/release.sql")), lock).into(),
            renew: with_lock_timeout(
                &sql(include_str!("../sql/renew.sql")),
                deadlines.renew_lock_ms(),
            )
            .into(),
            purge_expired: sql(include_str!("../sql/purge_expired.sql")),
            select_record: sql(include_str!("../sql/select_record.sql")),
            select_inspected: sql(include_str!("../sql/select_inspected.sql")),
            select_settled: sql(include_str!("../sql/select_settled.sql")),
            list_in_progress: sql(include_str!("../sql/list_in_progress.sql")),
            list_completed: sql(include_str!("../sql/list_completed.sql")),
            list_key: sql(include_str!("../sql/list_key.sql")),
            stats: sql(include_str!("../sql/stats.sql")),
            list_in_doubt: sql(include_str!("../sql/list_in_doubt.sql")),
            resolve_settle: sql(include_str!("../sql/resolve_settle.sql")),
            resolve_release: sql(include_str!("../sql/resolve_release.sql")),
            resolve_defer: sql(include_str!("../sql/resolve_defer.sql")),
            reconciliations_query: sql(include_str!("../sql/reconciliations_query.sql")),
            reconciliations_purge: sql(include_str!("../sql/reconciliations_purge.sql")),
            migrations_table: sql(include_str!("../sql/migrations_table.sql")),
            migrations_applied: sql(include_str!("../sql/migrations_applied.sql")),
            migration_record: sql(include_str!("../sql/migration_record.sql")),
            migration_lock: strip_comments(include_str!("../sql/migration_lock.sql")).into(),
            migration_lock_timeout: strip_comments(include_str!(
                "../sql/migration_lock_timeout.sql"
            ))
            .into(),
            index_reserved: sql(INDEX_RESERVED),
            index_drop_reserved: sql(include_str!("../sql/index_drop_reserved.sql")),
            index_drop_deadline: sql(INDEX_DROP_DEADLINE),
            index_drop_in_progress: sql(INDEX_DROP_IN_PROGRESS),
            index_key: sql(INDEX_KEY),
            index_drop_key: sql(include_str!("../sql/index_drop_key.sql")),
            index_in_doubt: sql(INDEX_IN_DOUBT),
            index_drop_in_doubt: sql(include_str!("../sql/index_drop_in_doubt.sql")),
            index_valid: strip_comments(include_str!("../sql/index_valid.sql")).into(),
            index_lock: strip_comments(include_str!("../sql/index_lock.sql")).into(),
        }
    }
}

/// The statement without its `--` comments (none of the store's SQL has `--` inside a string):
/// fewer bytes on the wire, and no `$n` in a comment for the simple protocol to fill in.
pub(crate) fn strip_comments(sql: &str) -> String {
    sql.lines()
        .map(|line| {
            line.split_once("--")
                .map_or(line, |(code, _)| code)
                .trim_end()
        })
        .filter(|line| !line.is_empty())
        .collect::<Vec<_>>()
        .join("\n")
}

/// Puts `"schema"."table"` in place of `idem_records`, `"table_<suffix>"` in place of each
/// index name `idem_records_<suffix>` (an index lives in its table's schema),
/// `"schema"."table_<suffix>"` in place of each table beside it (`idem_records_reconciliations`),
/// `"schema".idem_schema_migrations` in place of the migrations table, and `"schema".` in place
/// of `idem_schema.`. Each default name is marked first and put in place once, so a configured
/// name that contains a default is not replaced again. Names are quoted, so a name that is also
/// a keyword (`user`) works.
pub(crate) fn for_table(sql: &str, schema: &str, table: &str) -> String {
    const MIGRATIONS_MARK: &str = "\u{1}migrations\u{1}";
    let mut sql = sql.replace(MIGRATIONS, MIGRATIONS_MARK);
    for suffix in INDEX_SUFFIXES {
        sql = sql.replace(
            &format!("{DEFAULT_TABLE}_{suffix}"),
            &format!("\u{1}{suffix}\u{1}"),
        );
    }
    for suffix in TABLE_SUFFIXES {
        sql = sql.replace(
            &format!("{DEFAULT_TABLE}_{suffix}"),
            &format!("\u{2}{suffix}\u{2}"),
        );
    }
    let mut sql = sql
        .replace(DEFAULT_TABLE, &format!("\"{schema}\".\"{table}\""))
        .replace(MIGRATIONS_MARK, &format!("\"{schema}\".{MIGRATIONS}"))
        .replace(SCHEMA, &format!("\"{schema}\"."));
    for suffix in INDEX_SUFFIXES {
        sql = sql.replace(
            &format!("\u{1}{suffix}\u{1}"),
            &format!("\"{table}_{suffix}\""),
        );
    }
    for suffix in TABLE_SUFFIXES {
        sql = sql.replace(
            &format!("\u{2}{suffix}\u{2}"),
            &format!("\"{schema}\".\"{table}_{suffix}\""),
        );
    }
    sql
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_are_put_in_place() {
        let sql = for_table(MIGRATION_FILES[0].1, "billing", "idem_records");
        assert!(sql.contains("CREATE TABLE IF NOT EXISTS \"billing\".\"idem_records\" ("));
        assert!(sql.contains(
            "CREATE INDEX IF NOT EXISTS \"idem_records_deadline\" ON \"billing\".\"idem_records\" (deadline)"
        ));
        let index = for_table(INDEX_RESERVED, "billing", "t");
        assert!(index.contains(
            "CREATE INDEX CONCURRENTLY IF NOT EXISTS \"t_reserved\"\n    ON \"billing\".\"t\" (reserved_at"
        ));
        let drop = for_table(INDEX_DROP_IN_PROGRESS, "billing", "t");
        assert!(drop.contains("DROP INDEX CONCURRENTLY IF EXISTS \"billing\".\"t_in_progress\""));
        let drop = for_table(INDEX_DROP_DEADLINE, "billing", "t");
        assert!(drop.contains("DROP INDEX CONCURRENTLY IF EXISTS \"billing\".\"t_deadline\""));
        let applied = for_table(include_str!("../sql/migrations_applied.sql"), "s", "t");
        assert!(applied.contains("FROM \"s\".idem_schema_migrations"));
        let complete = strip_comments(include_str!("../sql/complete.sql"));
        assert!(!complete.contains("--") && !complete.contains("encoded response"));
        assert!(complete.starts_with("UPDATE idem_records"));
    }

    #[test]
    fn the_audit_trail_and_its_indexes_follow_the_table() {
        let migration = for_table(MIGRATION_FILES[3].1, "billing", "t");
        assert!(migration.contains("ALTER TABLE \"billing\".\"t\"\n"));
        assert!(
            migration.contains("CREATE TABLE IF NOT EXISTS \"billing\".\"t_reconciliations\" (")
        );
        assert!(migration.contains(
            "CREATE INDEX IF NOT EXISTS \"t_trail_record\"\n    ON \"billing\".\"t_reconciliations\" (consumer"
        ));
        assert!(migration
            .contains("\"t_trail_kept\"\n    ON \"billing\".\"t_reconciliations\" (kept_until)"));
        // A configured name holding the default is put in place once.
        let settle = for_table(
            include_str!("../sql/resolve_settle.sql"),
            "s",
            "idem_records_reconciliations",
        );
        assert!(
            settle.contains("INSERT INTO \"s\".\"idem_records_reconciliations_reconciliations\" (")
        );
        assert!(settle.contains("UPDATE \"s\".\"idem_records_reconciliations\"\n"));
        let index = for_table(INDEX_IN_DOUBT, "billing", "t");
        assert!(index.contains("\"t_in_doubt\"\n    ON \"billing\".\"t\" (reserved_at"));
        assert!(derived_names("t").any(|name| name == "t_reconciliations"));
    }

    #[test]
    fn c13_fenced_writes_set_the_configured_lock_deadline() {
        let deadlines = Deadlines {
            lock: std::time::Duration::from_millis(800),
            ..Deadlines::default()
        };
        let sql = Statements::new("s", "t", &deadlines);
        assert!(sql
            .complete
            .contains("set_config('lock_timeout', '800', true)"));
        assert!(sql
            .release
            .contains("set_config('lock_timeout', '800', true)"));
        assert!(sql
            .renew
            .contains("set_config('lock_timeout', '200', true)"));
        assert!(!sql.complete.contains("'3s'"), "the mark is replaced");
    }

    #[test]
    fn c09_c13_the_completion_sets_the_configured_idle_deadline() {
        let deadlines = Deadlines {
            idle_in_transaction: std::time::Duration::from_millis(2500),
            ..Deadlines::default()
        };
        let sql = Statements::new("s", "t", &deadlines);
        assert!(sql
            .complete
            .contains("set_config('idle_in_transaction_session_timeout', '2500', true)"));
        assert!(!sql.complete.contains("'30s'"), "the mark is replaced");
    }
}
