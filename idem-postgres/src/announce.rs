//! The announcement of a record's change to other processes' change feeds (C5): one
//! `pg_notify` on one of the store's own connections, sent like every statement of the store
//! (its deadlines, READ COMMITTED, and in [`StatementMode::Simple`](crate::StatementMode::Simple) one simple-query message:
//! it works behind PgBouncer in transaction mode, where the notification is delivered when the
//! statement's own transaction commits).

use crate::ops::Ops;
use crate::params::{execute_after, Param};
use crate::sql::strip_comments;
use idem_core::Error;
use sqlx::PgConnection;
use std::sync::{Arc, OnceLock};

/// `sql/announce.sql`, without its comments.
fn statement() -> &'static Arc<str> {
    static SQL: OnceLock<Arc<str>> = OnceLock::new();
    SQL.get_or_init(|| strip_comments(include_str!("../sql/announce.sql")).into())
}

impl Ops {
    /// Sends `payload` on `channel` (a record's digest in hex, or a feed's ping).
    pub(crate) async fn announce(
        &self,
        conn: &mut PgConnection,
        channel: &str,
        payload: &str,
    ) -> Result<(), Error> {
        execute_after(
            conn,
            self.mode,
            &self.preamble,
            statement(),
            &[Param::Text(channel), Param::Text(payload)],
        )
        .await
        .map(drop)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::params::inline;

    #[test]
    fn c05_the_announcement_is_one_statement_with_literals_in_simple_mode() {
        let sql = inline(
            statement(),
            &[Param::Text("idem_changes"), Param::Text("00ff")],
        );
        assert_eq!(sql, "SELECT pg_notify(E'idem_changes', E'00ff')");
    }
}
