//! What the store's own statements run under, whatever the database's, the role's or a
//! pooler's server connection's defaults: READ COMMITTED (they decide on the row they read; at
//! a stricter default a duplicate would get a serialization failure instead of its answer) and
//! the store's [`Deadlines`].
//!
//! - [`StatementMode::Prepared`] needs a session of its own (a direct connection, or a pooler
//!   in session mode): the settings are made once, for the session, when a connection opens.
//! - [`StatementMode::Simple`] may run behind a pooler in transaction mode, where a session's
//!   settings stay on whichever server connection ran them (and leak to other clients): the
//!   settings travel with every statement instead, `SET LOCAL` in the statement's own implicit
//!   transaction, in the same simple-query message: no round trip more.

use crate::deadlines::Deadlines;
use crate::params::StatementMode;

/// What a new connection of the store runs before its first statement, if anything.
pub(crate) fn connection_setup(mode: StatementMode, deadlines: &Deadlines) -> Option<String> {
    match mode {
        StatementMode::Prepared => Some(format!(
            "SET SESSION CHARACTERISTICS AS TRANSACTION ISOLATION LEVEL READ COMMITTED; \
             SET statement_timeout = {}; SET lock_timeout = {}",
            deadlines.statement_ms(),
            deadlines.lock_ms()
        )),
        StatementMode::Simple => None,
    }
}

/// What results in text (simple statements) are read with: `bytea` in hex, whatever a session
/// left (an effect's `SET bytea_output`, kept by a pooler's server connection) or a database
/// or role sets; in `escape` every record would read as corrupt.
const TEXT_RESULTS: &str = "SET LOCAL bytea_output = 'hex'";

/// What precedes each of the store's own statements in its simple-query message (empty for
/// prepared statements, whose session carries the settings). A message of several statements
/// is one implicit transaction: the `SET LOCAL`s end with it.
pub(crate) fn statement_preamble(mode: StatementMode, deadlines: &Deadlines) -> String {
    match mode {
        StatementMode::Prepared => String::new(),
        StatementMode::Simple => format!(
            "SET TRANSACTION ISOLATION LEVEL READ COMMITTED; SET LOCAL statement_timeout = {}; \
             SET LOCAL lock_timeout = {}; {TEXT_RESULTS}; ",
            deadlines.statement_ms(),
            deadlines.lock_ms()
        ),
    }
}

/// The `BEGIN` of the effect's transaction at `isolation`: the transaction may sit idle between
/// statements at most the idle deadline, so a session whose client vanished mid-transaction
/// (a half-open connection) is ended by the server, and the record's row with it. Both are set
/// for this transaction, whatever an effect before did to the session (a `RESET ALL`, a `SET`):
/// set once per session, the deadline cost 13 200 fewer server instructions per fresh key, and
/// one effect's `RESET ALL` turned it off for the connection's later transactions. When the
/// store asks for a server that accepts writes, a two-commit transaction is `READ WRITE`: a
/// server in recovery (a standby, a demoted primary) refuses it at once, before the effect
/// runs. A one-commit one is not: `READ WRITE` would override a server's
/// `default_transaction_read_only`, and its reservation, its first write, is refused on such a
/// server as on one in recovery. It is
/// `DEFERRABLE`, which changes nothing for a transaction that is not SERIALIZABLE READ ONLY:
/// the mark of the store's transaction, which `RESET ALL` leaves and any `COMMIT` or
/// `ROLLBACK` ends, so that an effect that ends it itself is told apart
/// (sql/effect_tx_open.sql).
/// With simple statements, a one-commit reservation in it reads its results in text, as the
/// store's own statements do ([`TEXT_RESULTS`]).
pub(crate) fn effect_begin(
    isolation_begin: &str,
    deadlines: &Deadlines,
    read_write: bool,
    statements: StatementMode,
) -> String {
    let mode = if read_write { ", READ WRITE" } else { "" };
    let idle = deadlines.idle_in_transaction_ms();
    let begin = format!(
        "{isolation_begin}{mode}, DEFERRABLE; SET LOCAL idle_in_transaction_session_timeout = {idle}"
    );
    match statements {
        StatementMode::Simple => format!("{begin}; {TEXT_RESULTS}"),
        StatementMode::Prepared => begin,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[test]
    fn c13_every_statement_carries_its_deadlines_behind_a_pooler() {
        let deadlines = Deadlines {
            statement: Duration::from_millis(1500),
            lock: Duration::from_millis(700),
            idle_in_transaction: Duration::from_millis(300),
            transaction: Duration::from_secs(1),
        };
        assert_eq!(
            statement_preamble(StatementMode::Simple, &deadlines),
            "SET TRANSACTION ISOLATION LEVEL READ COMMITTED; SET LOCAL statement_timeout = 1500; \
             SET LOCAL lock_timeout = 700; SET LOCAL bytea_output = 'hex'; "
        );
        assert!(statement_preamble(StatementMode::Prepared, &deadlines).is_empty());
        assert!(connection_setup(StatementMode::Simple, &deadlines).is_none());
        let setup = connection_setup(StatementMode::Prepared, &deadlines).unwrap_or_default();
        assert!(setup.contains("READ COMMITTED") && setup.contains("statement_timeout = 1500"));
        let serializable = "BEGIN ISOLATION LEVEL SERIALIZABLE";
        assert_eq!(
            effect_begin(serializable, &deadlines, false, StatementMode::Prepared),
            "BEGIN ISOLATION LEVEL SERIALIZABLE, DEFERRABLE; \
             SET LOCAL idle_in_transaction_session_timeout = 300"
        );
        let read_committed = "BEGIN ISOLATION LEVEL READ COMMITTED";
        assert_eq!(
            effect_begin(read_committed, &deadlines, true, StatementMode::Simple),
            "BEGIN ISOLATION LEVEL READ COMMITTED, READ WRITE, DEFERRABLE; \
             SET LOCAL idle_in_transaction_session_timeout = 300; SET LOCAL bytea_output = 'hex'"
        );
    }
}
