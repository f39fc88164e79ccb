//! How a statement's parameters reach the server: bound to a prepared statement (the default),
//! or written into the statement's text for the simple query protocol, which is what a
//! connection pooler in transaction mode can carry.

use crate::error::store_error;
use idem_core::Error;
use sqlx::postgres::{PgArguments, PgRow};
use sqlx::{Arguments, AssertSqlSafe, PgConnection};
use std::sync::Arc;

/// How the store sends its statements; see [`PgStoreBuilder::statements`](crate::PgStoreBuilder::statements).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
#[non_exhaustive]
pub enum StatementMode {
    /// Prepared statements, cached per connection (the default): one round trip per statement
    /// once a connection has prepared it. Needs a session of its own: a direct connection, or
    /// a pooler in session mode. Not behind a pooler in transaction mode, even one that keeps
    /// prepared statements (PgBouncer 1.21+ `max_prepared_statements`): the deadlines and
    /// isolation level of the store's own statements are then its sessions' settings, which
    /// would stay on server connections other clients use and miss the ones its statements
    /// run on (C13).
    #[default]
    Prepared,
    /// The simple query protocol, parameters written into the statement as literals (text
    /// quoted, bytes as hex, integers as digits): one message per statement, nothing kept on
    /// the server connection, so it runs behind a pooler in transaction mode.
    Simple,
}

/// One parameter of a statement: of the store's own, or of one run with
/// [`PgStore::execute`](crate::PgStore::execute) or [`PgStore::fetch_all`](crate::PgStore::fetch_all).
/// Bound as the Rust type says, or written into the statement as a literal with the simple
/// protocol ([`StatementMode::Simple`]).
///
/// ```
/// use idem_postgres::Param;
/// let params = [Param::Text("stripe"), Param::Bytes(b"evt_1"), Param::Int(42)];
/// # let _ = params;
/// ```
#[derive(Debug, Clone, Copy)]
#[non_exhaustive]
pub enum Param<'a> {
    /// `text` (never containing NUL, which PostgreSQL's text cannot hold).
    Text(&'a str),
    /// `bytea`.
    Bytes(&'a [u8]),
    /// Bytes, or SQL `NULL` (a `bytea` NULL when bound; write `$n::bytea` in the statement so
    /// that the simple protocol's `NULL` has the type too).
    MaybeBytes(Option<&'a [u8]>),
    /// `bigint`.
    Int(i64),
    /// `boolean`.
    Bool(bool),
}

impl Param<'_> {
    /// The bytes this parameter takes in a bind message: its length, then its value.
    fn encoded_len(&self) -> usize {
        4 + match *self {
            Param::Text(text) => text.len(),
            Param::Bytes(bytes) => bytes.len(),
            Param::MaybeBytes(bytes) => bytes.map_or(0, <[u8]>::len),
            Param::Int(_) => 8,
            Param::Bool(_) => 1,
        }
    }
}

/// `sql` with `params` on `conn`, run by the executor method `$run` (`fetch_all`,
/// `fetch_optional`, `execute`): bound to the prepared statement, or, with the simple protocol,
/// written into it after `preamble` in one message.
macro_rules! run_as {
    ($run:ident, $conn:expr, $mode:expr, $preamble:expr, $sql:expr, $params:expr) => {
        match $mode {
            StatementMode::Prepared => {
                sqlx::query_with(AssertSqlSafe(Arc::clone($sql)), arguments($params)?)
                    .$run($conn)
                    .await
            }
            StatementMode::Simple => {
                let text = format!("{}{}", $preamble, inline($sql, $params));
                sqlx::raw_sql(AssertSqlSafe(text)).$run($conn).await
            }
        }
        .map_err(store_error)
    };
}

/// Runs `sql` (one of the store's `.sql` files, with `$1..$n` placeholders) with `params` on
/// `conn`; returns its rows.
pub(crate) async fn fetch_all(
    conn: &mut PgConnection,
    mode: StatementMode,
    sql: &Arc<str>,
    params: &[Param<'_>],
) -> Result<Vec<PgRow>, Error> {
    fetch_all_after(conn, mode, "", sql, params).await
}

/// Like [`fetch_all`], with `preamble` (statements that return no rows, such as the store's
/// `SET LOCAL`s) sent before the statement in the same simple-query message; ignored for
/// prepared statements, whose session carries such settings.
pub(crate) async fn fetch_all_after(
    conn: &mut PgConnection,
    mode: StatementMode,
    preamble: &str,
    sql: &Arc<str>,
    params: &[Param<'_>],
) -> Result<Vec<PgRow>, Error> {
    run_as!(fetch_all, conn, mode, preamble, sql, params)
}

/// Like [`fetch_all_after`], for a statement that returns one row at most: its row, or `None`.
/// Every result of the statement is still read to its end (an error after the row is an error),
/// without collecting rows into a list.
pub(crate) async fn fetch_optional_after(
    conn: &mut PgConnection,
    mode: StatementMode,
    preamble: &str,
    sql: &Arc<str>,
    params: &[Param<'_>],
) -> Result<Option<PgRow>, Error> {
    run_as!(fetch_optional, conn, mode, preamble, sql, params)
}

/// Like [`fetch_all`], for a statement whose result is how many rows it changed.
pub(crate) async fn execute(
    conn: &mut PgConnection,
    mode: StatementMode,
    sql: &Arc<str>,
    params: &[Param<'_>],
) -> Result<u64, Error> {
    execute_after(conn, mode, "", sql, params).await
}

/// Like [`execute`], with `preamble` as in [`fetch_all_after`]; the statements of the preamble
/// change no rows.
pub(crate) async fn execute_after(
    conn: &mut PgConnection,
    mode: StatementMode,
    preamble: &str,
    sql: &Arc<str>,
    params: &[Param<'_>],
) -> Result<u64, Error> {
    run_as!(execute, conn, mode, preamble, sql, params).map(|done| done.rows_affected())
}

fn arguments(params: &[Param<'_>]) -> Result<PgArguments, Error> {
    let mut args = PgArguments::default();
    // One allocation for the types and one for the values, each value after its 4-byte length:
    // growing them one parameter at a time cost a fresh key about 3 000 instructions.
    args.reserve(params.len(), params.iter().map(Param::encoded_len).sum());
    for param in params {
        match *param {
            Param::Text(text) => args.add(text),
            Param::Bytes(bytes) => args.add(bytes),
            Param::MaybeBytes(bytes) => args.add(bytes),
            Param::Int(n) => args.add(n),
            Param::Bool(b) => args.add(b),
        }
        .map_err(|e| store_error(sqlx::Error::Encode(e)))?;
    }
    Ok(args)
}

/// Writes the parameters into the statement as literals, in one pass over the statement (so a
/// value that contains `$2` is never substituted again): `$n` becomes a quoted text literal (an
/// `E''` string, quotes doubled and backslashes escaped, which holds whatever
/// `backslash_quote` says), `decode('…', 'hex')` for bytes (`NULL` for none), the
/// digits of an integer, or `true`/`false`. The values are the store's own (validated ids, digests, encoded
/// responses); text never contains NUL (scope parts and keys refuse control characters).
pub(crate) fn inline(sql: &str, params: &[Param<'_>]) -> String {
    let mut out = String::with_capacity(sql.len() + 64);
    let mut rest = sql;
    while let Some(at) = rest.find('$') {
        out.push_str(&rest[..at]);
        let after = &rest[at + 1..];
        let digits = after.bytes().take_while(u8::is_ascii_digit).count();
        let param = after[..digits]
            .parse::<usize>()
            .ok()
            .and_then(|n| n.checked_sub(1))
            .and_then(|i| params.get(i));
        match param {
            Some(param) => write_literal(&mut out, *param),
            None => out.push_str(&rest[at..at + 1 + digits]),
        }
        rest = &after[digits..];
    }
    out.push_str(rest);
    out
}

fn write_literal(out: &mut String, param: Param<'_>) {
    match param {
        Param::Text(text) => {
            out.push_str("E'");
            for c in text.chars() {
                match c {
                    '\'' => out.push_str("''"),
                    '\\' => out.push_str("\\\\"),
                    c => out.push(c),
                }
            }
            out.push('\'');
        }
        Param::Bytes(bytes) | Param::MaybeBytes(Some(bytes)) => {
            out.push_str("decode('");
            for b in bytes {
                out.push(char::from(HEX[usize::from(b >> 4)]));
                out.push(char::from(HEX[usize::from(b & 15)]));
            }
            out.push_str("', 'hex')");
        }
        Param::MaybeBytes(None) => out.push_str("NULL"),
        Param::Int(n) => out.push_str(&n.to_string()),
        Param::Bool(b) => out.push_str(if b { "true" } else { "false" }),
    }
}

const HEX: &[u8; 16] = b"0123456789abcdef";

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn c12_literals_cannot_break_out_of_their_quotes() {
        let sql = inline(
            "SELECT $1, $2, $3, $10, $11, $12, $13",
            &[
                Param::Text("a'b\\c'); DROP TABLE x; -- $2"),
                Param::Bytes(&[0, 255]),
                Param::Int(-5),
                Param::Int(0),
                Param::Int(0),
                Param::Int(0),
                Param::Int(0),
                Param::Int(0),
                Param::Int(0),
                Param::Int(10),
                Param::Bool(true),
                Param::MaybeBytes(Some(&[1])),
                Param::MaybeBytes(None),
            ],
        );
        assert_eq!(
            sql,
            "SELECT E'a''b\\\\c''); DROP TABLE x; -- $2', decode('00ff', 'hex'), -5, 10, true, decode('01', 'hex'), NULL"
        );
    }
}
