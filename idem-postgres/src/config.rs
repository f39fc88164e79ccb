//! How a `PgStore` is configured: where, which table, which statements, which isolation.

use crate::deadlines::Deadlines;
use crate::params::StatementMode;
use idem_core::{Error, Field};

/// The isolation level of the transactions the store opens for an effect
/// ([`PgIdempotency::run_in_transaction`](crate::PgIdempotency::run_in_transaction)).
///
/// The store is correct at every level: the reservation and the fenced completion are single
/// statements that decide on the row itself. Pick the level your business writes need. At
/// `RepeatableRead` and `Serializable`, a completion racing a takeover of its record can end in a
/// serialization failure instead of `LeaseLost`: both roll the transaction back.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
#[non_exhaustive]
pub enum Isolation {
    /// PostgreSQL's default.
    #[default]
    ReadCommitted,
    /// One snapshot for the whole transaction.
    RepeatableRead,
    /// As if transactions ran one after another; conflicts are serialization failures, which
    /// are [`StoreErrorKind::TransactionConflict`](idem_core::StoreErrorKind::TransactionConflict):
    /// retry the whole transaction.
    Serializable,
}

impl Isolation {
    pub(crate) fn begin_statement(self) -> &'static str {
        match self {
            Isolation::ReadCommitted => "BEGIN ISOLATION LEVEL READ COMMITTED",
            Isolation::RepeatableRead => "BEGIN ISOLATION LEVEL REPEATABLE READ",
            Isolation::Serializable => "BEGIN ISOLATION LEVEL SERIALIZABLE",
        }
    }
}

/// The settings of a store.
#[derive(Debug, Clone)]
pub(crate) struct PgConfig {
    pub(crate) schema: String,
    pub(crate) table: String,
    pub(crate) statements: StatementMode,
    pub(crate) isolation: Isolation,
    pub(crate) deadlines: Deadlines,
}

impl Default for PgConfig {
    fn default() -> Self {
        Self {
            schema: "public".to_owned(),
            table: "idem_records".to_owned(),
            statements: StatementMode::Prepared,
            isolation: Isolation::ReadCommitted,
            deadlines: Deadlines::default(),
        }
    }
}

/// The longest store table name: its longest derived name, the audit trail's
/// `<table>_reconciliations`, must fit PostgreSQL's 63 bytes.
const MAX_TABLE_NAME: usize = 63 - "_reconciliations".len();

/// Checks a store table's name: a valid identifier ([`validate_identifier`]) whose derived names
/// (its indexes, `<table>_reserved`..., and the audit trail of records in doubt beside it,
/// `<table>_reconciliations`) are valid identifiers too, so PostgreSQL never cuts one at 63
/// bytes: at most 47 bytes.
///
/// ```
/// assert!(idem_postgres::validate_table_name("idem_records").is_ok());
/// assert!(idem_postgres::validate_table_name(&"t".repeat(47)).is_ok());
/// assert!(idem_postgres::validate_table_name(&"t".repeat(48)).is_err());
/// ```
pub fn validate_table_name(table: &str) -> Result<(), Error> {
    validate_identifier(table)?;
    crate::sql::derived_names(table).try_for_each(|name| {
        validate_identifier(&name).map_err(|_| {
            Error::invalid(
                Field::Config,
                format!(
                    "table name {table:?} is too long for its index and audit trail names (at most {MAX_TABLE_NAME} bytes)"
                ),
            )
        })
    })
}

/// Accepts a plain lower-case PostgreSQL identifier: a letter or `_`, then letters, digits or
/// `_`, at most 63 bytes, not starting with `pg_` (reserved). Anything else could inject SQL
/// through configuration, or name an object other than the one meant (PostgreSQL folds unquoted
/// names to lower case), and is [`Error::InvalidInput`].
///
/// ```
/// use idem_postgres::validate_identifier;
/// assert!(validate_identifier("idem_records").is_ok());
/// assert!(validate_identifier("Records").is_err());
/// assert!(validate_identifier("records; DROP TABLE charges").is_err());
/// assert!(validate_identifier("pg_catalog").is_err());
/// ```
pub fn validate_identifier(name: &str) -> Result<(), Error> {
    let mut bytes = name.bytes();
    let first_ok = bytes
        .next()
        .is_some_and(|b| b.is_ascii_lowercase() || b == b'_');
    let rest_ok = bytes.all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'_');
    if !first_ok || !rest_ok || name.len() > 63 {
        return Err(Error::invalid(
            Field::Config,
            format!("{name:?} is not a plain lower-case identifier ([a-z_][a-z0-9_]*, at most 63 bytes)"),
        ));
    }
    if name.starts_with("pg_") {
        return Err(Error::invalid(
            Field::Config,
            "names starting with pg_ are reserved",
        ));
    }
    Ok(())
}
