//! Where the store connects: one server, or a list of hosts (a primary and its standbys) of
//! which the store follows the one that accepts writes (C13).
//!
//! - A new connection tries the hosts in order from the current one, each within its share of
//!   the connect timeout; with `target_session_attrs=read-write` it stays only on a server whose
//!   `transaction_read_only` is off (one round trip more per new connection), else it is closed
//!   and the next host tried. The host that took it becomes the current one.
//! - A connection that failed (a lost link, a read-only error from a demoted server) moves the
//!   store to the next host (with one host and `read-write`, to the same name again, resolved
//!   anew). A statement cut off by its call's deadline has its host checked first, by a round
//!   trip on a new connection (`suspect`): a loaded host is kept, a silent one left. A call cut
//!   off on a connection opened after other hosts were tried does neither, for the time they
//!   took and an acquire timeout more: its budget was spent in part on them
//!   (`crate::connections`). Every move starts a new epoch: the connections of an older one
//!   are closed instead of reused (`left` tells the settling ones), and the pool the store
//!   built is pointed at the new host and closes its connections opened before the move.
//! - A pool without connections while it is asked for, and each new change feed listener, have
//!   the hosts searched first (`search_soon`, `search`), so that they too leave a dead host.
//!   The store's own connections are opened in tasks of their own, which go on when the call
//!   that asked is cut off (`crate::connections`), so its connect loop leaves a dead host
//!   however short the calls' budgets.
//! - Nothing resolves a name here: sqlx resolves the host at each connect, so a DNS name that
//!   moves to another address is followed too.

use crate::error::{store_error, BACKEND};
use crate::hosts_url::{HostPort, SessionAttrs, Target};
use idem_core::{Error, StoreErrorKind};
use sqlx::postgres::{PgConnectOptions, PgPool};
use sqlx::{ConnectOptions, Connection, PgConnection, Row};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

/// Which host a connection was opened on, and in which epoch.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Place {
    index: usize,
    epoch: u64,
}

/// The current host, and when the store last moved.
#[derive(Debug, Clone, Copy)]
struct Current {
    place: Place,
    moved_at: Option<Instant>,
}

/// The hosts of a store and the current one.
pub(crate) struct Hosts {
    options: PgConnectOptions,
    /// Empty: `options` says where (one server).
    hosts: Vec<HostPort>,
    attrs: SessionAttrs,
    current: Mutex<Current>,
    /// The pool pointed at each new current host (the one the store built, not yours).
    follower: Mutex<Option<PgPool>>,
    /// When the last search in the background started (`search_soon`).
    searched_at: Mutex<Option<Instant>>,
    /// When the last check of a host whose statement was cut off started (`suspect`).
    checked_at: Mutex<Option<Instant>>,
    /// How many connections were opened: the store's generation (`Store::generation`).
    opened: AtomicU64,
    /// Told of every move (`left`).
    moves: tokio::sync::Notify,
}

/// Never the connect options themselves: they may carry a password.
impl std::fmt::Debug for Hosts {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Hosts")
            .field("hosts", &self.hosts)
            .field("attrs", &self.attrs)
            .field("current", &self.current())
            .field("database", &self.options.get_database())
            .finish_non_exhaustive()
    }
}

impl Hosts {
    pub(crate) fn new(target: Target) -> Self {
        Self {
            options: target.options,
            hosts: target.hosts,
            attrs: target.attrs,
            current: Mutex::new(Current {
                place: Place { index: 0, epoch: 0 },
                moved_at: None,
            }),
            follower: Mutex::new(None),
            searched_at: Mutex::new(None),
            checked_at: Mutex::new(None),
            opened: AtomicU64::new(0),
            moves: tokio::sync::Notify::new(),
        }
    }

    /// One server, no check: what a pool's connect options say.
    pub(crate) fn single(options: PgConnectOptions) -> Self {
        Self::new(Target {
            options,
            hosts: Vec::new(),
            attrs: SessionAttrs::Any,
        })
    }

    /// Whether a new connection is checked for writes.
    pub(crate) fn checks_writes(&self) -> bool {
        self.attrs == SessionAttrs::ReadWrite
    }

    fn count(&self) -> usize {
        self.hosts.len().max(1)
    }

    fn options_at(&self, index: usize) -> PgConnectOptions {
        match self.hosts.get(index) {
            Some(host) => self.options.clone().host(&host.host).port(host.port),
            None => self.options.clone(),
        }
    }

    fn current(&self) -> Current {
        *self.current.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Where the current host is now.
    pub(crate) fn place(&self) -> Place {
        self.current().place
    }

    /// Whether a connection of the pool `age` old was opened before the store last moved.
    pub(crate) fn opened_before_move(&self, age: Duration) -> bool {
        self.current()
            .moved_at
            .is_some_and(|moved| age > moved.elapsed())
    }

    /// Whether a failure moves the store: several hosts, or one checked for writes (a DNS
    /// name that may now lead elsewhere).
    pub(crate) fn follows(&self) -> bool {
        self.hosts.len() > 1 || self.checks_writes()
    }

    /// The connect options of the current host.
    pub(crate) fn current_options(&self) -> PgConnectOptions {
        self.options_at(self.place().index)
    }

    /// Whether a connection opened at `place` is of the current epoch.
    pub(crate) fn is_current(&self, place: Place) -> bool {
        self.place().epoch == place.epoch
    }

    /// Points `pool` at each new current host from now on.
    pub(crate) fn follow(&self, pool: PgPool) {
        *self.follower.lock().unwrap_or_else(PoisonError::into_inner) = Some(pool);
    }

    /// Stops pointing the pool (the store is gone; the pool's hook holds these hosts).
    pub(crate) fn unfollow(&self) {
        drop(
            self.follower
                .lock()
                .unwrap_or_else(PoisonError::into_inner)
                .take(),
        );
    }

    /// A statement on a connection opened at `place` was cut off (the call's deadline, its
    /// caller gone): from there a loaded host and a silent one look alike. If that host is
    /// still the current one, it is checked in the background with a new connection and a
    /// round trip on it within its [`share`](Self::share) of `within`, and left
    /// ([`failed`](Self::failed)) only if that fails too: a store of healthy hosts under load
    /// never moves for its callers' short budgets. At most one check per share. Without a
    /// Tokio runtime, the host is left at once.
    pub(crate) fn suspect(self: &Arc<Self>, place: Place, within: Duration) {
        if !self.follows() || !self.is_current(place) {
            return;
        }
        let share = self.share(within);
        if !once_per(&self.checked_at, share) {
            return;
        }
        // One name given `read-write` is checked too: moving would start a new epoch, closing
        // every connection, at each cut-off. If the name now leads to another server while the
        // old one is silent, the check passes there, and the old server's connections go one
        // by one, each at its first cut-off (`crate::connections`, settling), never reused.
        let Ok(runtime) = tokio::runtime::Handle::try_current() else {
            self.failed(place);
            return;
        };
        let hosts = Arc::clone(self);
        drop(runtime.spawn(async move {
            // A round trip to the server itself: a pooler in front of it logs a client in
            // without it (with `read-write`, `open_at` has already asked the server).
            let answered = async {
                let mut conn = hosts.open_at(place.index).await?;
                if !hosts.checks_writes() {
                    sqlx::raw_sql("SELECT 1")
                        .execute(&mut conn)
                        .await
                        .map_err(store_error)?;
                }
                Ok::<_, Error>(conn)
            };
            match tokio::time::timeout(share, answered).await {
                Ok(Ok(conn)) => drop(tokio::time::timeout(share, conn.close()).await),
                Ok(Err(_)) | Err(_) => hosts.failed(place),
            }
        }));
    }

    /// A connection opened at `place` failed: if that host is still the current one, the next
    /// host becomes current, in a new epoch. One host without a check for writes: nothing
    /// moves, as with a plain URL.
    pub(crate) fn failed(&self, place: Place) {
        if !self.follows() {
            return;
        }
        {
            let mut current = self.current.lock().unwrap_or_else(PoisonError::into_inner);
            if current.place.epoch != place.epoch {
                return;
            }
            *current = Current {
                place: Place {
                    index: (place.index + 1) % self.count(),
                    epoch: place.epoch.wrapping_add(1),
                },
                moved_at: Some(Instant::now()),
            };
        }
        self.moved(self.place().index);
    }

    /// `index` took a connection: it becomes current, in a new epoch if it was not.
    fn arrived(&self, index: usize) -> Place {
        let (place, moved) = {
            let mut current = self.current.lock().unwrap_or_else(PoisonError::into_inner);
            let moved = current.place.index != index;
            if moved {
                *current = Current {
                    place: Place {
                        index,
                        epoch: current.place.epoch.wrapping_add(1),
                    },
                    moved_at: Some(Instant::now()),
                };
            }
            (current.place, moved)
        };
        if moved {
            self.moved(index);
        }
        place
    }

    fn moved(&self, index: usize) {
        let options = self.options_at(index);
        tracing::warn!(
            target: "idem_postgres",
            host = %options.get_host(),
            port = options.get_port(),
            "the store's new connections go to this host"
        );
        if let Some(pool) = &*self.follower.lock().unwrap_or_else(PoisonError::into_inner) {
            pool.set_connect_options(options);
        }
        self.moves.notify_waiters();
    }

    /// Returns once the store has moved off the epoch of `place` (at once if it has).
    pub(crate) async fn left(&self, place: Place) {
        loop {
            let moved = self.moves.notified();
            tokio::pin!(moved);
            moved.as_mut().enable();
            if !self.is_current(place) {
                return;
            }
            moved.await;
        }
    }

    /// Searches the hosts in the background for the current one (a connection opened and
    /// closed), at most once per `within`: for a pool that has no connection, whose own
    /// connects retry a host that refuses them until its acquire timeout. Without a Tokio
    /// runtime, nothing.
    pub(crate) fn search_soon(self: &Arc<Self>, within: Duration) {
        if !once_per(&self.searched_at, within) {
            return;
        }
        let Ok(runtime) = tokio::runtime::Handle::try_current() else {
            return;
        };
        let hosts = Arc::clone(self);
        drop(runtime.spawn(async move { hosts.search(within).await }));
    }

    /// How many connections were opened: a new one may be on a server (a restart, a promoted
    /// standby) that lost commits an older one acknowledged.
    pub(crate) fn opened(&self) -> u64 {
        self.opened.load(Ordering::Acquire)
    }

    /// Searches the hosts for the current one: a connection opened and closed.
    pub(crate) async fn search(&self, within: Duration) {
        if let Ok((conn, ..)) = self.connect(within).await {
            let _ = tokio::time::timeout(within, conn.close()).await;
        }
    }

    /// What each host has of `within` to take a connection: an equal share.
    pub(crate) fn share(&self, within: Duration) -> Duration {
        within / u32::try_from(self.count()).unwrap_or(u32::MAX)
    }

    /// A new connection, on the first host from the current one that takes it (and accepts
    /// writes, if asked), each host within its [`share`](Self::share) of `within`; and whether
    /// hosts before it were tried (the call spent time on them).
    pub(crate) async fn connect(
        &self,
        within: Duration,
    ) -> Result<(PgConnection, Place, bool), Error> {
        let start = self.place().index;
        let count = self.count();
        let share = self.share(within);
        let mut last = None;
        for step in 0..count {
            let index = (start + step) % count;
            match tokio::time::timeout(share, self.open_at(index)).await {
                Ok(Ok(conn)) => {
                    self.opened.fetch_add(1, Ordering::AcqRel);
                    return Ok((conn, self.arrived(index), step > 0));
                }
                Ok(Err(error)) => last = Some(error),
                Err(_) => {
                    last = Some(Error::store(
                        BACKEND,
                        StoreErrorKind::Unavailable,
                        "connecting timed out",
                    ));
                }
            }
        }
        Err(last.unwrap_or_else(|| {
            Error::store(
                BACKEND,
                StoreErrorKind::Unavailable,
                "no host to connect to",
            )
        }))
    }

    /// A new connection on the host at `index` (that accepts writes, if asked).
    async fn open_at(&self, index: usize) -> Result<PgConnection, Error> {
        let mut conn = self
            .options_at(index)
            .connect()
            .await
            .map_err(store_error)?;
        if self.checks_writes() && read_only(&mut conn).await.map_err(store_error)? {
            let _ = conn.close().await;
            return Err(Error::store(
                BACKEND,
                StoreErrorKind::Unavailable,
                "the server accepts no writes (target_session_attrs=read-write)",
            ));
        }
        Ok(conn)
    }
}

/// Whether something done at most once per `period` may start now (`last` says when it last
/// did, and is set to now if so).
fn once_per(last: &Mutex<Option<Instant>>, period: Duration) -> bool {
    let mut last = last.lock().unwrap_or_else(PoisonError::into_inner);
    if last.is_some_and(|at| at.elapsed() < period) {
        return false;
    }
    *last = Some(Instant::now());
    true
}

/// Whether the server of `conn` refuses writes (a standby, or `default_transaction_read_only`):
/// sent as a simple query, so that it works behind a pooler too.
pub(crate) async fn read_only(conn: &mut PgConnection) -> Result<bool, sqlx::Error> {
    let row = sqlx::raw_sql("SHOW transaction_read_only")
        .fetch_one(conn)
        .await?;
    Ok(row.try_get::<String, _>(0)? == "on")
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::hosts_url::parse;

    fn hosts(url: &str) -> Hosts {
        Hosts::new(parse(url).expect("a URL"))
    }

    #[test]
    fn c13_a_failed_host_moves_the_store_to_the_next_once() {
        let hosts = hosts("postgres://app@a:1,b:2,c:3/db?target_session_attrs=read-write");
        let first = hosts.place();
        assert_eq!(hosts.current_options().get_host(), "a");
        hosts.failed(first);
        assert_eq!(hosts.current_options().get_host(), "b");
        assert!(!hosts.is_current(first), "a new epoch");
        // Every connection of the old epoch reports it: the store moves once.
        hosts.failed(first);
        assert_eq!(hosts.current_options().get_host(), "b");
        let second = hosts.place();
        hosts.failed(second);
        hosts.failed(hosts.place());
        assert_eq!(hosts.current_options().get_host(), "a", "around the list");
        assert_eq!(hosts.arrived(1).index, 1);
        let shown = format!(
            "{:?}",
            super::Hosts::new(parse("postgres://u:secret@a,b/db").expect("a URL"))
        );
        assert!(!shown.contains("secret"), "{shown}");
        assert_eq!(hosts.current_options().get_port(), 2);
    }

    #[test]
    fn c13_one_host_never_moves() {
        let one = hosts("postgres://app@db:5433/payments");
        let place = one.place();
        one.failed(place);
        assert!(one.is_current(place));
        assert!(!one.opened_before_move(Duration::from_secs(3600)));
        let checked = hosts("postgres://app@db:5433/payments?target_session_attrs=read-write");
        let place = checked.place();
        checked.failed(place);
        assert!(!checked.is_current(place), "the name is resolved anew");
        assert_eq!(checked.current_options().get_host(), "db");
        assert!(checked.opened_before_move(Duration::from_secs(3600)));
        assert!(!checked.opened_before_move(Duration::ZERO));
        assert_eq!(
            (
                one.current_options().get_host(),
                one.current_options().get_port()
            ),
            ("db", 5433)
        );
    }
}
