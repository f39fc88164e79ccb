//! Which connection a call uses: the store's, or on the engine's heartbeat thread one opened
//! there (C9); each in a [`Supervised`] slot of its own, which replaces a connection that keeps
//! failing (C13).
//!
//! The store's connection is driven by a task of the runtime it was opened on, usually the
//! application's. Handlers that block every worker of that runtime would leave the engine's
//! renewals, made on the heartbeat thread's own runtime, waiting on a socket nobody reads, and
//! another instance would take over a live execution. So calls made on the heartbeat thread
//! use a connection opened lazily by that thread, with the same client and settings, which its
//! runtime drives. A rebuild runs on the runtime of the call that started it, so each slot's
//! connection stays driven by its own side.

use crate::conn::{Conn, Node, Opener};
use crate::error::store_error;
use crate::supervised::{Open, Settings, Supervised};
use idem_core::Error;
use redis::{Cmd, Pipeline, ScriptInvocation, Value};
use std::future::Future;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, OnceLock, Weak};
use std::time::{Duration, Instant};

/// How many unavailable failures of the store's connection start a rebuild: a few, so one
/// slow call never does, and a burst of them (every caller of a wedged connection) at once.
const STORE_THRESHOLD: u32 = 3;

/// The heartbeat's connection is rebuilt after its first unavailable failure: it carries a
/// few renewals a lease, and a lease cannot wait for three of them to fail.
const BEAT_THRESHOLD: u32 = 1;

impl Open for Opener {
    type Conn = Conn;

    fn open(&self) -> impl Future<Output = Result<Conn, Error>> + Send {
        Opener::open(self)
    }

    fn check(&self, conn: &Conn) -> impl Future<Output = Result<(), Error>> + Send {
        Opener::check(self, conn)
    }
}

/// How often the connections in use are checked again for a Redis that may evict records
/// (`RedisStoreBuilder::allow_eviction`): a policy changed while connected is refused within
/// this, plus one check's deadline.
pub(crate) const RECHECK_EVERY: Duration = Duration::from_secs(5);

/// The store's timeouts, as the slots apply them.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Timeouts {
    pub(crate) response: Duration,
    pub(crate) connection: Duration,
}

impl Timeouts {
    /// A call waits at most one connection (when it must reconnect) and one response: past
    /// that, the slot cuts it off, whatever the driver does; one abandoned after half a
    /// response timeout counts as failed. Rebuilds back off up to the connection timeout (at
    /// most 2 s): no longer than opening a connection may take anyway.
    fn settings(self, threshold: u32) -> Settings {
        Settings {
            threshold,
            call_deadline: self.connection + self.response,
            open_deadline: self.connection + self.response,
            abandoned_after: self.response / 2,
            max_backoff: self.connection,
        }
    }
}

pub(crate) struct Connections {
    /// The store's connection, for every call but the heartbeat thread's.
    store: Supervised<Opener>,
    /// The heartbeat's connection, opened by the first call made there.
    beat: Supervised<Opener>,
    /// The connection of completions that wait for a replica (`WAIT`), opened by the first:
    /// Redis serves a connection's commands in order, so a `WAIT` no replica acknowledges
    /// would hold every answer queued behind it on the store's connection (C5).
    waits: Supervised<Opener>,
    /// Whether a task re-checks the connections in use ([`Connections::spawn_rechecks`]).
    rechecking: AtomicBool,
    /// The re-check task that is to run: one that finds another number here ends.
    recheck_epoch: AtomicU64,
    /// When that task last showed it runs, in milliseconds since `born`: one silent for
    /// `recheck_stale` (its runtime kept but no longer driven) is replaced by the next call.
    recheck_tick: AtomicU64,
    recheck_stale: Duration,
    born: Instant,
    /// These connections, for a re-check task started again by a call.
    this: OnceLock<Weak<Connections>>,
}

/// Marks the re-checks stopped when their task (of this epoch) is dropped (its runtime
/// stopped), run or not.
struct Rechecking(Weak<Connections>, u64);

impl Drop for Rechecking {
    fn drop(&mut self) {
        if let Some(conns) = self.0.upgrade() {
            if conns.recheck_epoch.load(Ordering::Acquire) == self.1 {
                conns.rechecking.store(false, Ordering::Release);
            }
        }
    }
}

/// Whether `conn` was opened on another master than `host:port` the sentinels named.
fn elsewhere(conn: Option<Arc<Conn>>, host: &str, port: u16) -> bool {
    conn.as_deref()
        .and_then(Conn::sentinel_master)
        .is_some_and(|address| address.to_string() != format!("{host}:{port}"))
}

impl Connections {
    pub(crate) fn new(conn: Conn, opener: Opener, timeouts: Timeouts) -> Self {
        let opener = Arc::new(opener);
        Self {
            store: Supervised::new(
                conn,
                Arc::clone(&opener),
                timeouts.settings(STORE_THRESHOLD),
            ),
            beat: Supervised::lazy(Arc::clone(&opener), timeouts.settings(BEAT_THRESHOLD)),
            waits: Supervised::lazy(opener, timeouts.settings(STORE_THRESHOLD)),
            rechecking: AtomicBool::new(false),
            recheck_epoch: AtomicU64::new(0),
            recheck_tick: AtomicU64::new(0),
            // A tick at each wake-up and after each slot's check (each within its deadline).
            recheck_stale: RECHECK_EVERY * 2 + timeouts.connection + timeouts.response,
            born: Instant::now(),
            this: OnceLock::new(),
        }
    }

    /// Checks every connection in use again, every [`RECHECK_EVERY`], on a task of the current
    /// runtime, while `conns` lives (see [`Supervised::recheck`]); nothing when the opener
    /// checks nothing (eviction allowed) or there is no runtime. A task that stopped with its
    /// runtime is started again by the next call, on the caller's.
    pub(crate) fn spawn_rechecks(conns: &Arc<Connections>) {
        let _ = conns.this.set(Arc::downgrade(conns));
        conns.keep_rechecking();
    }

    /// Starts the re-check task on the current runtime unless one runs: one that stopped with
    /// its runtime, or that has not run for a while (its runtime kept but no longer driven), is
    /// replaced; the one replaced ends if it ever runs again.
    fn keep_rechecking(&self) {
        if !self.store.opener().refuses_eviction() || self.recheck_runs() {
            return;
        }
        let Ok(runtime) = tokio::runtime::Handle::try_current() else {
            return;
        };
        let Some(conns) = self.this.get().cloned() else {
            return;
        };
        let seen = self.recheck_epoch.load(Ordering::Acquire);
        if self.recheck_runs() {
            return;
        }
        let mine = seen.wrapping_add(1);
        let claimed =
            self.recheck_epoch
                .compare_exchange(seen, mine, Ordering::AcqRel, Ordering::Acquire);
        if claimed.is_err() {
            return; // another call started one just now
        }
        self.recheck_ticked();
        self.rechecking.store(true, Ordering::Release);
        // Moved into the task: dropped with it, polled or not.
        let running = Rechecking(conns.clone(), mine);
        drop(runtime.spawn(async move {
            let _running = running;
            loop {
                tokio::time::sleep(RECHECK_EVERY).await;
                let Some(conns) = conns.upgrade() else {
                    return;
                };
                for slot in [&conns.store, &conns.beat, &conns.waits] {
                    if conns.recheck_epoch.load(Ordering::Acquire) != mine {
                        return; // replaced while it did not run
                    }
                    conns.recheck_ticked();
                    slot.recheck().await;
                }
            }
        }));
    }

    /// Whether a re-check task runs and has shown it lately.
    fn recheck_runs(&self) -> bool {
        if !self.rechecking.load(Ordering::Acquire) {
            return false;
        }
        let tick = Duration::from_millis(self.recheck_tick.load(Ordering::Acquire));
        self.born.elapsed().saturating_sub(tick) < self.recheck_stale
    }

    /// The re-check task shows it runs.
    fn recheck_ticked(&self) {
        let now = u64::try_from(self.born.elapsed().as_millis()).unwrap_or(u64::MAX);
        self.recheck_tick.store(now, Ordering::Release);
    }

    /// A number that moves whenever a connection may have changed (`Store::generation`).
    pub(crate) fn generation(&self) -> u64 {
        self.store
            .changes()
            .wrapping_add(self.beat.changes())
            .wrapping_add(self.waits.changes())
    }

    pub(crate) fn is_cluster(&self) -> bool {
        self.store.opener().is_cluster()
    }

    /// The sentinels name `host:port` as the master (`crate::follow`): the store's connection,
    /// if it is on another master, is rebuilt at once (callers go on with it until the new one
    /// is in place); the heartbeat's is forgotten, so its next call opens one on its thread.
    pub(crate) fn follow(&self, host: &str, port: u16) {
        if self.elsewhere(host, port) {
            self.store.rebuild_now();
        }
        if elsewhere(self.beat.current(), host, port) {
            self.beat.forget();
        }
        if elsewhere(self.waits.current(), host, port) {
            self.waits.forget();
        }
    }

    /// Whether the store's connection is on another master than `host:port`.
    pub(crate) fn elsewhere(&self, host: &str, port: u16) -> bool {
        elsewhere(self.store.current(), host, port)
    }

    /// Runs `op` on the connection for a call made here: the heartbeat's on the engine's
    /// heartbeat thread (opened now if there is none), the store's everywhere else.
    async fn on<T, F, Fut>(&self, op: F) -> Result<T, Error>
    where
        F: FnOnce(Arc<Conn>) -> Fut,
        Fut: Future<Output = Result<T, Error>>,
    {
        self.keep_rechecking();
        if idem_core::store::on_heartbeat_thread() {
            self.beat.call(op).await
        } else {
            self.store.call(op).await
        }
    }

    /// See [`Conn::invoke`].
    pub(crate) async fn invoke(&self, invocation: &ScriptInvocation<'_>) -> Result<Value, Error> {
        self.on(|conn| async move { conn.invoke(invocation).await })
            .await
    }

    /// Runs `invocation` (a completion), then, if it answers `1` (landed), `WAIT`s up to
    /// `within()` (taken once it landed) for a replica ([`Conn::wait_for_replica`]), both on the
    /// completions' own connection, so that the `WAIT` covers the completion and holds no
    /// answer behind it. Returns the script's answer and how many replicas acknowledged
    /// (`None`: no wait, `within()` under a millisecond).
    pub(crate) async fn invoke_then_wait(
        &self,
        invocation: &ScriptInvocation<'_>,
        key: &str,
        within: impl FnOnce() -> Duration,
    ) -> Result<(Value, Option<i64>), Error> {
        self.waits
            .call(|conn| async move {
                let reply = conn.invoke(invocation).await?;
                if reply != Value::Int(1) {
                    return Ok((reply, None));
                }
                let within = within();
                if within < Duration::from_millis(1) {
                    return Ok((reply, None));
                }
                let acknowledged = conn.wait_for_replica(key, within).await?;
                Ok((reply, Some(acknowledged)))
            })
            .await
    }

    /// See [`Conn::nodes`].
    pub(crate) async fn nodes(&self) -> Result<Vec<Node>, Error> {
        self.on(|conn| async move { conn.nodes().await }).await
    }

    /// See [`Conn::query_on`].
    pub(crate) async fn query_on(&self, node: &Node, cmd: &Cmd) -> Result<Value, Error> {
        self.on(|conn| async move { conn.query_on(node, cmd).await })
            .await
    }

    /// `PUBLISH channel payload` (an announcement, or a change feed's ping); on a Cluster the
    /// node that takes it broadcasts it to every node.
    pub(crate) async fn publish(&self, channel: &str, payload: &str) -> Result<(), Error> {
        let mut cmd = redis::cmd("PUBLISH");
        cmd.arg(channel).arg(payload);
        let cmd = &cmd;
        self.on(|conn| async move { conn.query::<i64>(cmd).await.map_err(store_error) })
            .await
            .map(drop)
    }

    /// See [`Conn::pipeline`].
    pub(crate) async fn pipeline(&self, pipe: &Pipeline) -> Result<Vec<Value>, Error> {
        self.on(|conn| async move { conn.pipeline(pipe).await })
            .await
    }

    /// See [`Conn::pipeline_on`].
    pub(crate) async fn pipeline_on(
        &self,
        node: &Node,
        pipe: Pipeline,
    ) -> Result<Vec<Value>, Error> {
        self.on(|conn| async move { conn.pipeline_on(node, pipe).await })
            .await
    }
}
