//! `PgStore`: the PostgreSQL store, its builder, and its `Store` implementation.

mod feed;

use crate::config::{validate_identifier, validate_table_name, Isolation, PgConfig};
use crate::connections::{Connections, PERMIT_HELD};
use crate::feed_settings::{self, ListenerOptions, ListenerTarget};
use crate::follow_pool;
use crate::gate::Gate;
use crate::hosts::Hosts;
use crate::hosts_url;
use crate::ops::Ops;
use crate::params::StatementMode;
use crate::session;
use crate::sql::Statements;
use idem_core::store::Deadline;
use idem_core::store::Reconciliation;
use idem_core::store::{
    async_trait, digest_to_hex, Acquire, Capabilities, Changes, Claim, Completion, Lease, Record,
    Reserved, Resolution,
};
use idem_core::Operation;
use idem_core::{Error, RecordId, Request, Store, Timestamp};
use idem_ops::feed::FeedSettings;
use idem_ops::Holder;
use idem_ops::{Inspected, ListQuery, Operator, Page, Stats};
use sqlx::postgres::{PgConnectOptions, PgPoolOptions};
use sqlx::{PgConnection, PgPool};
use std::sync::atomic::AtomicBool;
use std::sync::Arc;
use std::time::Duration;

/// An idem [`Store`] in PostgreSQL, with completion inside the caller's transaction.
///
/// - **One round trip per answer.** A fresh key is reserved, and a replay, an in-flight
///   duplicate or a mismatch is answered, by one statement (`sql/reserve.sql`) that returns the
///   current record or inserts a fresh one; the decision is the core's. It reads without locks,
///   so a duplicate never waits for a business transaction (C5).
/// - **Completion in your transaction** (C6): [`complete_in`](Self::complete_in) writes the
///   engine's [`Completion`] on your `&mut PgConnection` (`&mut *tx`), so the effect and the
///   completion commit or vanish together; the closure form is
///   [`PgIdempotency::run_in_transaction`](crate::PgIdempotency::run_in_transaction).
/// - **Time from the server** (C11): every deadline is computed by PostgreSQL's
///   `clock_timestamp()`, so application servers with skewed clocks agree on every lease.
/// - **Deadlines on the server** (C13): every statement of the store runs under a statement and
///   a lock deadline, below the engine's bound on each call, set so that they hold behind a
///   pooler in transaction mode too; the effect's transaction under an idle and a total
///   deadline. A connection of the store's own cut off mid-statement is reused once idle again
///   within its host's share of the acquire timeout (never one an effect was cut off on
///   while it ran), else closed and replaced; one of the pool is closed and replaced. See
///   [`PgStoreBuilder::statement_timeout`] and the settings after it.
/// - **No hidden round trips.** The store runs its statements, and the effects' transactions of
///   [`run_in_transaction`](crate::PgIdempotency::run_in_transaction), on connections of its
///   own, taken and given back without the ping sqlx's pool sends (on return always, on
///   acquire by default): a fresh key costs 5 round trips (reserve; BEGIN, the effect's
///   statement, completion, COMMIT), an answer 1. A store built over your pool
///   ([`PgStoreBuilder::pool`]) runs the effects on that pool, in its sessions.
/// - **A change feed** (C5): duplicates that wait for their original
///   ([`Policy::wait_in_flight`](idem_core::Policy::wait_in_flight)) in other processes are woken by
///   its `pg_notify` announcements, through a `LISTEN` on a session of its own that finds its
///   own silence and reconnects by itself. See [`PgStoreBuilder::channel`] and the settings
///   after it (behind PgBouncer in transaction mode, [`PgStoreBuilder::listener_url`]).
/// - **Failover** (C13): given a primary and its standbys (libpq's multi-host URL, see
///   [`PgStoreBuilder::connect`]), it follows the one that accepts writes without a restart,
///   its pool and its change feed with it.
///
/// Cloning is cheap: clones share the pool.
///
/// ```no_run
/// use idem_postgres::PgStore;
/// # async fn demo() -> Result<(), idem_core::Error> {
/// let store = PgStore::connect("postgres://app@localhost/payments").await?;
/// store.migrate().await?;
/// # Ok(())
/// # }
/// ```
#[derive(Debug, Clone)]
pub struct PgStore {
    pub(crate) inner: Arc<Inner>,
}

#[derive(Debug)]
pub(crate) struct Inner {
    pub(crate) pool: PgPool,
    pub(crate) conns: Connections,
    /// Connections for the calls made on the engine's heartbeat thread (renewals): opened
    /// there, so that their sockets are driven by the heartbeat's own runtime, which the
    /// application's handlers cannot block (C9).
    pub(crate) beat_conns: Connections,
    /// Connections for the effects' transactions (`run_in_transaction`): like the store's own,
    /// taken and given back without a round trip, but with the session the database, the role
    /// and the connect options give (the effect's statements run under your settings, not the
    /// store's deadlines); given back only after a transaction that ended cleanly.
    pub(crate) tx_conns: Connections,
    /// Built over the application's pool ([`PgStoreBuilder::pool`]): the effects' transactions
    /// run on that pool, in the sessions it sets up (`crate::effect_connection`).
    pub(crate) effects_on_pool: bool,
    pub(crate) ops: Ops,
    pub(crate) config: PgConfig,
    /// The change feed's settings (`store/feed.rs`).
    pub(crate) feed: FeedSettings,
    /// Where the change feed's listener connects.
    pub(crate) listener: ListenerOptions,
    /// How long connecting may take (the acquire timeout); setting a new connection up may
    /// take its host's share of it again (`crate::connections`).
    pub(crate) connect_within: Duration,
    /// Where the connections go (`crate::hosts`).
    pub(crate) hosts: Arc<Hosts>,
    /// Whether reservations read first ([`PgStoreBuilder::read_first`]).
    pub(crate) read_first: bool,
}

impl Drop for Inner {
    /// The pool's hook holds the hosts, which point the pool: the store's end breaks the cycle.
    fn drop(&mut self) {
        self.hosts.unfollow();
    }
}

/// Settings for [`PgStore`]; see [`PgStore::builder`].
///
/// ```no_run
/// use idem_postgres::{Isolation, PgStore, StatementMode};
/// # async fn demo() -> Result<(), idem_core::Error> {
/// let store = PgStore::builder()
///     .schema("billing")
///     .table("idem_records")
///     .max_connections(32)
///     .statements(StatementMode::Simple) // behind PgBouncer in transaction mode
///     .isolation(Isolation::Serializable)
///     .connect("postgres://app@pgbouncer:6432/payments")
///     .await?;
/// # Ok(())
/// # }
/// ```
#[derive(Debug, Clone)]
#[must_use]
pub struct PgStoreBuilder {
    config: PgConfig,
    max_connections: u32,
    acquire_timeout: Duration,
    feed: FeedSettings,
    /// Where the change feed's listener connects.
    listener: ListenerTarget,
    /// The holder reservations record.
    holder: Holder,
    /// Whether a reservation reads first ([`read_first`](Self::read_first)).
    read_first: bool,
}

impl PgStoreBuilder {
    /// Whether a reservation may first read its record by primary key (default true): a
    /// replay, an in-flight duplicate or a mismatch then costs one plain `SELECT` (about 1.7
    /// times the answers a second), and a fresh key that `SELECT` before its reservation
    /// statement (a round trip more). The engine reads first only while most of its recent
    /// reservations were answers (retry storms, a webhook inbox), else reserves with one
    /// statement ([`Capabilities::read_first`](idem_core::store::Capabilities::read_first));
    /// `false`: always one statement (docs/benchmarks.md).
    ///
    /// ```
    /// let _builder = idem_postgres::PgStore::builder().read_first(true);
    /// ```
    pub fn read_first(mut self, read_first: bool) -> Self {
        self.read_first = read_first;
        self
    }

    /// The schema of the table (default `public`), checked by
    /// [`validate_identifier`](crate::validate_identifier).
    pub fn schema(mut self, schema: &str) -> Self {
        self.config.schema = schema.to_owned();
        self
    }

    /// The table (default `idem_records`), checked by
    /// [`validate_identifier`](crate::validate_identifier) and at most 47 bytes (the names
    /// derived from it, its indexes and the audit trail of records in doubt,
    /// `<table>_reconciliations`, must fit PostgreSQL's 63). Put it in the schema of your
    /// business tables: the completion shares their transactions.
    pub fn table(mut self, table: &str) -> Self {
        self.config.table = table.to_owned();
        self
    }

    /// How statements are sent (default [`StatementMode::Prepared`]); behind a pooler in
    /// transaction mode, [`StatementMode::Simple`].
    pub fn statements(mut self, mode: StatementMode) -> Self {
        self.config.statements = mode;
        self
    }

    /// The isolation level of the transactions `run_in_transaction` opens (default
    /// [`Isolation::ReadCommitted`]).
    pub fn isolation(mut self, isolation: Isolation) -> Self {
        self.config.isolation = isolation;
        self
    }

    /// The longest one of the store's statements may run on the server (PostgreSQL's
    /// `statement_timeout`; default 4 s, below the engine's default
    /// [`store_timeout`](idem_core::Policy::store_timeout) of 5 s): past it the server cancels
    /// it and the call is [`StoreErrorKind::Unavailable`](idem_core::StoreErrorKind::Unavailable),
    /// a 503. It is set in each statement's own transaction, so it holds behind a pooler in
    /// transaction mode too. Your effect's own statements are not bounded by it.
    ///
    /// ```
    /// use idem_postgres::PgStore;
    /// use std::time::Duration;
    /// let builder = PgStore::builder()
    ///     .statement_timeout(Duration::from_secs(2))
    ///     .lock_timeout(Duration::from_millis(1500))
    ///     .idle_in_transaction_timeout(Duration::from_secs(1))
    ///     .transaction_timeout(Duration::from_secs(10));
    /// # let _ = builder;
    /// ```
    pub fn statement_timeout(mut self, timeout: Duration) -> Self {
        self.config.deadlines.statement = timeout;
        self
    }

    /// The longest a completion or a release waits for the record's row while another
    /// transaction holds it (PostgreSQL's `lock_timeout`; default 3 s); a renewal waits a
    /// quarter of it and gives up for that beat. Past it a completion is retried by the engine
    /// within the lease (C8), a completion inside the effect's transaction rolls the
    /// transaction back (a 503, the key released when the row is free again, else left to its
    /// lease), and a release leaves the record to its lease. The completion inside your
    /// transaction sets it for the rest of that transaction.
    pub fn lock_timeout(mut self, timeout: Duration) -> Self {
        self.config.deadlines.lock = timeout;
        self
    }

    /// The longest the transaction `run_in_transaction` opens may sit idle between statements
    /// (PostgreSQL's `idle_in_transaction_session_timeout`, set for that transaction only;
    /// default 30 s, the transaction timeout). A client that vanished mid-transaction (a
    /// half-open connection) leaves a session the server believes in, holding the record's row;
    /// past this deadline the server ends it and the transaction rolls back. Below
    /// [`lock_timeout`](Self::lock_timeout) the release that follows such a failure outwaits it
    /// and the retry runs at once; above it (the default) the record waits for its lease.
    /// Keep it at or above [`transaction_timeout`](Self::transaction_timeout) if your effects
    /// pause between statements (a provider's call inside the transaction): the server's
    /// deadline ends such an effect with a broken connection, which releases its key, where
    /// the transaction timeout keeps it with an unknown outcome (C8). The completion inside
    /// your own transaction ([`complete_in`](PgStore::complete_in)) sets it for the rest of
    /// that transaction, which holds the record's row until its COMMIT: a process frozen
    /// there is ended by the server, and its record taken over after its lease (C9).
    pub fn idle_in_transaction_timeout(mut self, timeout: Duration) -> Self {
        self.config.deadlines.idle_in_transaction = timeout;
        self
    }

    /// The longest the effect of
    /// [`run_in_transaction`](crate::PgIdempotency::run_in_transaction) may run, from its
    /// `BEGIN` to its completion (default 30 s), measured by the process. The effect's own
    /// statements have no other deadline on the client's side, and a connection whose server
    /// vanished (a partition, a failover whose FIN was lost) never answers them: sqlx sets no
    /// TCP keepalive on its sockets. Past it the effect is abandoned before any COMMIT was
    /// sent (nothing committed) and its connection is closed; what the effect did outside the
    /// database (a provider's call) is unknown, so the key is kept with a stored 500 (outcome
    /// unknown, C8) and the caller gets `RunError::InDoubt` (a 500 `outcome-pending`). Set it
    /// above the longest effect you run.
    pub fn transaction_timeout(mut self, timeout: Duration) -> Self {
        self.config.deadlines.transaction = timeout;
        self
    }

    /// The pool's size when the store builds it (default 16); also the most connections the
    /// store keeps for its own statements, and the most for the effects' transactions of
    /// [`run_in_transaction`](crate::PgIdempotency::run_in_transaction).
    pub fn max_connections(mut self, max: u32) -> Self {
        self.max_connections = max;
        self
    }

    /// How long a call waits for a pooled connection before it is
    /// [`StoreErrorKind::Unavailable`](idem_core::StoreErrorKind::Unavailable) (default 5 s).
    /// A new connection of the store's own: each host has an equal share of it to connect,
    /// then the host that took it its share again to set the session up.
    pub fn acquire_timeout(mut self, timeout: Duration) -> Self {
        self.acquire_timeout = timeout;
        self
    }

    /// The channel of the change feed (default `idem_changes`): a plain lower-case identifier
    /// of at most 46 bytes ([`validate_identifier`](crate::validate_identifier)). Every
    /// process of one deployment must use the same; stores of unrelated deployments on one
    /// database may use their own.
    ///
    /// The feed serves duplicates that wait for their original
    /// ([`Policy::wait_in_flight`](idem_core::Policy::wait_in_flight), C5): when a record's
    /// completion lands or it is released, the engine announces it with
    /// `pg_notify(channel, digest)` (`sql/announce.sql`, sent like every statement of the store,
    /// so it works behind PgBouncer in transaction mode), and each process's feed, a
    /// `LISTEN` on a session of its own, wakes the duplicates waiting for that record.
    ///
    /// ```
    /// use idem_postgres::PgStore;
    /// use std::time::Duration;
    /// let builder = PgStore::builder()
    ///     .channel("billing_changes")
    ///     // LISTEN needs a session of its own: past a pooler in transaction mode, connect
    ///     // the listener to the server directly.
    ///     .listener_url("postgres://app@db-primary:5432/payments")
    ///     .feed_ping(Duration::from_secs(5), Duration::from_secs(2));
    /// # let _ = builder;
    /// ```
    pub fn channel(mut self, channel: &str) -> Self {
        self.feed.channel = channel.to_owned();
        self
    }

    /// Where the change feed's listener connects (default: where the store connects). `LISTEN`
    /// does not work through PgBouncer in transaction mode (the session that listens is handed
    /// to other clients between transactions): give a store behind one the server's own URL
    /// here. It must reach the same database as the store (notifications do not cross
    /// databases). Parsed when the store connects; a URL that does not parse is then
    /// [`Error::InvalidInput`]. Without an `application_name` of its own, the listener's session
    /// is named `idem_changes_feed`. It may name a primary and its standbys as
    /// [`connect`](Self::connect)'s URL does: each new listener then finds the host that
    /// accepts writes first (a `LISTEN` must be where the notifications are sent).
    pub fn listener_url(mut self, url: &str) -> Self {
        self.listener = ListenerTarget::Url(url.to_owned());
        self
    }

    /// Like [`listener_url`](Self::listener_url), with connect options.
    pub fn listener_options(mut self, options: PgConnectOptions) -> Self {
        self.listener = ListenerTarget::Options(Box::new(options));
        self
    }

    /// How the change feed finds a listener that went silent (default: a ping every 5 s, which
    /// must arrive within 2 s). Each ping is a `pg_notify` sent through the store's
    /// connections to a channel only this listener follows; one that was sent and does not
    /// arrive in time means the listener's connection is dead (a partition, a frozen link, a
    /// failover that left it on the old server): it is replaced, and every waiter reads its
    /// record again. Both more than zero.
    pub fn feed_ping(mut self, every: Duration, within: Duration) -> Self {
        self.feed.ping_every = every;
        self.feed.ping_within = within;
        self
    }

    /// Whether the store has a change feed (default true). Without one, `announce` sends
    /// nothing and duplicates that wait poll their record (a database that refuses `LISTEN`,
    /// for example a role without the right).
    pub fn change_feed(mut self, enabled: bool) -> Self {
        self.feed.enabled = enabled;
        self
    }

    /// The holder each reservation records for operators (default
    /// [`Holder::this_process`]); a test gives another to stand for another process.
    ///
    /// ```
    /// use idem_ops::Holder;
    /// let _builder = idem_postgres::PgStore::builder().holder(Holder::new("web-2", 7, 1, None));
    /// ```
    pub fn holder(mut self, holder: Holder) -> Self {
        self.holder = holder;
        self
    }

    /// Connects to `url`: the store's own connections (up to
    /// [`max_connections`](Self::max_connections)), and a pool for your transactions that opens
    /// connections when you first use it. Fails at once if no server can be reached.
    ///
    /// `url` may name several hosts, in libpq's form: `postgres://app@db1:5432,db2:5432/payments?
    /// target_session_attrs=read-write` (a host without a port is on 5432). New connections try
    /// the hosts in order from the current one; with `target_session_attrs=read-write` (or its
    /// synonym `primary`) they stay only on a server that accepts writes. A connection that
    /// fails (refused, lost, cut off by a call's deadline, or refused a write by a demoted
    /// server) moves the store, its pool and its change feed to the next host, so that the store
    /// follows a promotion without a restart (C13). `any` (the default) takes any server;
    /// other values are [`Error::InvalidInput`].
    ///
    /// ```no_run
    /// use idem_postgres::PgStore;
    /// # async fn demo() -> Result<(), idem_core::Error> {
    /// let store = PgStore::connect(
    ///     "postgres://app@db1,db2:5433/payments?target_session_attrs=read-write",
    /// )
    /// .await?;
    /// # let _ = store;
    /// # Ok(())
    /// # }
    /// ```
    pub async fn connect(self, url: &str) -> Result<PgStore, Error> {
        validate(&self.config)?;
        feed_settings::validate(&self.feed)?;
        let hosts = Arc::new(Hosts::new(hosts_url::parse(url)?));
        let listener = self.listener.options(&hosts)?;
        let pool = PgPoolOptions::new()
            .max_connections(self.max_connections)
            .acquire_timeout(self.acquire_timeout)
            .test_before_acquire(false);
        let pool = follow_pool::hooks(&hosts, pool).connect_lazy_with(hosts.current_options());
        hosts.follow(pool.clone());
        let store = PgStore::from_parts(pool, hosts, listener, self, false);
        let probe = store.inner.conns.get().await?;
        probe.finish::<()>(&Ok(()));
        Ok(store)
    }

    /// Uses your pool for your transactions (typically the one of your business code), the
    /// effects' transactions of `run_in_transaction` included: they run in the sessions your
    /// pool sets up (its `after_connect`: a role, a `search_path`, a tenant setting), at the
    /// cost of the ping sqlx sends when a connection comes back (6 round trips per fresh key
    /// instead of 5). The store opens its own connections for its own statements with the
    /// pool's connect options (one host: a list of hosts needs [`connect`](Self::connect)).
    /// Build the pool with `test_before_acquire(false)` for your own round trips' sake.
    pub fn pool(self, pool: PgPool) -> Result<PgStore, Error> {
        validate(&self.config)?;
        feed_settings::validate(&self.feed)?;
        let hosts = Arc::new(Hosts::single((*pool.connect_options()).clone()));
        let listener = self.listener.options(&hosts)?;
        Ok(PgStore::from_parts(pool, hosts, listener, self, true))
    }
}

fn validate(config: &PgConfig) -> Result<(), Error> {
    validate_identifier(&config.schema)?;
    validate_table_name(&config.table)
}

impl PgStore {
    /// Starts configuring a store.
    pub fn builder() -> PgStoreBuilder {
        PgStoreBuilder {
            config: PgConfig::default(),
            max_connections: 16,
            acquire_timeout: Duration::from_secs(5),
            feed: feed_settings::default_settings(),
            listener: ListenerTarget::Store,
            holder: Holder::this_process().clone(),
            read_first: true,
        }
    }

    /// A store on `url` with the default settings (table `public.idem_records`).
    pub async fn connect(url: &str) -> Result<Self, Error> {
        Self::builder().connect(url).await
    }

    fn from_parts(
        pool: PgPool,
        hosts: Arc<Hosts>,
        listener: ListenerOptions,
        builder: PgStoreBuilder,
        effects_on_pool: bool,
    ) -> Self {
        let config = builder.config;
        let ops = Ops {
            sql: Statements::new(&config.schema, &config.table, &config.deadlines),
            mode: config.statements,
            preamble: session::statement_preamble(config.statements, &config.deadlines),
            holder: builder.holder.encode(),
            gate_namespace: format!("{}.{}", config.schema, config.table),
            gate: Gate::new(&format!("{}.{}", config.schema, config.table)),
            purge_from: std::sync::Mutex::new(None),
            server_started: std::sync::atomic::AtomicI64::new(0),
            servers: std::sync::atomic::AtomicU64::new(0),
        };
        let setup = session::connection_setup(config.statements, &config.deadlines);
        let beat_conns = Connections::new(
            Arc::clone(&hosts),
            BEAT_CONNECTIONS,
            builder.acquire_timeout,
            setup.clone(),
        )
        .settling(PERMIT_HELD);
        // An effect's statement may run for seconds (behind a row lock, or long by design):
        // the next effects never wait for one that was cut off, its permit goes back at once.
        let tx_conns = Connections::new(
            Arc::clone(&hosts),
            builder.max_connections,
            builder.acquire_timeout,
            None,
        )
        .settling(Duration::ZERO);
        let conns = Connections::new(
            Arc::clone(&hosts),
            builder.max_connections,
            builder.acquire_timeout,
            setup,
        )
        .settling(PERMIT_HELD);
        Self {
            inner: Arc::new(Inner {
                pool,
                conns,
                beat_conns,
                tx_conns,
                effects_on_pool,
                ops,
                config,
                feed: builder.feed,
                listener,
                connect_within: builder.acquire_timeout,
                hosts,
                read_first: builder.read_first,
            }),
        }
    }

    /// The pool, for your own transactions (sqlx pings each connection given back to it: a
    /// round trip more per transaction). The effects of `run_in_transaction` run on the store's
    /// own connections, unless the store was built over your pool
    /// ([`PgStoreBuilder::pool`]): then on that pool, in the sessions it sets up.
    ///
    /// Built by [`PgStoreBuilder::connect`], it follows the store's hosts (a failover): asked
    /// for while it has no connection, it has the store search its hosts in the background.
    pub fn pool(&self) -> &PgPool {
        let inner = &self.inner;
        follow_pool::wanted(&inner.hosts, &inner.pool, inner.connect_within);
        &inner.pool
    }

    /// The schema-qualified table the records live in, quoted (`"public"."idem_records"`).
    pub fn table(&self) -> String {
        format!(
            "\"{}\".\"{}\"",
            self.inner.config.schema, self.inner.config.table
        )
    }

    /// The schema the records' table lives in, as configured and unquoted (`public`): where a
    /// crate that keeps tables beside the records (the inbox's audit trail) puts its own.
    ///
    /// ```no_run
    /// # async fn demo() -> Result<(), idem_core::Error> {
    /// let store = idem_postgres::PgStore::builder().schema("billing").table("webhooks")
    ///     .connect("postgres://app@localhost/payments").await?;
    /// assert_eq!((store.schema(), store.table_name()), ("billing", "webhooks"));
    /// assert_eq!(store.table(), "\"billing\".\"webhooks\"");
    /// # Ok(())
    /// # }
    /// ```
    pub fn schema(&self) -> &str {
        &self.inner.config.schema
    }

    /// The records' table's name, as configured, unquoted and without its schema
    /// (`idem_records`): what a crate that keeps tables beside the records derives their names
    /// from (`<table>_inbox_audit`). [`table`](Self::table) is the name to write in SQL.
    pub fn table_name(&self) -> &str {
        &self.inner.config.table
    }

    /// The isolation level `run_in_transaction` uses.
    pub fn isolation(&self) -> Isolation {
        self.inner.config.isolation
    }

    /// Completes the record **inside the caller's transaction** (C6): commit it and the effect
    /// and the completion are both there; roll it back and neither is. [`Error::LeaseLost`]
    /// means another attempt holds the record (or, at `RepeatableRead`/`Serializable`, a
    /// serialization failure): roll the transaction back.
    ///
    /// Bounded (C13): it waits at most the store's statement deadline
    /// ([`PgStoreBuilder::statement_timeout`], default 4 s), or its lock deadline
    /// ([`PgStoreBuilder::lock_timeout`]) where that is longer, and within what is left of the
    /// request's store budget ([`Completion::bound`](idem_core::Completion::bound), C13), for
    /// its answer, measured by the process, so a connection gone silent mid-transaction is
    /// [`StoreErrorKind::Unavailable`](idem_core::StoreErrorKind::Unavailable), never a hang.
    /// As after any error here, drop (roll back) the transaction, never commit it: the
    /// completion may not have run.
    ///
    /// ```no_run
    /// # use idem_core::{Begin, Idempotency, StoredResponse};
    /// # use idem_postgres::PgStore;
    /// # async fn demo(idem: Idempotency<PgStore>, request: idem_core::Request) -> Result<(), Box<dyn std::error::Error>> {
    /// if let Begin::Acquired(lease) = idem.begin(&request).await? {
    ///     let mut tx = idem.store().pool().begin().await?;
    ///     sqlx::query("INSERT INTO charges (cents) VALUES (2500)").execute(&mut *tx).await?;
    ///     let completion = idem.completion(&lease, StoredResponse::new(201, "charged"));
    ///     idem.store().complete_in(&mut tx, &completion).await?; // on error: the tx rolls back
    ///     tx.commit().await?;
    /// }
    /// # Ok(())
    /// # }
    /// ```
    pub async fn complete_in(
        &self,
        conn: &mut PgConnection,
        completion: &Completion,
    ) -> Result<(), Error> {
        let deadlines = &self.inner.config.deadlines;
        let most = deadlines.statement.max(deadlines.lock);
        completion
            .bound(most, self.inner.ops.complete_in(conn, completion))
            .await
    }
}

/// How many connections the heartbeat thread may open (renewals are short and spread out).
const BEAT_CONNECTIONS: u32 = 2;

impl PgStore {
    /// The connections for a call made here: the heartbeat's own on the engine's heartbeat
    /// thread, the store's everywhere else.
    pub(crate) fn connections(&self) -> &Connections {
        if idem_core::store::on_heartbeat_thread() {
            &self.inner.beat_conns
        } else {
            &self.inner.conns
        }
    }
}

/// Runs one operation on one of the store's own connections, and gives the connection back
/// only if the operation finished cleanly. A connection that waited in the stack and turns out
/// dead (the server restarted, a failover) is replaced and the operation tried once more on a
/// new one: every operation is safe to repeat (a reservation sends the same token again and
/// recognises the record an attempt whose answer was lost wrote; the others are fenced).
macro_rules! on_connection {
    ($store:expr, |$conn:ident| $op:expr) => {{
        on_connection!($store, |$conn| $op, None::<&Arc<AtomicBool>>)
    }};
    ($store:expr, |$conn:ident| $op:expr, $overtaken:expr) => {{
        let overtaken: Option<&Arc<AtomicBool>> = ($overtaken).into();
        let mut held = $store.connections().get().await?;
        if let Some(overtaken) = overtaken {
            held.overtaken_by(Arc::clone(overtaken));
        }
        let mut result = {
            let $conn = held.conn();
            $op.await
        };
        let stale = !held.fresh && matches!(&result, Err(e) if crate::error::is_broken_link(e));
        held.finish(&result);
        if stale {
            let mut held = $store.connections().get_fresh().await?;
            if let Some(overtaken) = overtaken {
                held.overtaken_by(Arc::clone(overtaken));
            }
            result = {
                let $conn = held.conn();
                $op.await
            };
            held.finish(&result);
        }
        result
    }};
}

impl PgStore {
    /// Sends `payload` on `channel` on one of the store's own connections (an announcement, or
    /// a change feed's ping).
    pub(crate) async fn notify(&self, channel: &str, payload: &str) -> Result<(), Error> {
        on_connection!(self, |conn| self.inner.ops.announce(conn, channel, payload))
    }

    /// What a reservation of `request` would find, writing nothing ([`Ops::look`]), on one of
    /// the store's own connections: never one an effect's transaction holds.
    ///
    /// Once `overtaken` is set, a look dropped mid-statement was given up by its caller (a
    /// connection for the transaction came first), not cut off by a deadline: its connection
    /// settles without its host being checked (`Held::overtaken_by`).
    pub(crate) async fn look(
        &self,
        request: &Request,
        deadline: Deadline,
        overtaken: &Arc<AtomicBool>,
    ) -> Result<Reserved, Error> {
        deadline
            .bound(Operation::Reserve, async {
                on_connection!(self, |conn| self.inner.ops.look(conn, request), overtaken)
            })
            .await
    }
}

#[async_trait]
impl Store for PgStore {
    /// The address of what this store and its clones share (C9: one registry of live executions
    /// for every engine over them).
    fn identity(&self) -> Option<usize> {
        Some(Arc::as_ptr(&self.inner).cast::<()>() as usize)
    }

    /// Moves with every connection the store opens (a restart, a failover, a connection
    /// replaced) and every change of the server its reservations run on (its start time, seen
    /// through a pooler too): the engine's replay cache is emptied.
    fn generation(&self) -> Option<u64> {
        let servers = self
            .inner
            .ops
            .servers
            .load(std::sync::atomic::Ordering::Acquire);
        Some(self.inner.hosts.opened().wrapping_add(servers))
    }

    /// One plain read by primary key (`sql/read.sql`), asked before every reservation
    /// ([`Capabilities::read_first`]).
    async fn read(&self, request: &Request, deadline: Deadline) -> Result<Reserved, Error> {
        deadline
            .bound(Operation::Lookup, async {
                on_connection!(self, |conn| self.inner.ops.read(conn, request))
            })
            .await
    }

    async fn reserve(&self, claim: &Claim<'_>, deadline: Deadline) -> Result<Reserved, Error> {
        deadline
            .bound(Operation::Reserve, async {
                on_connection!(self, |conn| self
                    .inner
                    .ops
                    .reserve(conn, claim, false, true))
            })
            .await
    }

    async fn replace(
        &self,
        claim: &Claim<'_>,
        acquire: Acquire,
        deadline: Deadline,
    ) -> Result<Reserved, Error> {
        deadline
            .bound(Operation::Reserve, async {
                let preamble = self.inner.ops.preamble.as_str();
                on_connection!(self, |conn| self.inner.ops.replace(
                    conn,
                    preamble,
                    claim.request(),
                    claim.token(),
                    acquire,
                    claim.lease_for()
                ))
            })
            .await
    }

    async fn complete(&self, completion: &Completion, deadline: Deadline) -> Result<(), Error> {
        deadline
            .bound(Operation::Complete, async {
                on_connection!(self, |conn| self.inner.ops.complete(conn, completion))
            })
            .await
    }

    async fn release(&self, lease: &Lease, deadline: Deadline) -> Result<(), Error> {
        deadline
            .bound(Operation::Release, async {
                on_connection!(self, |conn| self.inner.ops.release(conn, lease))
            })
            .await
    }

    async fn renew(
        &self,
        lease: &Lease,
        lease_for: Duration,
        deadline: Deadline,
    ) -> Result<Timestamp, Error> {
        deadline
            .bound(Operation::Renew, async {
                on_connection!(self, |conn| self.inner.ops.renew(conn, lease, lease_for))
            })
            .await
    }

    async fn purge_expired(&self, limit: usize, deadline: Deadline) -> Result<usize, Error> {
        deadline
            .bound(Operation::Purge, async {
                on_connection!(self, |conn| self
                    .inner
                    .ops
                    .purge_expired(conn, limit, deadline))
            })
            .await
    }

    /// One statement (`sql/resolve_*.sql`): the fenced change and its audit entry, atomic
    /// without a transaction of its own.
    async fn resolve(&self, resolution: &Resolution, deadline: Deadline) -> Result<bool, Error> {
        deadline
            .bound(Operation::Resolve, async {
                on_connection!(self, |conn| self.inner.ops.resolve(conn, resolution))
            })
            .await
    }

    async fn lookup(&self, id: &RecordId, deadline: Deadline) -> Result<Option<Record>, Error> {
        deadline
            .bound(Operation::Lookup, async {
                on_connection!(self, |conn| self.inner.ops.select(conn, id))
            })
            .await
    }

    fn capabilities(&self) -> Capabilities {
        Capabilities::default()
            .with_change_feed(self.inner.feed.enabled)
            .with_read_first(self.inner.read_first)
    }

    /// `pg_notify` of the record's digest on the feed's channel (`sql/announce.sql`), on one of
    /// the store's own connections with its deadlines, from a task of its own (nothing waits
    /// for it), cut off after two acquire timeouts (connecting, then setting a new connection
    /// up) plus one statement deadline.
    fn announce(&self, id: &RecordId) {
        if !self.inner.feed.enabled {
            return;
        }
        let Ok(runtime) = tokio::runtime::Handle::try_current() else {
            return;
        };
        let store = self.clone();
        let digest = digest_to_hex(&id.digest());
        let within = self.inner.connect_within * 2 + self.inner.config.deadlines.statement;
        drop(runtime.spawn(async move {
            let sent =
                tokio::time::timeout(within, store.notify(&store.inner.feed.channel, &digest))
                    .await;
            if !matches!(sent, Ok(Ok(()))) {
                tracing::debug!(
                    target: "idem_postgres",
                    "an announcement could not be sent: waiters elsewhere poll for it"
                );
            }
        }));
    }

    /// Starts the change feed (`store/feed.rs`) on a task of the current runtime.
    fn watch(&self, changes: Changes) -> bool {
        self.inner.feed.enabled && feed::feed(&self.inner, changes).spawn()
    }
}

#[async_trait]
impl Operator for PgStore {
    async fn inspect(&self, id: &RecordId, deadline: Deadline) -> Result<Option<Inspected>, Error> {
        deadline
            .bound(Operation::Inspect, async {
                on_connection!(self, |conn| self.inner.ops.inspect(conn, id))
            })
            .await
    }
    async fn list(&self, query: &ListQuery, deadline: Deadline) -> Result<Page, Error> {
        deadline
            .bound(Operation::List, async {
                on_connection!(self, |conn| self.inner.ops.list(conn, query))
            })
            .await
    }
    async fn stats(&self, deadline: Deadline) -> Result<Stats, Error> {
        deadline
            .bound(Operation::List, async {
                on_connection!(self, |conn| self.inner.ops.stats(conn))
            })
            .await
    }
    async fn reconciliations(
        &self,
        id: &RecordId,
        deadline: Deadline,
    ) -> Result<Vec<Reconciliation>, Error> {
        deadline
            .bound(Operation::Inspect, async {
                on_connection!(self, |conn| self.inner.ops.reconciliations(conn, id))
            })
            .await
    }
}
