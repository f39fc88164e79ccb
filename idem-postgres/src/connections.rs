//! The store's own connections: a stack of `PgConnection`s that the store takes and gives back
//! without a round trip.
//!
//! sqlx's pool pings a connection when it is given back (always) and, by default, when it is
//! taken out: a round trip more per answer, and a connection busy twice as long under load. The
//! store keeps its own connections instead and gives one back only after a statement finished
//! cleanly. A broken link closes its connection. One whose statement was cut off (the call's
//! budget, its caller gone) settles in the background, within its host's share of the
//! acquire timeout: once the statement has ended (and a transaction cut off has been rolled
//! back) and a round trip finds it outside any transaction, it goes back to the stack, else it
//! closes; a pool never runs dry on connections stuck in a statement (C13), and short budgets
//! under load do not turn every cut-off into a new connection. The effects' transactions of
//! `run_in_transaction` run on a stack of their own, which settles them the same way; your own
//! transactions use the sqlx pool ([`PgStore::pool`](crate::PgStore::pool)).
//!
//! Each connection remembers the host and the epoch it was opened in (`crate::hosts`): one that
//! failed moves the store to the next host, one cut off has its host checked, and one of an
//! older epoch is closed instead of reused.
//!
//! A new connection is opened (the connect loop over the hosts, then the set-up) by a task of
//! its own holding the call's permit while the call waits. A call cut off meanwhile leaves it
//! the permit for a second at most, so that the next call takes its connection instead of
//! starting another opening; past that the permit goes back, and one such opening per stack
//! (an orphan) goes on: its connection waits in the stack for the next call. Budgets shorter
//! than opening a connection (a loaded machine, a slow link, a silent host's share of the
//! acquire timeout before the next host) are served all the same, and at most one socket more
//! than the permits is ever being opened.

use crate::error::{store_error, BACKEND};
use crate::hosts::{Hosts, Place};
use idem_core::{Error, StoreErrorKind};
use sqlx::{AssertSqlSafe, PgConnection};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};
use tokio::sync::{oneshot, OwnedSemaphorePermit, Semaphore};

#[derive(Debug)]
pub(crate) struct Connections {
    hosts: Arc<Hosts>,
    idle: Arc<Idle>,
    permits: Arc<Semaphore>,
    /// Whether an opening goes on for a call that is gone ([`Opening::run`]).
    orphan: Arc<AtomicBool>,
    max: usize,
    acquire_timeout: Duration,
    /// What a new connection runs first ([`session::connection_setup`](crate::session)).
    setup: Option<Arc<str>>,
    /// How many connections cut off mid-statement may be settling at once ([`Settling`]),
    /// and how long each keeps its call's permit; `None`: such a connection closes.
    settling: Option<(Arc<Semaphore>, Duration)>,
}

/// A connection set up for the store's statements, with the host and epoch it was opened in
/// and until when it is spared ([`Held`]).
type Opened = (PgConnection, Place, Option<Instant>);

/// The connections given back, the last on top.
type Idle = Mutex<Vec<Opened>>;

/// A connection taken from the stack; dropped without [`Held::finish`] giving it back (nor
/// [`Held::close`]), it settles or closes ([`Settling`]) and its host is checked
/// (`Hosts::suspect`), unless it is spared (`spared_until`).
pub(crate) struct Held<'a> {
    conn: Option<PgConnection>,
    place: Place,
    /// For a connection opened after the call spent time on other hosts (`Hosts::connect`):
    /// until when it is spared, kept through the stack (the same request's next step takes it
    /// back from there). Dropped before then (a budget spent, in part, elsewhere), it leaves
    /// its host current. A broken link reported to [`finish`](Held::finish) or in the set-up
    /// leaves its host all the same; a new connection opened on the current host first is
    /// never spared, so a host that is silent itself is left within about two acquire
    /// timeouts and its share.
    spared_until: Option<Instant>,
    home: &'a Connections,
    /// The call's permit, which a settling connection keeps a while ([`PERMIT_HELD`]).
    permit: Option<OwnedSemaphorePermit>,
    /// Whether it was opened for this call (else it waited in the stack, maybe for long).
    pub(crate) fresh: bool,
    /// Whether, cut off, it settles ([`Settling`]) rather than closes.
    settles: bool,
    /// Set by its call once it no longer wants the answer ([`Held::overtaken_by`]): dropped
    /// then, it was cut off on purpose, not by a deadline, and its host is not suspect.
    overtaken: Option<Arc<AtomicBool>>,
}

impl Connections {
    pub(crate) fn new(
        hosts: Arc<Hosts>,
        max: u32,
        acquire_timeout: Duration,
        setup: Option<String>,
    ) -> Self {
        let max = usize::try_from(max.max(1)).unwrap_or(1);
        Self {
            hosts,
            idle: Arc::default(),
            permits: Arc::new(Semaphore::new(max)),
            orphan: Arc::default(),
            max,
            acquire_timeout,
            setup: setup.map(Arc::from),
            settling: None,
        }
    }

    /// This stack, with a connection cut off mid-statement settled instead of closed
    /// ([`Settling`]), keeping its call's permit for `permit_held` at most (or its host's
    /// share, if shorter). A transaction cut off is rolled back first (sqlx queues the
    /// `ROLLBACK` when it is dropped), and a connection still in one is never kept; a call
    /// that changes its session marks its connection
    /// [`session_changed`](Held::session_changed).
    pub(crate) fn settling(mut self, permit_held: Duration) -> Self {
        self.settling = Some((Arc::new(Semaphore::new(self.max)), permit_held));
        self
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
                permit: Some(permit),
                fresh: false,
                settles: self.settling.is_some(),
                overtaken: None,
            });
        }
        // Opened in a task of its own, which holds the permit while the call waits: a call
        // whose budget ends meanwhile leaves one such opening per stack to finish (the connect
        // loop moving the store off a silent host, the set-up) and to wait in the stack for the
        // next call, so that budgets shorter than opening a connection still get served, and a
        // silent host is still left.
        let (sent, opened) = oneshot::channel();
        let opening = Opening {
            hosts: Arc::clone(&self.hosts),
            idle: Arc::clone(&self.idle),
            orphan: Arc::clone(&self.orphan),
            max: self.max,
            acquire_timeout: self.acquire_timeout,
            setup: self.setup.clone(),
        };
        tokio::spawn(opening.run(permit, sent));
        let mut awaiting = Awaiting { opened, home: self };
        let ((conn, place, spared_until), permit) =
            (&mut awaiting.opened).await.map_err(|_| {
                Error::store(
                    BACKEND,
                    StoreErrorKind::Unavailable,
                    "opening a connection ended without an answer",
                )
            })??;
        Ok(Held {
            conn: Some(conn),
            place,
            spared_until,
            home: self,
            permit: Some(permit),
            fresh: true,
            settles: self.settling.is_some(),
            overtaken: None,
        })
    }

    /// The connection given back last, closing those of an older epoch on the way.
    fn idle(&self) -> Option<Opened> {
        let mut idle = self.idle.lock().unwrap_or_else(PoisonError::into_inner);
        while let Some((conn, place, spared)) = idle.pop() {
            if self.hosts.is_current(place) {
                return Some((conn, place, spared));
            }
            drop(conn);
        }
        None
    }

    async fn permit(&self) -> Result<OwnedSemaphorePermit, Error> {
        tokio::time::timeout(
            self.acquire_timeout,
            Arc::clone(&self.permits).acquire_owned(),
        )
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

/// The call's end of an opening: dropped after the connection was sent and before the call
/// took it, it puts the connection in the stack instead of closing it.
struct Awaiting<'a> {
    opened: oneshot::Receiver<Result<(Opened, OwnedSemaphorePermit), Error>>,
    home: &'a Connections,
}

impl Drop for Awaiting<'_> {
    fn drop(&mut self) {
        if let Ok(Ok((opened, _permit))) = self.opened.try_recv() {
            let home = self.home;
            keep(&home.hosts, &home.idle, home.max, opened);
        }
    }
}

/// What a new connection needs, moved into the task that opens it.
struct Opening {
    hosts: Arc<Hosts>,
    idle: Arc<Idle>,
    /// Whether an opening whose call is gone goes on for this stack.
    orphan: Arc<AtomicBool>,
    max: usize,
    acquire_timeout: Duration,
    setup: Option<Arc<str>>,
}

/// The stack's one opening whose call is gone: one is enough to move the store off a silent
/// host and to bring a connection a call's budget could not wait for; more would only hold
/// sockets on a host that does not answer.
struct Orphan<'a>(&'a AtomicBool);

impl<'a> Orphan<'a> {
    fn take(flag: &'a AtomicBool) -> Option<Self> {
        flag.compare_exchange(false, true, Ordering::AcqRel, Ordering::Acquire)
            .is_ok()
            // Lazily: a guard built and dropped for a flag it did not take would clear it.
            .then(|| Self(flag))
    }
}

impl Drop for Orphan<'_> {
    fn drop(&mut self) {
        self.0.store(false, Ordering::Release);
    }
}

impl Opening {
    /// Opens and sets up a connection, holding `permit`, and sends both to the call that
    /// asked. Once that call is gone, the opening goes on holding its permit for
    /// [`PERMIT_HELD`] at most (or a host's share, if shorter), as a settling connection does:
    /// under load an opening ends within that, and its connection waits in the stack for the
    /// calls that waited for its permit, rather than each of them starting an opening its
    /// budget cuts off too (a debug build's authentication alone outlasts budgets of tens of
    /// milliseconds on a loaded machine: every such opening wasted, nothing was served). One
    /// not opened by then may be on a silent host: its permit goes back, so calls after a
    /// silent spell wait no longer for handshakes that may never end, and it goes on only as
    /// the stack's one orphan. Its connection waits in the stack if its host is still the
    /// current one and the stack has room. Bounded: the connect loop by the acquire timeout,
    /// the set-up by a host's share of it.
    async fn run(
        self,
        permit: OwnedSemaphorePermit,
        mut sent: oneshot::Sender<Result<(Opened, OwnedSemaphorePermit), Error>>,
    ) {
        let mut open = Box::pin(self.open());
        let opened = tokio::select! {
            biased;
            opened = &mut open => opened,
            () = sent.closed() => {
                let hold = PERMIT_HELD.min(self.hosts.share(self.acquire_timeout));
                if let Ok(opened) = tokio::time::timeout(hold, &mut open).await {
                    // In the stack before the permit goes back: its next holder finds it.
                    if let Ok(opened) = opened {
                        self.keep(opened);
                    }
                    drop(permit);
                    return;
                }
                let Some(_orphan) = Orphan::take(&self.orphan) else {
                    // Its socket closes before its permit goes back: never one more.
                    drop(open);
                    drop(permit);
                    return;
                };
                drop(permit);
                if let Ok(opened) = open.await {
                    self.keep(opened);
                }
                return;
            }
        };
        if let Err(Ok((opened, _permit))) = sent.send(opened.map(|opened| (opened, permit))) {
            self.keep(opened);
        }
    }

    fn keep(&self, opened: Opened) {
        keep(&self.hosts, &self.idle, self.max, opened);
    }

    async fn open(&self) -> Result<Opened, Error> {
        let started = Instant::now();
        let (mut conn, place, after_others) = self.hosts.connect(self.acquire_timeout).await?;
        // Spared for as long as the call that opened it may still be running (the time the
        // other hosts took, and an acquire timeout more), through the stack too: the same
        // request's next step takes it back from there.
        let spared_until = after_others.then(|| {
            let now = Instant::now();
            now + (now - started) + self.acquire_timeout
        });
        if let Some(setup) = &self.setup {
            // Within the share of the host that took the connection, counted from then: the
            // time other hosts spent is not this one's to answer for.
            let within = self.hosts.share(self.acquire_timeout);
            set_up(&self.hosts, &mut conn, place, setup, within).await?;
        }
        Ok((conn, place, spared_until))
    }
}

/// Puts a connection opened for a call that is gone in the stack, if its host is still the
/// current one and the stack has room; else it closes.
fn keep(hosts: &Hosts, idle: &Idle, max: usize, (conn, place, spared_until): Opened) {
    if hosts.is_current(place) {
        let mut idle = idle.lock().unwrap_or_else(PoisonError::into_inner);
        if idle.len() < max {
            idle.push((conn, place, spared_until));
        }
    }
}

/// Sets a new connection up for the store's statements (READ COMMITTED and the store's
/// deadlines for its session, where it has a session of its own: `crate::session`), within
/// `within`. Cut off (the link, the deadline), its host is suspect, as for any statement;
/// refused by the server, its host is as good as before. Either way the connection closes.
async fn set_up(
    hosts: &Arc<Hosts>,
    conn: &mut PgConnection,
    place: Place,
    setup: &str,
    within: Duration,
) -> Result<(), Error> {
    let set_up = sqlx::raw_sql(AssertSqlSafe(setup.to_owned())).execute(conn);
    let error = match tokio::time::timeout(within, set_up).await {
        Ok(Ok(_)) => return Ok(()),
        Ok(Err(error)) => store_error(error),
        Err(_) => connecting_timed_out(),
    };
    if crate::error::is_broken_link(&error) {
        lost_at(hosts, place, within, &error);
    }
    Err(error)
}

/// A connection opened at `place` broke with `error`: a session that ended has its host
/// checked within a share of `within` before the store leaves it; a server that answered about
/// itself (read-only) is left at once.
fn lost_at(hosts: &Arc<Hosts>, place: Place, within: Duration, error: &Error) {
    if crate::error::ended_session(error) {
        hosts.suspect(place, within);
    } else {
        hosts.failed(place);
    }
}

/// [`lost_at`] for a connection of `home`, checked within its acquire timeout.
fn lost(home: &Connections, place: Place, error: &Error) {
    lost_at(&home.hosts, place, home.acquire_timeout, error);
}

fn connecting_timed_out() -> Error {
    Error::store(BACKEND, StoreErrorKind::Unavailable, "connecting timed out")
}

impl Held<'_> {
    pub(crate) fn conn(&mut self) -> &mut PgConnection {
        // Always `Some` until `finish` or `close` takes it.
        self.conn.as_mut().expect("a held connection")
    }

    /// Gives the connection back: what ran on it ended cleanly.
    pub(crate) fn give_back(self) {
        self.finish(&Ok::<(), Error>(()));
    }

    /// Gives the connection back if `result` says its statement finished cleanly: any answer, or
    /// an error the server sent (the connection is still in sync: a statement or lock timeout
    /// the server enforced included). A read-only server closes it and moves the store to the
    /// next host; a session that ended (a lost link, a terminated backend) closes it and has
    /// its host checked first (`Hosts::suspect`): one session lost on a healthy host never
    /// moves the store, nor closes every connection, nor sends it to a server a failover left.
    /// A connection of an older epoch is closed too.
    pub(crate) fn finish<T>(mut self, result: &Result<T, Error>) {
        if let Err(error) = result.as_ref().map(|_| ()) {
            if crate::error::is_broken_link(error) {
                lost(self.home, self.place, error);
                self.close();
                return;
            }
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
    /// Its session is about to change (settings the stack's other calls must not inherit):
    /// cut off, it closes instead of settling back into the stack.
    pub(crate) fn session_changed(&mut self) {
        self.settles = false;
    }

    /// Gives it up as cut off, to settle if its stack settles them: what ran on it left
    /// nothing in its session that the stack's other calls must not inherit.
    pub(crate) fn settle(mut self) {
        self.settles = self.home.settling.is_some();
    }

    /// Dropped once `overtaken` is set, its statement was cut off by its own call, which no
    /// longer wants the answer (a look a connection for the transaction came before): it
    /// settles as any connection cut off does, but its host is not suspect. A statement cut
    /// off under load that way says nothing of its host; a check of it opens a connection
    /// more, and one the loaded server is slow to answer or refuses would move the store off
    /// a healthy host.
    pub(crate) fn overtaken_by(&mut self, overtaken: Arc<AtomicBool>) {
        self.overtaken = Some(overtaken);
    }

    /// Closes the connection on purpose (its session was changed, or what ran on it failed
    /// with the server's own answer): its host is not suspect.
    pub(crate) fn close(mut self) {
        drop(self.conn.take());
    }
}

impl Drop for Held<'_> {
    /// Not given back: its statement was cut off mid-way (by the call's deadline, or its
    /// caller gone). Its host is checked (`Hosts::suspect`), unless the connection is still
    /// spared; the connection settles, on a stack that settles them, else it closes.
    fn drop(&mut self) {
        let Some(conn) = self.conn.take() else {
            return;
        };
        let home = self.home;
        let spared = self
            .spared_until
            .is_some_and(|until| Instant::now() < until);
        let overtaken = self
            .overtaken
            .as_ref()
            .is_some_and(|overtaken| overtaken.load(Ordering::Acquire));
        if !spared && !overtaken {
            home.hosts.suspect(self.place, home.acquire_timeout);
        }
        let slot = home
            .settling
            .as_ref()
            .filter(|_| self.settles)
            .and_then(|(slots, held)| Some((Arc::clone(slots).try_acquire_owned().ok()?, *held)));
        let runtime = tokio::runtime::Handle::try_current();
        if let (Some((slot, permit_held)), Ok(runtime)) = (slot, runtime) {
            let within = home.hosts.share(home.acquire_timeout);
            let settling = Settling {
                hosts: Arc::clone(&home.hosts),
                idle: Arc::clone(&home.idle),
                max: home.max,
                within,
                permit_held: permit_held.min(within),
            };
            let opened = (conn, self.place, self.spared_until);
            let permit = self.permit.take();
            drop(runtime.spawn(settling.run(opened, slot, permit)));
        }
    }
}

/// A connection whose statement was cut off, waiting in a task of its own for that statement's
/// end and one round trip more (which finds it outside any transaction), within its host's
/// share of the acquire timeout, then put back in the stack (if its host is still current and
/// there is room); else closed.
/// The server runs a statement to its end whether its client waits or not, so waiting costs it
/// nothing, while closing costs a new connection (a handshake, an authentication, a server
/// process) to the next call: under load, budgets shorter than a statement would otherwise
/// turn every cut-off into a new connection, and each new connection into more cut-offs,
/// until nothing is served. On the stacks of the store's statements it keeps its call's permit
/// for [`PERMIT_HELD`] at most, so that the next calls wait for it rather than open
/// connections (a dead link costs no more); on the effects' stack it gives it back at once. At
/// most as many settle at once as the stack has connections; beyond that, a cut-off
/// connection closes.
struct Settling {
    hosts: Arc<Hosts>,
    idle: Arc<Idle>,
    max: usize,
    within: Duration,
    /// How long it keeps its call's permit.
    permit_held: Duration,
}

/// Once what was sent on `conn` has been answered, whether it is outside any transaction: a
/// statement is the first of its transaction only outside a transaction block (its
/// `statement_timestamp()` is then the transaction's `now()`). A connection left in a
/// transaction (a call of several statements cut off mid-way) or in an aborted one (an error)
/// is never kept, whatever ran on it.
async fn outside_a_transaction(conn: &mut PgConnection) -> Result<bool, sqlx::Error> {
    use sqlx::Row;
    sqlx::raw_sql("SELECT now() = statement_timestamp()")
        .fetch_one(conn)
        .await?
        .try_get(0)
}

/// How long a connection of the store's statements that settles, or is being opened for a
/// call cut off, keeps the call's permit (or its host's share, if shorter): a statement cut off
/// under load ends within milliseconds, or a few hundred on a saturated machine, where giving
/// the permit back sooner opens connections that load it more; one that has not ended by then
/// may be on a dead link.
pub(crate) const PERMIT_HELD: Duration = Duration::from_secs(1);

impl Settling {
    async fn run(
        self,
        (mut conn, place, spared_until): Opened,
        slot: OwnedSemaphorePermit,
        mut permit: Option<OwnedSemaphorePermit>,
    ) {
        let settled = {
            let idle = tokio::time::timeout(self.within, outside_a_transaction(&mut conn));
            let hold = tokio::time::sleep(self.permit_held);
            tokio::pin!(idle, hold);
            loop {
                tokio::select! {
                    idle = &mut idle => break matches!(idle, Ok(Ok(true))),
                    // Given up as soon as the store leaves its host: a connection of an
                    // older epoch is never reused, and its permit serves the new host's calls.
                    () = self.hosts.left(place) => break false,
                    // A statement still running (a slow one, a link gone silent) gives its
                    // permit back: the stack's calls open another connection meanwhile.
                    () = &mut hold, if permit.is_some() => drop(permit.take()),
                }
            }
        };
        if settled {
            keep(
                &self.hosts,
                &self.idle,
                self.max,
                (conn, place, spared_until),
            );
        }
        drop((slot, permit));
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::hosts_url::{parse, HostPort};
    use sqlx::Row;

    /// Polls `get` once and drops it: its permit taken, its connection being opened.
    async fn cut_off(conns: &Connections) {
        tokio::select! {
            biased;
            _ = conns.get() => panic!("opened without a round trip"),
            () = std::future::ready(()) => {}
        }
    }

    /// The tests' server.
    fn server_url() -> String {
        std::env::var("IDEM_PG_URL")
            .expect("IDEM_PG_URL: run `bash scripts/test`, which starts PostgreSQL")
    }

    /// Takes a connection, runs `SELECT 1` on it and gives it back; whether it was opened
    /// for this call.
    async fn served(conns: &Connections) -> bool {
        let mut held = conns.get().await.expect("a connection");
        sqlx::query("SELECT 1")
            .execute(held.conn())
            .await
            .expect("served");
        let fresh = held.fresh;
        held.give_back();
        fresh
    }

    /// A stack of one connection on the tests' server, new connections set up with `setup`.
    fn on_the_server(setup: Option<String>) -> Connections {
        let url = server_url();
        let hosts = Arc::new(Hosts::new(parse(&url).expect("a URL")));
        Connections::new(hosts, 1, Duration::from_secs(5), setup)
    }

    /// Waits until a connection is kept in the stack; `why` if none is within 5 s.
    async fn until_kept(conns: &Connections, why: &str) {
        let waited = Instant::now();
        while conns
            .idle
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .is_empty()
        {
            assert!(waited.elapsed() < Duration::from_secs(5), "{why}");
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    }

    /// C13: the connection a call was opening when it was cut off is opened and set up all the
    /// same, and waits in the stack for the next call.
    #[tokio::test]
    async fn c13_a_connection_a_cut_off_call_was_opening_serves_the_next_call() {
        let setup = "SET application_name = 'idem cut off'".to_owned();
        let conns = on_the_server(Some(setup));
        cut_off(&conns).await;
        until_kept(&conns, "never opened").await;
        // The connection is the one opened, set up.
        let mut held = conns.get().await.expect("the connection in the stack");
        assert!(!held.fresh, "taken from the stack, not opened again");
        let name: String = sqlx::query("SHOW application_name")
            .fetch_one(held.conn())
            .await
            .expect("a statement")
            .get(0);
        assert_eq!(name, "idem cut off");
        held.give_back();
    }

    /// C13: a call cut off while its connection was being opened leaves the opening its
    /// permit (for `PERMIT_HELD` at most): the next call waits for it and takes that
    /// connection, rather than starting an opening its budget may cut off too.
    #[tokio::test]
    async fn c13_the_next_call_takes_the_connection_a_cut_off_call_was_opening() {
        let conns = on_the_server(None);
        cut_off(&conns).await;
        let held = conns.get().await.expect("a connection");
        assert!(
            !held.fresh,
            "a second opening, the first one's permit given back"
        );
        held.give_back();
    }

    /// `SELECT pg_sleep(seconds)` on `held`, cut off after 50 ms; the backend's process id.
    async fn cut_off_mid_statement(mut held: Held<'_>, seconds: f64) -> i32 {
        let pid: i32 = sqlx::query("SELECT pg_backend_pid()")
            .fetch_one(held.conn())
            .await
            .expect("a statement")
            .get(0);
        let slow = sqlx::query("SELECT pg_sleep($1)")
            .bind(seconds)
            .execute(held.conn());
        let cut = tokio::time::timeout(Duration::from_millis(50), slow).await;
        assert!(cut.is_err(), "the statement ran to its end");
        drop(held);
        pid
    }

    /// C13: a connection whose statement was cut off by its call's budget waits for that
    /// statement to end, keeping its permit, and goes back to the stack: the next call takes
    /// the same session instead of opening one (under load, budgets shorter than a statement
    /// otherwise turn every cut-off into a new connection, until nothing is served).
    #[tokio::test]
    async fn c13_a_connection_cut_off_mid_statement_settles_back_into_the_stack() {
        let conns = on_the_server(None).settling(PERMIT_HELD);
        let held = conns.get().await.expect("a connection");
        let pid = cut_off_mid_statement(held, 0.3).await;
        assert_eq!(
            conns.permits.available_permits(),
            0,
            "kept while it settles"
        );
        until_kept(&conns, "never settled").await;
        assert_eq!(conns.permits.available_permits(), 1);
        let mut held = conns.get().await.expect("the settled connection");
        assert!(!held.fresh, "taken from the stack, not opened again");
        let again: i32 = sqlx::query("SELECT pg_backend_pid()")
            .fetch_one(held.conn())
            .await
            .expect("in sync: a statement answers")
            .get(0);
        assert_eq!(again, pid, "the same session");
        held.give_back();
    }

    /// C13: a settling connection is given up, its permit back, as soon as the store leaves
    /// its host; one whose session was changed (a migration's index build) closes instead.
    #[tokio::test]
    async fn c13_a_settling_connection_is_given_up_when_the_store_moves_and_never_reused_changed() {
        let (hosts, conns) = twice_on_the_server(Duration::from_secs(10));
        let conns = conns.settling(PERMIT_HELD);
        let held = conns.get().await.expect("a connection");
        let place = held.place;
        cut_off_mid_statement(held, 5.0).await;
        assert_eq!(conns.permits.available_permits(), 1, "one of two settling");
        hosts.failed(place);
        let waited = Instant::now();
        while conns.permits.available_permits() < 2 {
            // Before the permit would go back on its own (PERMIT_HELD).
            assert!(
                waited.elapsed() < Duration::from_millis(150),
                "never given up"
            );
            tokio::time::sleep(Duration::from_millis(5)).await;
        }

        let conns = on_the_server(None).settling(PERMIT_HELD);
        let mut held = conns.get().await.expect("a connection");
        held.session_changed();
        cut_off_mid_statement(held, 0.1).await;
        assert_eq!(conns.permits.available_permits(), 1, "closed, not settling");
        tokio::time::sleep(Duration::from_millis(300)).await;
        assert!(conns
            .idle
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .is_empty());
    }

    /// C6, C13: a connection cut off inside a transaction (a call of several statements) is
    /// never kept: the statements of the next calls would run in it, answered and never
    /// committed. It closes, and the server rolls the transaction back.
    #[tokio::test]
    async fn c06_a_connection_cut_off_inside_a_transaction_is_never_kept() {
        let conns = on_the_server(None).settling(PERMIT_HELD);
        let mut held = conns.get().await.expect("a connection");
        sqlx::raw_sql("BEGIN")
            .execute(held.conn())
            .await
            .expect("begun");
        cut_off_mid_statement(held, 0.5).await;
        assert_eq!(conns.permits.available_permits(), 0, "settling");
        let waited = Instant::now();
        while conns.permits.available_permits() < 1 {
            assert!(waited.elapsed() < Duration::from_secs(2), "never settled");
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
        let kept = conns
            .idle
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .len();
        assert_eq!(kept, 0, "a connection left in a transaction was kept");
    }

    /// C13: a connection cut off on a link gone silent gives its permit back after
    /// `PERMIT_HELD`, while it waits out its host's share, then closes: the next call opens
    /// another.
    #[tokio::test]
    async fn c13_a_connection_cut_off_on_a_silent_link_gives_its_permit_back_then_closes() {
        let url = server_url();
        let authority = url
            .split_once('@')
            .and_then(|(_, rest)| rest.split('/').next())
            .expect("an authority");
        let proxy = fault_proxy::FaultProxy::start(authority)
            .await
            .expect("a proxy");
        let through = url.replacen(authority, &proxy.addr().to_string(), 1);
        let hosts = Arc::new(Hosts::new(parse(&through).expect("a URL")));
        let conns = Connections::new(hosts, 1, Duration::from_secs(4), None).settling(PERMIT_HELD);
        let mut held = conns.get().await.expect("a connection");
        proxy.set(fault_proxy::Fault::Freeze);
        let unanswered = sqlx::query("SELECT 1").execute(held.conn());
        let cut = tokio::time::timeout(Duration::from_millis(50), unanswered).await;
        assert!(cut.is_err(), "answered through a frozen link");
        drop(held);
        let dropped = Instant::now();
        while conns.permits.available_permits() < 1 {
            assert!(
                dropped.elapsed() < Duration::from_millis(2_000),
                "permit never back"
            );
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        let back = dropped.elapsed();
        assert!(back >= Duration::from_millis(900), "back after {back:?}");
        // Past the host's share (the acquire timeout: one host), the link still silent.
        tokio::time::sleep(Duration::from_millis(3_600)).await;
        proxy.set(fault_proxy::Fault::PassThrough);
        assert!(served(&conns).await, "the silent one closed, not kept");
    }

    /// C13: a call dropped after its connection was sent to it and before it took it (its
    /// task aborted from outside) leaves the connection in the stack, not closed.
    #[tokio::test]
    async fn c13_a_connection_sent_to_a_call_gone_since_waits_in_the_stack() {
        let conns = on_the_server(None);
        let mut call = Box::pin(conns.get());
        tokio::select! {
            biased;
            _ = &mut call => panic!("opened without a round trip"),
            () = std::future::ready(()) => {}
        }
        // Opened and sent meanwhile (a connection on loopback takes milliseconds).
        tokio::time::sleep(Duration::from_millis(500)).await;
        drop(call);
        until_kept(&conns, "closed, not kept").await;
        assert_eq!(conns.permits.available_permits(), 1);
    }

    /// The tests' server listed twice: a store of two healthy hosts.
    fn twice_on_the_server(acquire_timeout: Duration) -> (Arc<Hosts>, Connections) {
        let url = server_url();
        let mut target = parse(&url).expect("a URL");
        let host = HostPort {
            host: target.options.get_host().to_owned(),
            port: target.options.get_port(),
        };
        target.hosts = vec![host.clone(), host];
        let hosts = Arc::new(Hosts::new(target));
        let conns = Connections::new(Arc::clone(&hosts), 2, acquire_timeout, None);
        (hosts, conns)
    }

    /// C13: a statement cut off by its call's deadline on a host that answers (a slow
    /// statement, a loaded server) leaves the store on that host: its host is checked with a
    /// new connection first, which it takes. Under load, short budgets never make a store of
    /// healthy hosts flap between them (each move costs every connection of the epoch).
    #[tokio::test]
    async fn c13_a_statement_cut_off_on_a_host_that_answers_leaves_the_store_there() {
        let (hosts, conns) = twice_on_the_server(Duration::from_secs(1));
        served(&conns).await;
        let place = hosts.place();
        for _ in 0..3 {
            let held = conns.get().await.expect("a connection");
            cut_off_mid_statement(held, 2.0).await;
        }
        // Longer than the check's bound (a host's share: 500 ms).
        tokio::time::sleep(Duration::from_millis(800)).await;
        assert!(
            hosts.is_current(place),
            "the store left a host that answers"
        );
        served(&conns).await;
    }

    /// C13: a statement cut off on a host that has gone silent since leaves it, once a new
    /// connection to it has had its share of the acquire timeout and not been answered.
    #[tokio::test]
    async fn c13_a_statement_cut_off_on_a_silent_host_leaves_it_after_its_share() {
        let silent = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("a listener");
        let address = silent.local_addr().expect("its address");
        let url = format!("postgres://app@{address},{address}/db");
        let hosts = Arc::new(Hosts::new(parse(&url).expect("a URL")));
        let place = hosts.place();
        let checked = Instant::now();
        hosts.suspect(place, Duration::from_secs(1));
        hosts.suspect(place, Duration::from_secs(1));
        tokio::time::sleep(Duration::from_millis(300)).await;
        assert!(hosts.is_current(place), "left before its share");
        while hosts.is_current(place) {
            assert!(
                checked.elapsed() < Duration::from_secs(2),
                "a silent host kept"
            );
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        // One check for both: one connection reached the host.
        let mut accepted = 0;
        while let Ok(Ok(_)) =
            tokio::time::timeout(Duration::from_millis(100), silent.accept()).await
        {
            accepted += 1;
        }
        assert_eq!(accepted, 1);
    }

    /// C13: calls cut off while a host does not answer leave their openings their permits for
    /// `PERMIT_HELD`, then get them back, and one opening goes on for them: once the host
    /// answers again, calls do not wait for handshakes that will never end.
    #[tokio::test]
    async fn c13_cut_off_calls_give_their_permits_back_and_one_opening_goes_on() {
        // Accepts connections and never answers: a PostgreSQL handshake there never ends.
        let silent = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("a listener");
        let address = silent.local_addr().expect("its address");
        let hosts = Arc::new(Hosts::new(
            parse(&format!("postgres://app@{address}/db")).expect("a URL"),
        ));
        let conns = Connections::new(hosts, 2, Duration::from_secs(30), None);
        for _ in 0..4 {
            cut_off(&conns).await;
        }
        tokio::time::sleep(PERMIT_HELD - Duration::from_millis(100)).await;
        assert_eq!(conns.permits.available_permits(), 0, "given back early");
        let waited = Instant::now();
        while conns.permits.available_permits() < 2 {
            assert!(
                waited.elapsed() < Duration::from_secs(2),
                "{} permits back",
                conns.permits.available_permits()
            );
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        assert!(conns.orphan.load(Ordering::Acquire), "one opening goes on");
        // Each abandoned opening closed its socket: the one left open is the orphan's.
        let mut open = 0;
        let mut accepted = 0;
        while let Ok(Ok((mut socket, _))) =
            tokio::time::timeout(Duration::from_millis(200), silent.accept()).await
        {
            accepted += 1;
            let mut buf = vec![0u8; 1024];
            let closed = async {
                loop {
                    match tokio::io::AsyncReadExt::read(&mut socket, &mut buf).await {
                        Ok(0) | Err(_) => break,
                        Ok(_) => {}
                    }
                }
            };
            open += usize::from(
                tokio::time::timeout(Duration::from_millis(200), closed)
                    .await
                    .is_err(),
            );
        }
        assert!(accepted >= 1, "no opening reached the host");
        assert_eq!(open, 1, "{accepted} accepted");
    }
}
