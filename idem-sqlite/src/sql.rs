//! The store's SQL, read from the `.sql` files beside this crate, for one table name.

/// The table name the `.sql` files are written with.
const DEFAULT_TABLE: &str = "idem_records";

pub(crate) const MIGRATIONS_TABLE: &str = include_str!("../sql/migrations_table.sql");

/// The current schema in one repeatable script, with its rows in the migrations table (what
/// [`schema_sql`](crate::schema_sql) prints), for the default table name.
pub(crate) const SCHEMA: &str = include_str!("../sql/schema.sql");

/// One step of a migration.
#[derive(Debug)]
pub(crate) enum Step {
    /// Statements that can run on the table as the previous version left it.
    Sql(&'static str),
    /// An `ALTER TABLE .. ADD COLUMN`, which SQLite cannot make `IF NOT EXISTS`: skipped when
    /// the column is there already (a table rolled back to an older version keeps it).
    AddColumn {
        /// The column it adds.
        column: &'static str,
        /// The statement.
        sql: &'static str,
    },
}

/// The versioned migrations, in order: (version, steps, for the default table name).
pub(crate) const MIGRATIONS: &[(i64, &[Step])] = &[
    (
        1,
        &[Step::Sql(include_str!(
            "../sql/migrations/0001_create_records.sql"
        ))],
    ),
    (
        2,
        &[
            Step::AddColumn {
                column: "reserved_at",
                sql: include_str!("../sql/migrations/0002_reservation_time.sql"),
            },
            Step::Sql(include_str!("../sql/migrations/0002_in_progress_index.sql")),
        ],
    ),
    (
        3,
        &[
            Step::AddColumn {
                column: "completed_at",
                sql: include_str!("../sql/migrations/0003_completed_at.sql"),
            },
            Step::AddColumn {
                column: "holder",
                sql: include_str!("../sql/migrations/0003_holder.sql"),
            },
            Step::Sql(include_str!("../sql/migrations/0003_key_index.sql")),
        ],
    ),
    (
        4,
        &[
            Step::AddColumn {
                column: "doubt",
                sql: include_str!("../sql/migrations/0004_doubt.sql"),
            },
            Step::AddColumn {
                column: "doubt_check_at",
                sql: include_str!("../sql/migrations/0004_doubt_check_at.sql"),
            },
            Step::Sql(include_str!("../sql/migrations/0004_in_doubt_index.sql")),
            Step::Sql(include_str!("../sql/migrations/0004_reconciliations.sql")),
        ],
    ),
];

/// Every statement, with the configured table name in place of `idem_records`.
#[derive(Debug)]
pub(crate) struct Statements {
    pub(crate) select_record: String,
    pub(crate) select_inspected: String,
    pub(crate) decide_record: String,
    pub(crate) insert_reservation: String,
    pub(crate) replace_reservation: String,
    pub(crate) complete: String,
    pub(crate) release: String,
    pub(crate) renew: String,
    pub(crate) purge_expired: String,
    pub(crate) list_in_progress: String,
    pub(crate) list_completed: String,
    pub(crate) list_key: String,
    pub(crate) list_in_doubt: String,
    pub(crate) stats: String,
    pub(crate) resolve_settle: String,
    pub(crate) resolve_release: String,
    pub(crate) resolve_defer: String,
    pub(crate) reconciliation_insert: String,
    pub(crate) reconciliations_query: String,
    pub(crate) reconciliations_purge: String,
}

impl Statements {
    /// `table` must have passed [`validate_table_name`](crate::validate_table_name).
    pub(crate) fn for_table(table: &str) -> Self {
        let sql = |text: &str| for_table(&without_comment_lines(text), table);
        Self {
            select_record: sql(include_str!("../sql/select_record.sql")),
            select_inspected: sql(include_str!("../sql/select_inspected.sql")),
            decide_record: sql(include_str!("../sql/decide_record.sql")),
            insert_reservation: sql(include_str!("../sql/insert_reservation.sql")),
            replace_reservation: sql(include_str!("../sql/replace_reservation.sql")),
            complete: sql(include_str!("../sql/complete.sql")),
            release: sql(include_str!("../sql/release.sql")),
            renew: sql(include_str!("../sql/renew.sql")),
            purge_expired: sql(include_str!("../sql/purge_expired.sql")),
            list_in_progress: sql(include_str!("../sql/list_in_progress.sql")),
            list_completed: sql(include_str!("../sql/list_completed.sql")),
            list_key: sql(include_str!("../sql/list_key.sql")),
            list_in_doubt: sql(include_str!("../sql/list_in_doubt.sql")),
            stats: sql(include_str!("../sql/stats.sql")),
            resolve_settle: sql(include_str!("../sql/resolve_settle.sql")),
            resolve_release: sql(include_str!("../sql/resolve_release.sql")),
            resolve_defer: sql(include_str!("../sql/resolve_defer.sql")),
            reconciliation_insert: sql(include_str!("../sql/reconciliation_insert.sql")),
            reconciliations_query: sql(include_str!("../sql/reconciliations_query.sql")),
            reconciliations_purge: sql(include_str!("../sql/reconciliations_purge.sql")),
        }
    }
}

/// `sql` without its comment lines (the `.sql` files comment whole lines only): rusqlite's
/// statement cache hashes and compares a statement's whole text on every call.
fn without_comment_lines(sql: &str) -> String {
    sql.lines()
        .filter(|line| !line.trim_start().starts_with("--"))
        .collect::<Vec<_>>()
        .join("\n")
}

/// Puts `table` in place of the default table name (index names follow: `<table>_deadline`, and
/// the audit trail's table: `<table>_reconciliations`).
/// A plain textual replacement: `idem_schema_migrations`, which does not contain the default
/// name, is left as it is, so every table's versions are kept in the one migrations table.
pub(crate) fn for_table(sql: &str, table: &str) -> String {
    sql.replace(DEFAULT_TABLE, table)
}
