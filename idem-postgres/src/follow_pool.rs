//! The pool the store builds ([`PgStore::pool`](crate::PgStore::pool): your transactions, the
//! outbox's and the inbox's statements) follows the store's hosts (`crate::hosts`, C13):
//!
//! - it is pointed at each new current host (`Hosts::follow`);
//! - with `read-write`, a new connection to a read-only server is refused (`after_connect`:
//!   sqlx closes it and connects again after a pause) and the store moves on;
//! - a connection opened before the store last moved is closed instead of handed out
//!   (`before_acquire`, no round trip);
//! - a pool with no connection at all while it is asked for (a dead host refuses its connects,
//!   which sqlx retries on that one host until its acquire timeout) makes the store search its
//!   hosts in the background, at most once per connect timeout.

use crate::hosts::{read_only, Hosts};
use sqlx::postgres::{PgPool, PgPoolOptions};
use sqlx::PgConnection;
use std::sync::Arc;
use std::time::Duration;

/// `options` with the hooks that keep the pool on the store's current host.
pub(crate) fn hooks(hosts: &Arc<Hosts>, mut options: PgPoolOptions) -> PgPoolOptions {
    if hosts.checks_writes() {
        let check = Arc::clone(hosts);
        options = options.after_connect(move |conn, _| {
            let hosts = Arc::clone(&check);
            Box::pin(async move { writable(&hosts, conn).await })
        });
    }
    if hosts.follows() {
        let moves = Arc::clone(hosts);
        options = options.before_acquire(move |_, meta| {
            let stale = moves.opened_before_move(meta.age);
            Box::pin(async move { Ok(!stale) })
        });
    }
    options
}

/// The pool is about to be used: if it has no connection, the store's hosts are searched.
pub(crate) fn wanted(hosts: &Arc<Hosts>, pool: &PgPool, within: Duration) {
    if hosts.follows() && pool.size() == 0 {
        hosts.search_soon(within);
    }
}

/// A read-only server's new connection is refused, and the store moves on.
async fn writable(hosts: &Hosts, conn: &mut PgConnection) -> Result<(), sqlx::Error> {
    if read_only(conn).await? {
        hosts.failed(hosts.place());
        return Err(sqlx::Error::Protocol(
            "the server accepts no writes (target_session_attrs=read-write)".to_owned(),
        ));
    }
    Ok(())
}
