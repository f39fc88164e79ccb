//! The store's own connections: a stack of `PgConnection`s that the store takes and gives back
//! without a round trip.
//!
//! sqlx's pool pings a connection when it is given back (always) and, by default, when it is
//! taken out: a round trip more per answer, and a connection busy twice as long under load. The
//! store keeps its own connections instead and gives one back only after a statement finished
//! cleanly; a connection whose statement was cut off (the caller's future dropped mid-query, a
//! broken link) is closed, never reused, and the next call opens a new one: a pool never runs
//! dry on connections stuck in a statement (C13). The effects' transactions of
//! `run_in_transaction` run on a stack of their own, given back only after a transaction that
//! ended cleanly; your own transactions use the sqlx pool
//! ([`PgStore::pool`](crate::PgStore::pool)).
//!
//! Each connection remembers the host and the epoch it was opened in (`crate::hosts`): one that
//! failed or was cut off moves the store to the next host, and one of an older epoch is closed
//! instead of reused.

use crate::error::{store_error, BACKEND};
use crate::hosts::{Hosts, Place};
use idem_core::{Error, StoreErrorKind};
use sqlx::{AssertSqlSafe, PgConnection};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};
use tokio::sync::{Semaphore, SemaphorePermit};

#[derive(Debug)]
pub(crate) struct Connections {
    hosts: Arc<Hosts>,
    idle: Mutex<Vec<(PgConnection, Place, Option<Instant>)>>,
    permits: Semaphore,
    acquire_timeout: Duration,
    /// What a new connection runs first ([`session::connection_setup`](crate::session)).
    setup: Option<String>,
}

/// A connection taken from the stack; dropped without [`Held::finish`] giving it back (nor
/// [`Held::close`]), it is closed and its host is suspect (`Hosts::failed`), unless it is
/// spared (`spared_until`).
pub(crate) struct Held<'a> {
    conn: Option<PgConnection>,
    place: Place,
    /// For a connection opened after the call spent time on other hosts (`Hosts::connect`):
    /// until when it is spared, kept through the stack (the same request's next step takes it
    /// back from there). Dropped before then (a budget spent, in part, elsewhere), it leaves
    /// its host current. A broken link reported to [`finish`](Held::finish) or in the set-up
    /// makes its host suspect all the same; a new connection opened on the current host first
    /// is never spared, so a host that is silent itself is left within about two acquire
    /// timeouts.
    spared_until: Option<Instant>,
    home: &'a Connections,
    _permit: SemaphorePermit<'a>,
    /// Whether it was opened for this call (else it waited in the stack, maybe for long).
    pub(crate) fresh: bool,
}

impl Connections {
    pub(crate) fn new(
        hosts: Arc<Hosts>,
        max: u32,
        acquire_timeout: Duration,
        setup: Option<String>,
    ) -> Self {
        Self {
            hosts,
            idle: Mutex::new(Vec::new()),
            permits: Semaphore::new(usize::try_from(max.max(1)).unwrap_or(1)),
            acquire_timeout,
            setup,
        }
    }

    /// A connection: the one given back last, or a new one.
    pub(crate) async fn get(&self) -> Result<Held<'_>, Error> {
        self.take(false).await
    }

    /// A newly opened connection, whatever waits in the stack.
    pub(crate) async fn get_fresh(&self) -> Result<Held<'_>, Error> {
        self.take(true).await
    }

    async fn take(&self, fresh_only: bool) -> Result<Held<'_>, Error> {
        let permit = self.permit().await?;
        let idle = if fresh_only { None } else { self.idle() };
        if let Some((conn, place, spared_until)) = idle {
            return Ok(Held {
                conn: Some(conn),
                place,
                spared_until,
                home: self,
                _permit: permit,
                fresh: false,
            });
        }
        let started = Instant::now();
        let search = SearchIfCutOff(Some((&self.hosts, self.acquire_timeout)));
        let connected = self.hosts.connect(self.acquire_timeout).await;
        search.disarm();
        let (conn, place, after_others) = connected?;
        // Spared for as long as the call that opened it may still be running (the time the
        // other hosts took, and an acquire timeout more), through the stack too: the same
        // request's next step takes it back from there.
        let spared_until = after_others.then(|| {
            let now = Instant::now();
            now + (now - started) + self.acquire_timeout
        });
        let held = Held {
            conn: Some(conn),
            place,
            spared_until,
            home: self,
            _permit: permit,
            fresh: true,
        };
        match &self.setup {
            // Within the share of the host that took the connection, counted from then: the
            // time other hosts spent is not this one's to answer for.
            Some(setup) => {
                held.set_up(setup, self.hosts.share(self.acquire_timeout))
                    .await
            }
            None => Ok(held),
        }
    }

    /// The connection given back last, closing those of an older epoch on the way.
    fn idle(&self) -> Option<(PgConnection, Place, Option<Instant>)> {
        let mut idle = self.idle.lock().unwrap_or_else(PoisonError::into_inner);
        while let Some((conn, place, spared)) = idle.pop() {
            if self.hosts.is_current(place) {
                return Some((conn, place, spared));
            }
            drop(conn);
        }
        None
    }

    async fn permit(&self) -> Result<SemaphorePermit<'_>, Error> {
        tokio::time::timeout(self.acquire_timeout, self.permits.acquire())
            .await
            .map_err(|_| {
                Error::store(
                    BACKEND,
                    StoreErrorKind::Unavailable,
                    "no store connection free before the acquire timeout",
                )
            })?
            .map_err(|_| Error::store(BACKEND, StoreErrorKind::Unavailable, "the store is closed"))
    }
}

/// Armed while a call opens a connection: dropped there (the call's budget ended before a
/// host took it, perhaps on a silent one, with hosts left to try), it has the hosts searched
/// in the background (`Hosts::search_soon`), so that the store leaves a silent host however
/// short its callers' budgets are, instead of each call starting over on that host.
struct SearchIfCutOff<'a>(Option<(&'a Arc<Hosts>, Duration)>);

impl SearchIfCutOff<'_> {
    fn disarm(mut self) {
        self.0 = None;
    }
}

impl Drop for SearchIfCutOff<'_> {
    fn drop(&mut self) {
        if let Some((hosts, within)) = self.0.take().filter(|(hosts, _)| hosts.several()) {
            hosts.search_soon(within);
        }
    }
}

fn connecting_timed_out() -> Error {
    Error::store(BACKEND, StoreErrorKind::Unavailable, "connecting timed out")
}

impl Held<'_> {
    /// Sets a new connection up for the store's statements (READ COMMITTED and the store's
    /// deadlines for its session, where it has a session of its own: `crate::session`), within
    /// `within`. Cut off (the link, the deadline, the caller gone), it is closed and its host
    /// is suspect, as for any statement; refused by the server, it is closed, its host as good
    /// as before.
    async fn set_up(mut self, setup: &str, within: Duration) -> Result<Self, Error> {
        let set_up = sqlx::raw_sql(AssertSqlSafe(setup.to_owned())).execute(self.conn());
        let error = match tokio::time::timeout(within, set_up).await {
            Ok(Ok(_)) => return Ok(self),
            Ok(Err(error)) => store_error(error),
            Err(_) => connecting_timed_out(),
        };
        if crate::error::is_broken_link(&error) {
            self.home.hosts.failed(self.place);
        }
        self.close();
        Err(error)
    }

    pub(crate) fn conn(&mut self) -> &mut PgConnection {
        // Always `Some` until `keep` consumes the guard.
        self.conn.as_mut().expect("a held connection")
    }

    /// Gives the connection back: what ran on it ended cleanly.
    pub(crate) fn give_back(self) {
        self.finish(&Ok::<(), Error>(()));
    }

    /// Gives the connection back if `result` says its statement finished cleanly: any answer, or
    /// an error the server sent (the connection is still in sync: a statement or lock timeout
    /// the server enforced included). Lost or broken links, and a read-only server, close it
    /// and move the store to the next host, spared or not; a connection of an older epoch is
    /// closed too.
    pub(crate) fn finish<T>(mut self, result: &Result<T, Error>) {
        let clean = !matches!(result, Err(e) if crate::error::is_broken_link(e));
        if !clean {
            self.home.hosts.failed(self.place);
            self.close();
            return;
        }
        if let Some(conn) = self.conn.take() {
            if self.home.hosts.is_current(self.place) {
                self.home
                    .idle
                    .lock()
                    .unwrap_or_else(PoisonError::into_inner)
                    .push((conn, self.place, self.spared_until));
            }
        }
    }
}

impl Held<'_> {
    /// Closes the connection on purpose (its session was changed, or what ran on it failed
    /// with the server's own answer): its host is not suspect.
    pub(crate) fn close(mut self) {
        drop(self.conn.take());
    }
}

impl Drop for Held<'_> {
    /// Not given back: its statement was cut off mid-way (by the call's deadline, or its
    /// caller gone). The connection closes; its host is suspect, unless it is still spared.
    fn drop(&mut self) {
        let spared = self
            .spared_until
            .is_some_and(|until| Instant::now() < until);
        if self.conn.take().is_some() && !spared {
            self.home.hosts.failed(self.place);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::hosts_url::parse;

    /// A call cut off while it connects to a silent host: whether the hosts were searched.
    async fn cut_off_on_a_silent_host(url_of: impl Fn(&str) -> String) -> bool {
        // Accepts connections and never answers: a PostgreSQL handshake there never ends.
        let silent = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("a listener");
        let address = silent.local_addr().expect("its address").to_string();
        let hosts = Arc::new(Hosts::new(parse(&url_of(&address)).expect("a URL")));
        let connections = Connections::new(Arc::clone(&hosts), 2, Duration::from_secs(2), None);
        let cut_off = tokio::time::timeout(Duration::from_millis(50), connections.get()).await;
        assert!(cut_off.is_err(), "the call was cut off while connecting");
        hosts.searched()
    }

    /// C13: a call cut off while connecting has the hosts searched where there is another to
    /// move to, and only there: one host, checked for writes or not, has none.
    #[tokio::test]
    async fn c13_a_call_cut_off_while_connecting_searches_only_several_hosts() {
        let several = |a: &str| format!("postgres://app@{a},127.0.0.1:1/db");
        assert!(cut_off_on_a_silent_host(several).await);
        let one = |a: &str| format!("postgres://app@{a}/db?target_session_attrs=read-write");
        assert!(!cut_off_on_a_silent_host(one).await);
        assert!(!cut_off_on_a_silent_host(|a: &str| format!("postgres://app@{a}/db")).await);
    }
}
