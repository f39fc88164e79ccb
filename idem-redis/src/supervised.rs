//! A connection that heals itself (C13): one slot holding the connection in use, replaced by a
//! new one, opened from scratch (on a Cluster: from the seed nodes, the topology read again),
//! once calls on it keep failing unavailable.
//!
//! redis-rs heals most faults by itself (a single-node connection manager reconnects after a
//! lost connection, a cluster connection after a redirection or a lost node), not all: a
//! connection whose requests vanish without the socket closing (a half-open link) only ever
//! times out, and a cluster connection can stop reconnecting for good after a master restart
//! or a resharding under load, while a new connection works at once. So every call through the
//! slot has a deadline of its own, and after [`Settings::threshold`] unavailable failures (that
//! come close together, see [`QUIET`]) one rebuild starts, in a task of its own:
//!
//! - callers never wait for it: until it lands they go on with the connection in the slot (a
//!   call then fails within its deadline, or succeeds when the old connection recovered);
//! - however many callers fail at once, one rebuild runs at a time; the connection it opens
//!   replaces the one in use, which is dropped once the calls still holding it end;
//! - rebuilds back off: after each one the next may start only [`MIN_BACKOFF`] later, the
//!   delay doubling up to [`Settings::max_backoff`]; the first failing call after the delay
//!   starts it. A quiet spell (no failure for [`QUIET`]) forgets the count and the delay;
//! - a connection the opener refused (misconfigured: a Redis that may evict records) is never
//!   used: the one in use is dropped, and every call fails with the refusal, at once, until a
//!   rebuild (the first call after the back-off starts one) opens one that is accepted.

use idem_core::{Error, StoreErrorKind};
use std::future::Future;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::{Duration, Instant};

use crate::error::BACKEND;

/// The first delay between two rebuilds.
pub(crate) const MIN_BACKOFF: Duration = Duration::from_millis(100);

/// The longest delay between two rebuilds, whatever the settings say.
pub(crate) const MAX_BACKOFF: Duration = Duration::from_secs(2);

/// How long without a failure before the failures counted so far and the delay are forgotten.
pub(crate) const QUIET: Duration = Duration::from_secs(10);

/// What opens a connection for a [`Supervised`] slot.
pub(crate) trait Open: Send + Sync + 'static {
    /// The connection.
    type Conn: Send + Sync + 'static;

    /// Opens one, driven by the current runtime.
    fn open(&self) -> impl Future<Output = Result<Self::Conn, Error>> + Send;

    /// Checks `conn`, opened earlier, again (see [`Supervised::recheck`]); by default, nothing.
    fn check(&self, _conn: &Self::Conn) -> impl Future<Output = Result<(), Error>> + Send {
        async { Ok(()) }
    }
}

/// How a slot judges its connection.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Settings {
    /// How many unavailable failures start a rebuild.
    pub(crate) threshold: u32,
    /// How long one call may take, waiting for a connection included: past it, the call is
    /// unavailable, even if the driver's own timeouts never fired.
    pub(crate) call_deadline: Duration,
    /// How long opening a connection may take.
    pub(crate) open_deadline: Duration,
    /// How long a call must have run for its abandonment to count: the engine abandons store
    /// calls that outlive its own timeout, and also a renewal in flight when its execution
    /// ends, which says nothing about the connection.
    pub(crate) abandoned_after: Duration,
    /// The longest delay between two rebuilds (at most [`MAX_BACKOFF`]).
    pub(crate) max_backoff: Duration,
}

/// A supervised connection slot; see the [module](self). Clones share the slot.
pub(crate) struct Supervised<O: Open> {
    shared: Arc<Shared<O>>,
}

impl<O: Open> Clone for Supervised<O> {
    fn clone(&self) -> Self {
        Self {
            shared: Arc::clone(&self.shared),
        }
    }
}

struct Shared<O: Open> {
    opener: Arc<O>,
    settings: Settings,
    state: Mutex<State<O::Conn>>,
    /// Failures, rebuilds and forgotten connections so far: after any of them the connection
    /// may be a new one (the driver reconnects by itself after a failure).
    changes: AtomicU64,
}

struct State<C> {
    /// The connection in use; none before the first call of a slot opened lazily.
    current: Option<Arc<C>>,
    /// Unavailable failures since the last rebuild (or quiet spell).
    failures: u32,
    last_failure: Option<Instant>,
    rebuilding: bool,
    /// No rebuild starts before this.
    not_before: Option<Instant>,
    backoff: Duration,
    rebuilds: u64,
    /// The last opening's refusal (its backend and message), while the slot has no connection.
    refused: Option<(&'static str, String)>,
}

/// Whether an outcome counts against the connection: only an unavailable store error (a
/// timeout, a lost or refused connection, a cluster that is down); a refusal, a corrupt record
/// or a lost lease says nothing about the connection.
fn counts_against(error: &Error) -> bool {
    matches!(error, Error::Store(e) if e.kind() == StoreErrorKind::Unavailable)
}

/// An opening's error that refuses the connection it opened (misconfigured), as the slot
/// keeps it.
fn refusal(error: &Error) -> Option<(&'static str, String)> {
    match error {
        Error::Store(e) if e.kind() == StoreErrorKind::Misconfigured => {
            Some((e.backend(), e.source_ref().to_string()))
        }
        _ => None,
    }
}

impl<O: Open> Supervised<O> {
    /// A slot holding `conn`, opened by `opener`.
    pub(crate) fn new(conn: O::Conn, opener: Arc<O>, settings: Settings) -> Self {
        Self::with(Some(Arc::new(conn)), opener, settings)
    }

    /// A slot whose connection the first call opens.
    pub(crate) fn lazy(opener: Arc<O>, settings: Settings) -> Self {
        Self::with(None, opener, settings)
    }

    fn with(current: Option<Arc<O::Conn>>, opener: Arc<O>, settings: Settings) -> Self {
        let settings = Settings {
            max_backoff: settings.max_backoff.clamp(MIN_BACKOFF, MAX_BACKOFF),
            ..settings
        };
        Self {
            shared: Arc::new(Shared {
                opener,
                settings,
                state: Mutex::new(State {
                    current,
                    failures: 0,
                    last_failure: None,
                    rebuilding: false,
                    not_before: None,
                    backoff: MIN_BACKOFF,
                    rebuilds: 0,
                    refused: None,
                }),
                changes: AtomicU64::new(0),
            }),
        }
    }

    /// The opener.
    pub(crate) fn opener(&self) -> &O {
        &self.shared.opener
    }

    /// The connection in use, if there is one.
    pub(crate) fn current(&self) -> Option<Arc<O::Conn>> {
        self.shared.lock().current.clone()
    }

    /// Starts a rebuild now, failures or not, back-off or not (unless one is running): the
    /// connection in use is known to be the wrong one (a master the sentinels no longer name).
    pub(crate) fn rebuild_now(&self) {
        let mut state = self.shared.lock();
        let Ok(runtime) = tokio::runtime::Handle::try_current() else {
            return;
        };
        if state.rebuilding {
            return;
        }
        state.rebuilding = true;
        state.failures = 0;
        drop(state);
        let shared = Arc::clone(&self.shared);
        runtime.spawn(async move { shared.rebuild(Cause::Moved).await });
    }

    /// Checks the connection in use again, within [`Settings::call_deadline`], as its opening
    /// did: one refused now (a policy changed since, `CONFIG SET`) is dropped and the slot
    /// refuses, as after a refused opening (calls fail with the refusal, and the first after
    /// the back-off starts a rebuild). A check that fails otherwise (a timeout, a lost link)
    /// changes nothing: the calls see those.
    pub(crate) async fn recheck(&self) {
        let Some(conn) = self.current() else {
            return;
        };
        let deadline = self.shared.settings.call_deadline;
        let checked = tokio::time::timeout(deadline, self.opener().check(&conn)).await;
        let Ok(Err(error)) = checked else {
            return;
        };
        let Some(refused) = refusal(&error) else {
            return;
        };
        let mut state = self.shared.lock();
        if !state
            .current
            .as_ref()
            .is_some_and(|current| Arc::ptr_eq(current, &conn))
        {
            return;
        }
        state.current = None;
        state.refused = Some(refused);
        let backoff = state.backoff;
        state.not_before = Some(Instant::now() + backoff);
        state.backoff = (backoff * 2).min(self.shared.settings.max_backoff);
        drop(state);
        self.shared.changes.fetch_add(1, Ordering::AcqRel);
        tracing::error!(
            target: "idem_redis",
            %error,
            "the Redis connection in use is refused now: calls fail until it is accepted again"
        );
    }

    /// Forgets the connection in use: the next call opens one (a slot opened lazily, whose
    /// connection must be opened by its own side).
    pub(crate) fn forget(&self) {
        self.shared.lock().current = None;
        self.shared.changes.fetch_add(1, Ordering::AcqRel);
    }

    /// A number that moves whenever the slot's connection may have changed: a failure (after
    /// which the driver may reconnect), a rebuild, a connection forgotten.
    pub(crate) fn changes(&self) -> u64 {
        self.shared.changes.load(Ordering::Acquire)
    }

    /// How many rebuilds replaced the connection so far.
    #[cfg(test)]
    pub(crate) fn rebuilds(&self) -> u64 {
        self.shared.lock().rebuilds
    }

    /// Runs `op` on the slot's connection within [`Settings::call_deadline`], and counts its
    /// outcome: a call past the deadline, failing unavailable, or abandoned before it ended
    /// (the engine drops a store call at `Policy::store_timeout`, which may come first) counts
    /// towards a rebuild.
    pub(crate) async fn call<T, F, Fut>(&self, op: F) -> Result<T, Error>
    where
        F: FnOnce(Arc<O::Conn>) -> Fut,
        Fut: Future<Output = Result<T, Error>>,
    {
        let deadline = self.shared.settings.call_deadline;
        let mut call = Call {
            slot: self,
            conn: None,
            started: Instant::now(),
            ended: false,
        };
        let outcome = tokio::time::timeout(deadline, async {
            let conn = self.conn().await?;
            call.conn = Some(Arc::clone(&conn));
            op(conn).await
        })
        .await;
        call.ended = true;
        match outcome {
            Ok(Ok(value)) => Ok(value),
            Ok(Err(error)) => {
                // No connection could be opened (a slot opened lazily): nothing to count, the
                // next call tries again.
                if counts_against(&error) && call.conn.is_some() {
                    self.failed(call.conn.as_ref());
                }
                Err(error)
            }
            Err(_) => {
                self.failed(call.conn.as_ref());
                Err(Error::store(
                    BACKEND,
                    StoreErrorKind::Unavailable,
                    format!("no answer within {deadline:?}"),
                ))
            }
        }
    }

    /// The connection in use, or one opened now if the slot has none yet (two first calls may
    /// both open one: the first one kept wins, the other is dropped). After a refusal, the
    /// refusal: the first call after the back-off starts a rebuild, none waits for it.
    async fn conn(&self) -> Result<Arc<O::Conn>, Error> {
        {
            let mut state = self.shared.lock();
            if let Some(conn) = state.current.clone() {
                return Ok(conn);
            }
            if let Some((backend, message)) = state.refused.clone() {
                let due = state.not_before.is_none_or(|at| Instant::now() >= at);
                if due && !state.rebuilding {
                    if let Ok(runtime) = tokio::runtime::Handle::try_current() {
                        state.rebuilding = true;
                        let shared = Arc::clone(&self.shared);
                        runtime.spawn(async move { shared.rebuild(Cause::Refused).await });
                    }
                }
                return Err(Error::store(
                    backend,
                    StoreErrorKind::Misconfigured,
                    message,
                ));
            }
        }
        let opened = tokio::time::timeout(self.shared.settings.open_deadline, self.opener().open())
            .await
            .unwrap_or_else(|_| Err(self.shared.open_timed_out()));
        match opened {
            Ok(conn) => Ok(Arc::clone(
                self.shared
                    .lock()
                    .current
                    .get_or_insert_with(|| Arc::new(conn)),
            )),
            Err(error) => {
                if let Some(refused) = refusal(&error) {
                    let mut state = self.shared.lock();
                    if state.current.is_none() {
                        let backoff = state.backoff;
                        state.not_before = Some(Instant::now() + backoff);
                        state.backoff = (backoff * 2).min(self.shared.settings.max_backoff);
                        state.refused = Some(refused);
                    }
                }
                Err(error)
            }
        }
    }

    /// Counts a failure of `conn` (`None`: whichever connection the call used); starts a
    /// rebuild once they are enough, none is running and the back-off has passed. A failure
    /// of a connection already replaced does not count.
    fn failed(&self, conn: Option<&Arc<O::Conn>>) {
        self.shared.changes.fetch_add(1, Ordering::AcqRel);
        let now = Instant::now();
        let mut state = self.shared.lock();
        if let (Some(failed), Some(current)) = (conn, &state.current) {
            if !Arc::ptr_eq(failed, current) {
                return;
            }
        }
        if state
            .last_failure
            .is_some_and(|last| now.duration_since(last) > QUIET)
        {
            state.failures = 0;
            state.backoff = MIN_BACKOFF;
        }
        state.last_failure = Some(now);
        state.failures = state.failures.saturating_add(1);
        let due = state.not_before.is_none_or(|at| now >= at);
        if state.failures < self.shared.settings.threshold || state.rebuilding || !due {
            return;
        }
        let Ok(runtime) = tokio::runtime::Handle::try_current() else {
            return;
        };
        state.rebuilding = true;
        state.failures = 0;
        drop(state);
        let shared = Arc::clone(&self.shared);
        runtime.spawn(async move { shared.rebuild(Cause::Failing).await });
    }
}

/// Why a connection is rebuilt, as its log says.
#[derive(Debug, Clone, Copy)]
enum Cause {
    /// Its calls kept failing unavailable.
    Failing,
    /// It is on a master the sentinels no longer name.
    Moved,
    /// The slot has none: the last one opened was refused.
    Refused,
}

impl<O: Open> Shared<O> {
    fn lock(&self) -> MutexGuard<'_, State<O::Conn>> {
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    fn open_timed_out(&self) -> Error {
        Error::store(
            BACKEND,
            StoreErrorKind::Unavailable,
            format!("no connection within {:?}", self.settings.open_deadline),
        )
    }

    /// Opens a new connection and puts it in place of the one in use (dropped once its last
    /// call ends); whatever came of it, the next rebuild waits for the back-off.
    async fn rebuild(&self, cause: Cause) {
        let _ends = RebuildEnds(self);
        let opened = tokio::time::timeout(self.settings.open_deadline, self.opener.open())
            .await
            .unwrap_or_else(|_| Err(self.open_timed_out()));
        let mut state = self.lock();
        state.rebuilding = false;
        let backoff = state.backoff;
        state.not_before = Some(Instant::now() + backoff);
        state.backoff = (backoff * 2).min(self.settings.max_backoff);
        let replaced = match opened {
            Ok(conn) => {
                state.current = Some(Arc::new(conn));
                state.refused = None;
                self.changes.fetch_add(1, Ordering::AcqRel);
                state.rebuilds += 1;
                state.failures = 0;
                Ok(state.rebuilds)
            }
            Err(error) => {
                // Refused: the connection in use is not used either (it is the one that kept
                // failing, or on a master the sentinels no longer name); calls get the refusal.
                if let Some(refused) = refusal(&error) {
                    state.current = None;
                    state.refused = Some(refused);
                    self.changes.fetch_add(1, Ordering::AcqRel);
                }
                Err(error)
            }
        };
        drop(state);
        match replaced {
            Ok(rebuilds) if matches!(cause, Cause::Moved) => tracing::warn!(
                target: "idem_redis",
                rebuilds,
                "the sentinels name another master: the Redis connection replaced by a new one"
            ),
            Ok(rebuilds) if matches!(cause, Cause::Refused) => tracing::warn!(
                target: "idem_redis",
                rebuilds,
                "a Redis connection accepted after one was refused"
            ),
            Ok(rebuilds) => tracing::warn!(
                target: "idem_redis",
                rebuilds,
                "the Redis connection kept failing unavailable: replaced by a new one"
            ),
            Err(error) => tracing::warn!(
                target: "idem_redis",
                %error,
                retry_in = ?backoff,
                "the Redis connection kept failing unavailable and a new one could not be opened"
            ),
        }
    }
}

/// One call in flight: dropped before it ended, after [`Settings::abandoned_after`], it counts
/// as a failure of its connection.
struct Call<'a, O: Open> {
    slot: &'a Supervised<O>,
    conn: Option<Arc<O::Conn>>,
    started: Instant,
    ended: bool,
}

impl<O: Open> Drop for Call<'_, O> {
    fn drop(&mut self) {
        let slow = self.started.elapsed() >= self.slot.shared.settings.abandoned_after;
        if !self.ended && slow && self.conn.is_some() {
            self.slot.failed(self.conn.as_ref());
        }
    }
}

/// Marks the rebuild over however it ends: a panic in the driver or a runtime shutting down
/// drops the task, and a slot left "rebuilding" would never rebuild again.
struct RebuildEnds<'a, O: Open>(&'a Shared<O>);

impl<O: Open> Drop for RebuildEnds<'_, O> {
    fn drop(&mut self) {
        self.0.lock().rebuilding = false;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};

    /// Opens numbered connections, slowly if asked, or fails.
    struct Fake {
        opened: AtomicUsize,
        fail: AtomicBool,
        refuse: AtomicBool,
        delay: Duration,
    }

    impl Fake {
        fn new(delay: Duration) -> Arc<Self> {
            Arc::new(Self {
                opened: AtomicUsize::new(0),
                fail: AtomicBool::new(false),
                refuse: AtomicBool::new(false),
                delay,
            })
        }
    }

    impl Open for Fake {
        type Conn = usize;

        async fn open(&self) -> Result<usize, Error> {
            tokio::time::sleep(self.delay).await;
            if self.fail.load(Ordering::SeqCst) {
                return Err(unavailable());
            }
            if self.refuse.load(Ordering::SeqCst) {
                return Err(Error::store(
                    BACKEND,
                    StoreErrorKind::Misconfigured,
                    "maxmemory-policy is allkeys-lru",
                ));
            }
            Ok(self.opened.fetch_add(1, Ordering::SeqCst) + 1)
        }
    }

    fn unavailable() -> Error {
        Error::store(BACKEND, StoreErrorKind::Unavailable, "down")
    }

    const SETTINGS: Settings = Settings {
        threshold: 3,
        call_deadline: Duration::from_millis(500),
        open_deadline: Duration::from_millis(500),
        abandoned_after: Duration::from_millis(10),
        max_backoff: Duration::from_millis(400),
    };

    async fn fail_on(slot: &Supervised<Fake>) -> usize {
        let mut used = 0;
        let _ = slot
            .call(|conn| {
                used = *conn;
                async { Err::<(), _>(unavailable()) }
            })
            .await;
        used
    }

    async fn used(slot: &Supervised<Fake>) -> usize {
        slot.call(|conn| async move { Ok(*conn) })
            .await
            .expect("a connection")
    }

    /// C13: many callers failing at once start one rebuild; its connection replaces the old
    /// one, which is dropped once replaced.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn c13_many_failures_at_once_rebuild_once_and_the_old_connection_is_dropped() {
        let fake = Fake::new(Duration::from_millis(50));
        let slot = Supervised::new(0, Arc::clone(&fake), SETTINGS);
        let old = Arc::downgrade(&slot.shared.lock().current.clone().expect("a connection"));
        let failing: Vec<_> = (0..64)
            .map(|_| {
                let slot = slot.clone();
                tokio::spawn(async move { fail_on(&slot).await })
            })
            .collect();
        for task in failing {
            assert_eq!(
                task.await.expect("joined"),
                0,
                "callers go on with the old one"
            );
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
        assert_eq!(fake.opened.load(Ordering::SeqCst), 1, "one rebuild");
        assert_eq!(slot.rebuilds(), 1);
        assert_eq!(used(&slot).await, 1, "the new connection is in use");
        assert!(old.upgrade().is_none(), "the old connection was dropped");
    }

    /// C13: a caller never waits for a rebuild: it goes on with the connection in use.
    #[tokio::test]
    async fn c13_a_rebuild_in_progress_never_holds_a_caller() {
        let fake = Fake::new(Duration::from_secs(5));
        let slot = Supervised::new(0, Arc::clone(&fake), SETTINGS);
        for _ in 0..3 {
            fail_on(&slot).await;
        }
        let asked = Instant::now();
        assert_eq!(used(&slot).await, 0);
        assert!(
            asked.elapsed() < Duration::from_millis(50),
            "{:?}",
            asked.elapsed()
        );
    }

    /// C13: a rebuild that fails backs off: failures within the delay start none; the first
    /// failure after it starts the next, which replaces the connection.
    #[tokio::test]
    async fn c13_a_failed_rebuild_backs_off_then_the_next_failure_retries() {
        let fake = Fake::new(Duration::ZERO);
        fake.fail.store(true, Ordering::SeqCst);
        let slot = Supervised::new(0, Arc::clone(&fake), SETTINGS);
        for _ in 0..3 {
            fail_on(&slot).await;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
        assert!(!slot.shared.lock().rebuilding, "the failed rebuild ended");
        fake.fail.store(false, Ordering::SeqCst);
        for _ in 0..6 {
            fail_on(&slot).await;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
        assert_eq!(slot.rebuilds(), 0, "no rebuild within the back-off");
        tokio::time::sleep(MIN_BACKOFF).await;
        for _ in 0..3 {
            fail_on(&slot).await;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
        assert_eq!(
            slot.rebuilds(),
            1,
            "the next failure after the back-off rebuilt"
        );
        assert_eq!(used(&slot).await, 1);
    }

    /// C13: a call that never ends is cut off at the call deadline, and counts as a failure.
    #[tokio::test]
    async fn c13_a_call_without_an_answer_ends_at_the_deadline_and_counts() {
        let fake = Fake::new(Duration::ZERO);
        let slot = Supervised::new(0, Arc::clone(&fake), SETTINGS);
        let asked = Instant::now();
        let error = slot
            .call(|_| std::future::pending::<Result<(), Error>>())
            .await
            .expect_err("no answer");
        assert!(counts_against(&error), "{error}");
        assert!(asked.elapsed() < SETTINGS.call_deadline * 2);
        assert_eq!(slot.shared.lock().failures, 1);
    }

    /// C13: a call abandoned before it answered (the engine's own store timeout came first)
    /// counts against its connection; one abandoned at once (a renewal whose execution ended)
    /// does not.
    #[tokio::test]
    async fn c13_a_call_abandoned_before_it_answered_counts() {
        let fake = Fake::new(Duration::ZERO);
        let slot = Supervised::new(0, Arc::clone(&fake), SETTINGS);
        let abandoned = tokio::time::timeout(
            Duration::from_millis(20),
            slot.call(|_| std::future::pending::<Result<(), Error>>()),
        )
        .await;
        assert!(abandoned.is_err(), "cut off by the caller");
        assert_eq!(slot.shared.lock().failures, 1);
        let at_once = tokio::time::timeout(
            Duration::from_millis(1),
            slot.call(|_| std::future::pending::<Result<(), Error>>()),
        )
        .await;
        assert!(at_once.is_err(), "cut off by the caller");
        assert_eq!(
            slot.shared.lock().failures,
            1,
            "abandoned at once: not counted"
        );
        assert_eq!(used(&slot).await, 0, "an answer counts nothing");
        assert_eq!(slot.shared.lock().failures, 1);
    }

    /// C13: a connection known to be on the wrong master (the sentinels name another) is
    /// rebuilt at once, with no failure and within the back-off; a lazy slot's forgotten
    /// connection is opened again by its next call.
    #[tokio::test]
    async fn c13_a_rebuild_now_replaces_the_connection_without_failures() {
        let fake = Fake::new(Duration::ZERO);
        let slot = Supervised::new(0, Arc::clone(&fake), SETTINGS);
        slot.rebuild_now();
        tokio::time::sleep(Duration::from_millis(20)).await;
        assert_eq!(used(&slot).await, 1, "replaced without a failure");
        slot.rebuild_now();
        tokio::time::sleep(Duration::from_millis(20)).await;
        assert_eq!(used(&slot).await, 2, "the back-off does not hold it");
        let lazy = Supervised::lazy(Arc::clone(&fake), SETTINGS);
        assert_eq!(used(&lazy).await, 3);
        lazy.forget();
        assert!(lazy.current().is_none());
        assert_eq!(used(&lazy).await, 4, "opened again by the next call");
    }

    /// C7, C13: a connection the opener refuses (a Redis that may evict records) is never used:
    /// a rebuild refused drops the one in use, calls fail misconfigured at once (none waits for
    /// an opening, none opens one), and the first call after the back-off starts a rebuild,
    /// whose accepted connection is used again. A lazy slot's refused first opening alike.
    #[tokio::test]
    async fn c07_a_refused_connection_is_never_used_and_a_later_rebuild_retries() {
        let fake = Fake::new(Duration::ZERO);
        let slot = Supervised::new(0, Arc::clone(&fake), SETTINGS);
        fake.refuse.store(true, Ordering::SeqCst);
        slot.rebuild_now();
        tokio::time::sleep(Duration::from_millis(20)).await;
        assert!(slot.current().is_none(), "the connection in use is dropped");
        for _ in 0..5 {
            let asked = Instant::now();
            let error = slot
                .call(|conn| async move { Ok(*conn) })
                .await
                .expect_err("refused");
            let kind = error.as_store().map(idem_core::StoreError::kind);
            assert_eq!(kind, Some(StoreErrorKind::Misconfigured), "{error}");
            assert!(error.to_string().contains("allkeys-lru"), "{error}");
            assert!(asked.elapsed() < Duration::from_millis(50));
        }
        assert_eq!(slot.rebuilds(), 0);
        fake.refuse.store(false, Ordering::SeqCst);
        tokio::time::sleep(MIN_BACKOFF).await;
        let _ = slot.call(|conn| async move { Ok(*conn) }).await;
        tokio::time::sleep(Duration::from_millis(20)).await;
        assert_eq!(
            slot.rebuilds(),
            1,
            "the first call after the back-off rebuilt"
        );
        assert_eq!(used(&slot).await, 1);

        fake.refuse.store(true, Ordering::SeqCst);
        let lazy = Supervised::lazy(Arc::clone(&fake), SETTINGS);
        assert!(lazy.call(|conn| async move { Ok(*conn) }).await.is_err());
        assert!(lazy.current().is_none());
        fake.refuse.store(false, Ordering::SeqCst);
        tokio::time::sleep(MIN_BACKOFF).await;
        let _ = lazy.call(|conn| async move { Ok(*conn) }).await;
        tokio::time::sleep(Duration::from_millis(20)).await;
        assert_eq!(used(&lazy).await, 2, "accepted after the back-off");
    }

    /// A slot opened lazily opens on its first call; a failure that is not unavailable (a
    /// refusal, a lost lease) never counts against the connection.
    #[tokio::test]
    async fn a_lazy_slot_opens_on_first_use_and_other_errors_do_not_count() {
        let fake = Fake::new(Duration::ZERO);
        let slot = Supervised::lazy(Arc::clone(&fake), SETTINGS);
        assert_eq!(used(&slot).await, 1);
        assert_eq!(used(&slot).await, 1, "kept");
        for _ in 0..5 {
            let _ = slot
                .call(|_| async { Err::<(), _>(Error::LeaseLost) })
                .await;
        }
        assert_eq!(slot.shared.lock().failures, 0);
    }
}
