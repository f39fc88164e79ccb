//! `RedisStore`: the store, its builder, and its `Store` implementation.

use crate::audit::{self, Element};
use crate::conn::{Opener, Target};
use crate::connections::{Connections, Timeouts};
use crate::error::{store_error, unexpected, BACKEND};
use crate::feed::{Nodes, Subscribers};
use crate::feed_settings::{self, FeedSettings};
use crate::listing::Scanner;
use crate::packed::{self, Packed};
use crate::record::{self, integer, text, timestamp};
use crate::scripts::scripts;
use crate::sentinel::Sentinels;
use crate::server_identity::ServerIdentity;
use idem_core::store::Deadline;
use idem_core::store::Reconciliation;
use idem_core::store::{
    async_trait, digest_to_hex, duration_millis, Acquire, Capabilities, Changes, Claim, Completion,
    Lease, Record, Reserved, Resolution,
};
use idem_core::{
    Error, Field, RecordId, Request, Store, StoreErrorKind, StoredResponse, Timestamp,
};
use idem_core::{Operation, Policy};
use idem_ops::Holder;
use idem_ops::{Inspected, ListQuery, ListingOrder, Operator, Page, Stats};
use redis::io::tcp::TcpSettings;
use redis::{ScriptInvocation, Value};
use std::sync::Arc;
use std::time::Duration;

/// The longest grace accepted: deadlines and TTLs stay exact in Lua's numbers (doubles).
const MAX_GRACE: Duration = Duration::from_secs(24 * 3600);

/// How long a call waits for Redis's answer by default: far above a healthy Redis's
/// milliseconds, well below an HTTP client's own timeout (C13).
const DEFAULT_RESPONSE_TIMEOUT: Duration = Duration::from_secs(2);

/// How long establishing a connection may take by default (C13).
const DEFAULT_CONNECTION_TIMEOUT: Duration = Duration::from_secs(2);

/// An idem [`Store`] in Redis, on one node, a Redis Cluster or under Sentinel.
///
/// **Not atomic with your effect** (C14): see the crate documentation. Every operation on a
/// record is one Lua script on one key (one round trip; EVALSHA, with the body sent again after
/// a NOSCRIPT); time is Redis's own clock (`TIME`), never the application's (C11); records
/// expire by themselves (a TTL of their deadline plus a grace), so no purge is needed
/// ([`Capabilities::server_ttl`]). `list` and `stats` scan the prefix ([`ListingOrder::Scan`]; see
/// the crate documentation).
///
/// Renewals cannot be starved by the application (C9): a call made on the engine's heartbeat
/// thread uses a connection of its own, opened there the first time with the same settings,
/// so its socket is driven by the heartbeat's runtime; handlers that block every worker of
/// the runtime the store was connected on do not stop the leases from being renewed. It is
/// rebuilt, on that thread, after it fails unavailable.
///
/// Connections heal (C13): a connection whose calls keep failing unavailable is replaced by a
/// new one, opened in the background (see the crate documentation), so the same store value
/// answers again once Redis does, after a restart, a resharding or a half-open connection.
///
/// Cloning is cheap: clones share the connections.
#[derive(Clone)]
pub struct RedisStore {
    conns: Arc<Connections>,
    /// Which data set the server holds, while the replay cache asks (`Store::generation`).
    identity: Arc<ServerIdentity>,
    prefix: String,
    grace: Duration,
    /// The holder reservations record, in its stored form (formatted once).
    holder: Arc<str>,
    /// The change feed's settings (`crate::feed`).
    feed: Arc<FeedSettings>,
    /// Where the change feed subscribes.
    subscribers: Arc<Subscribers>,
    /// Whether reservations read first ([`RedisStoreBuilder::read_first`]).
    read_first: bool,
    /// How long an announcement may take, cut off after it.
    announce_within: Duration,
    /// How long a completion waits for a replica's acknowledgement, if it does.
    wait_for_replica: Option<Duration>,
}

impl std::fmt::Debug for RedisStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RedisStore")
            .field("prefix", &self.prefix)
            .field("grace", &self.grace)
            .field("cluster", &self.conns.is_cluster())
            .finish()
    }
}

/// Checks a key prefix: 1..=64 bytes of visible ASCII without `{` or `}` (which would change the
/// cluster slot), else [`Error::InvalidInput`].
///
/// ```
/// assert!(idem_redis::validate_prefix("idem").is_ok());
/// assert!(idem_redis::validate_prefix("").is_err());
/// assert!(idem_redis::validate_prefix("{slot}").is_err());
/// ```
pub fn validate_prefix(prefix: &str) -> Result<(), Error> {
    let ok = !prefix.is_empty()
        && prefix.len() <= 64
        && prefix
            .bytes()
            .all(|b| (0x21..=0x7e).contains(&b) && b != b'{' && b != b'}');
    if ok {
        Ok(())
    } else {
        Err(Error::invalid(
            Field::Config,
            "the key prefix must be 1..=64 bytes of visible ASCII without braces",
        ))
    }
}

/// Settings for [`RedisStore`]; see [`RedisStore::builder`].
///
/// Every call has a deadline (C13): a Redis that is down, frozen or unreachable makes a call
/// fail with [`StoreErrorKind::Unavailable`] (HTTP 503, retryable) within its
/// [response timeout](Self::response_timeout) and, when it must connect again, its
/// [connection timeout](Self::connection_timeout); never a wait without end.
///
/// ```no_run
/// use idem_redis::RedisStore;
/// use std::time::Duration;
/// # async fn demo() -> Result<(), idem_core::Error> {
/// let store = RedisStore::builder()
///     .prefix("payments")
///     .response_timeout(Duration::from_millis(500))
///     .connection_timeout(Duration::from_secs(1))
///     .connect("redis://127.0.0.1:6379")
///     .await?;
/// # let _ = store;
/// # Ok(())
/// # }
/// ```
#[derive(Debug, Clone)]
#[must_use]
pub struct RedisStoreBuilder {
    prefix: String,
    grace: Duration,
    response_timeout: Duration,
    connection_timeout: Duration,
    allow_eviction: bool,
    wait_for_replica: Option<Duration>,
    feed: FeedSettings,
    holder: Holder,
    read_first: bool,
}

impl RedisStoreBuilder {
    /// Whether reservations may read their record first, no script (default true): one `HMGET` of
    /// the record's read header and its response, then `TIME`. The header is a packed copy of the
    /// record's fields that such a store's scripts keep beside them: about 400 bytes more a record
    /// (`MEMORY USAGE`: 1 659 against 1 248 bytes completed with a 100 B body, 1 217 against 816 in
    /// progress). A replay, an in-flight duplicate or a mismatch then costs that read, 1.1 – 2.5
    /// times faster than the reservation's script (docs/benchmarks.md; a mismatch transfers the
    /// stored response, which the script does not); a record without a header (in doubt, written by
    /// a store that does not read first) a second read, of its fields. The engine reads first only
    /// while most of its recent reservations were answers
    /// ([`Capabilities::read_first`](idem_core::store::Capabilities::read_first)): a load of fresh
    /// keys goes to the script at once. `false` saves the header's memory. Set it alike on every
    /// process of a prefix.
    ///
    /// ```
    /// let _builder = idem_redis::RedisStore::builder().read_first(false);
    /// ```
    pub fn read_first(mut self, read_first: bool) -> Self {
        self.read_first = read_first;
        self
    }

    /// The holder each reservation records for operators (default
    /// [`Holder::this_process`]); a test gives another to stand for another process.
    ///
    /// ```
    /// use idem_ops::Holder;
    /// let _builder = idem_redis::RedisStore::builder().holder(Holder::new("web-2", 7, 1, None));
    /// ```
    pub fn holder(mut self, holder: Holder) -> Self {
        self.holder = holder;
        self
    }

    /// The prefix of every key (default `idem`): keys are `<prefix>:<hex digest of the triple>`.
    /// 1..=64 bytes of visible ASCII without `{` or `}` (which would change the cluster slot).
    pub fn prefix(mut self, prefix: &str) -> Self {
        self.prefix = prefix.to_owned();
        self
    }

    /// How long an in-progress record stays after its lease before Redis deletes it (default
    /// 60 s): an expired lease is still seen, and taken over with fencing, instead of vanishing.
    /// A completed record's TTL is its retention. At most a day.
    pub fn grace(mut self, grace: Duration) -> Self {
        self.grace = grace;
        self
    }

    /// How long one call waits for Redis's answer before it is
    /// [`StoreErrorKind::Unavailable`] (default 2 s; more than zero). Large stored responses
    /// need it long enough to travel.
    ///
    /// On one Redis a call waits at most this long for its answer, after at most one
    /// [connection timeout](Self::connection_timeout) when its connection must be established
    /// again; on a Cluster it bounds the whole call, redirections, retries and reconnections
    /// included. A reservation whose answer is lost resends once (with its token, so it is
    /// recognised), so it may take twice as long. A call that timed out may still run when
    /// Redis wakes up: a completion then lands, a reservation holds the key until its lease
    /// passes. A connection whose calls keep timing out is replaced (see [`RedisStore`]): once
    /// Redis answers again, so does the store. Whatever the driver does, a call ends after
    /// one connection timeout plus one response timeout.
    ///
    /// ```
    /// use idem_redis::RedisStore;
    /// use std::time::Duration;
    /// let builder = RedisStore::builder().response_timeout(Duration::from_millis(500));
    /// # let _ = builder;
    /// ```
    pub fn response_timeout(mut self, timeout: Duration) -> Self {
        self.response_timeout = timeout;
        self
    }

    /// How long establishing a connection may take, Redis's handshake included, before it is
    /// [`StoreErrorKind::Unavailable`] (default 2 s; more than zero). Applies to `connect`
    /// and to every reconnection after a connection is lost; on one Redis a reconnection is
    /// one attempt, and the next call after a failed one starts another, so a call never
    /// waits on a series of attempts.
    ///
    /// ```
    /// use idem_redis::RedisStore;
    /// use std::time::Duration;
    /// let builder = RedisStore::builder().connection_timeout(Duration::from_secs(1));
    /// # let _ = builder;
    /// ```
    pub fn connection_timeout(mut self, timeout: Duration) -> Self {
        self.connection_timeout = timeout;
        self
    }

    /// Accepts a Redis whose `maxmemory-policy` may evict keys. By default the store refuses one,
    /// at `connect` and on every connection it opens later (a rebuild, a master the sentinels
    /// promoted: that connection is not used, calls fail misconfigured until one is accepted;
    /// on a Cluster every node is asked), and asks the connections in use again every 5 s, so a
    /// policy changed while connected (`CONFIG SET`) is refused alike within seconds: an evicted
    /// record makes the key new again while its first holder still runs, so the effect would
    /// run twice at the same time (not only after a crash, C14). Set it only where Redis cannot
    /// be asked (`CONFIG` disabled) and you know the policy is `noeviction`.
    pub fn allow_eviction(mut self, allow: bool) -> Self {
        self.allow_eviction = allow;
        self
    }

    /// The channel of the change feed (default `idem:changes`; 1..=64 bytes of visible ASCII).
    /// Every process of one deployment must use the same; stores of unrelated deployments on
    /// one Redis may use their own.
    ///
    /// The feed serves duplicates that wait for their original
    /// ([`Policy::wait_in_flight`](idem_core::Policy::wait_in_flight), C5): when a record's
    /// completion lands or it is released, the engine announces it with
    /// `PUBLISH <channel> <digest>` through the store's connection, and each process's feed, a
    /// pub/sub connection of its own `SUBSCRIBE`d to the channel, wakes the duplicates waiting
    /// for that record. On a Redis Cluster a `PUBLISH` reaches the subscribers of every node,
    /// so the channel is one name (no hash tag needed) and the feed subscribes on one seed node
    /// at a time.
    ///
    /// ```
    /// use idem_redis::RedisStore;
    /// use std::time::Duration;
    /// let builder = RedisStore::builder()
    ///     .channel("billing:changes")
    ///     .feed_ping(Duration::from_secs(5), Duration::from_secs(2));
    /// # let _ = builder;
    /// ```
    pub fn channel(mut self, channel: &str) -> Self {
        self.feed.channel = channel.to_owned();
        self
    }

    /// How the change feed finds a subscription that went silent (default: a ping every 5 s,
    /// which must arrive within 2 s). Each ping is a `PUBLISH` through the store's connection
    /// to a channel only this subscription follows; one that was published and does not
    /// arrive in time means the subscription's connection is dead (a partition, a frozen node):
    /// it is replaced (on a Cluster, on the next seed node), and every waiter reads its record
    /// again. Both more than zero.
    pub fn feed_ping(mut self, every: Duration, within: Duration) -> Self {
        self.feed.ping_every = every;
        self.feed.ping_within = within;
        self
    }

    /// Whether the store has a change feed (default true). Without one, nothing is published
    /// and duplicates that wait poll their record (a Redis whose pub/sub is disabled by its
    /// ACL, or a proxy in front of it that does not carry pub/sub).
    pub fn change_feed(mut self, enabled: bool) -> Self {
        self.feed.enabled = enabled;
        self
    }

    fn validate(&self) -> Result<(), Error> {
        validate_prefix(&self.prefix)?;
        feed_settings::validate(&self.feed)?;
        if self.grace > MAX_GRACE {
            return Err(Error::invalid(
                Field::Config,
                "the grace must be at most a day",
            ));
        }
        // Zero would fail every call (C13: a deadline, not a refusal to wait at all).
        if self.response_timeout.is_zero() || self.connection_timeout.is_zero() {
            return Err(Error::invalid(
                Field::Config,
                "the response and connection timeouts must be more than zero",
            ));
        }
        if self
            .wait_for_replica
            .is_some_and(|within| within.is_zero() || within >= self.response_timeout)
        {
            return Err(Error::invalid(
                Field::Config,
                "the wait for a replica must be more than zero and less than the response timeout",
            ));
        }
        Ok(())
    }

    /// After each completion, waits up to `within` for one replica to acknowledge it
    /// (`WAIT 1 <ms>`; default `None`: no wait). More than zero, less than the response
    /// timeout.
    ///
    /// It narrows C14's failover loss: a completion a replica acknowledged survives the
    /// promotion of that replica. It costs a round trip and the replication delay on every
    /// completion, and `within` whenever no replica answers. It guarantees nothing: a
    /// completion no replica acknowledged in time still counts (logged at warn), the
    /// sentinels may promote a replica that did not acknowledge it, and a reservation is not
    /// waited for, so a failover can still lose a record and run its effect again. A `WAIT`
    /// that fails (the master lost, or demoted under it) fails the completion, unavailable,
    /// which the engine retries: on the new master it lands, or is found landed.
    ///
    /// Completions that wait run, with their `WAIT`, on a connection of their own: Redis
    /// serves a connection's commands in order, and answers must never queue behind a `WAIT`
    /// (C5). While no replica acknowledges, they queue behind one another's, `within` each.
    ///
    /// ```
    /// use idem_redis::RedisStore;
    /// use std::time::Duration;
    /// let builder = RedisStore::builder().wait_for_replica(Some(Duration::from_millis(100)));
    /// # let _ = builder;
    /// ```
    pub fn wait_for_replica(mut self, within: Option<Duration>) -> Self {
        self.wait_for_replica = within;
        self
    }

    /// The TCP settings of every connection (see `crate::tcp`).
    fn tcp(&self) -> TcpSettings {
        crate::tcp::settings(self.connection_timeout + self.response_timeout)
    }

    /// The settings of a connection to one Redis. Bounded (C13): a call waits at most the
    /// response timeout for its answer, and a lost connection is re-established in one attempt
    /// of at most the connection timeout. No retries inside the manager: calls waiting on a
    /// reconnection would wait for every attempt and the back-off between them; a failed
    /// attempt is an error, and the next call starts a new one (the manager reconnects on an
    /// I/O error, a timed-out attempt included).
    fn single(&self) -> redis::aio::ConnectionManagerConfig {
        redis::aio::ConnectionManagerConfig::new()
            .set_response_timeout(Some(self.response_timeout))
            .set_connection_timeout(Some(self.connection_timeout))
            .set_number_of_retries(0)
    }

    /// Connects to one Redis (`redis://host:port/db`), with a connection manager that
    /// reconnects by itself. Every connection has TCP keepalive and, on Linux, a TCP user
    /// timeout of one connection timeout plus one response timeout (at least 1 s), so a peer
    /// gone silent closes it; so do a Cluster's and Sentinel's.
    pub async fn connect(self, url: &str) -> Result<RedisStore, Error> {
        self.validate()?;
        let client = crate::tcp::client(url, &self.tcp()).map_err(store_error)?;
        let subscribers = Nodes::Fixed(vec![client.clone()]);
        let config = self.single();
        self.open(Target::Single(client, config), subscribers).await
    }

    /// Connects to a Redis Cluster through any of its nodes. The change feed subscribes on one
    /// of these nodes at a time, moving to the next one when it fails.
    pub async fn connect_cluster(self, nodes: &[&str]) -> Result<RedisStore, Error> {
        self.validate()?;
        let tcp = self.tcp();
        let subscribers = nodes
            .iter()
            .map(|node| crate::tcp::client(node, &tcp))
            .collect::<Result<Vec<_>, _>>()
            .map_err(store_error)?;
        // Bounded (C13): the response timeout is also the cluster client's overall timeout of
        // a call, its retries (after a redirection or a lost connection) included.
        // Every node speaks RESP2, as every other connection (see `crate::tcp::info`): the
        // cluster client takes its protocol from the builder and refuses nodes of another.
        let seeds = nodes
            .iter()
            .map(|node| crate::tcp::info(node, &tcp))
            .collect::<Result<Vec<_>, _>>()
            .map_err(store_error)?;
        let client = redis::cluster::ClusterClient::builder(seeds)
            .use_protocol(redis::ProtocolVersion::RESP2)
            .response_timeout(self.response_timeout)
            .connection_timeout(self.connection_timeout)
            .retries(2)
            .tcp_settings(tcp)
            .build()
            .map_err(store_error)?;
        self.open(Target::Cluster(client), Nodes::Fixed(subscribers))
            .await
    }

    /// Connects to the master the sentinels at `sentinels` (`redis://host:26379`, asked in
    /// this order) name `master`, and follows it through a failover (C13): a connection whose
    /// calls keep failing unavailable (refused, lost, timed out, `READONLY` from a demoted
    /// master) is rebuilt, and every rebuild, like the change feed's subscription, asks the
    /// sentinels again. Until they have promoted a replica, calls are 503s within their
    /// deadline; after, the store answers again once its next rebuild is due (at most the
    /// connection timeout, 2 s at most, see [`RedisStore`]). A master still running when
    /// another is promoted (a manual failover, a healed partition) takes writes until the
    /// sentinels demote it, seconds later; so a task of the store asks a sentinel every second
    /// which master it names, and a connection on another one is rebuilt at once. C14's failover loss stands: a
    /// record the old master had not yet sent to the promoted replica is lost, and its
    /// effect may run again ([`wait_for_replica`](Self::wait_for_replica) narrows it).
    ///
    /// A sentinel's URL carries that sentinel's own settings (its password); the master is
    /// connected to in plain TCP, database 0, without credentials.
    ///
    /// ```no_run
    /// use idem_redis::RedisStore;
    /// # async fn demo() -> Result<(), idem_core::Error> {
    /// let store = RedisStore::builder()
    ///     .connect_sentinel(
    ///         &["redis://10.0.0.1:26379", "redis://10.0.0.2:26379", "redis://10.0.0.3:26379"],
    ///         "mymaster",
    ///     )
    ///     .await?;
    /// # let _ = store;
    /// # Ok(())
    /// # }
    /// ```
    pub async fn connect_sentinel(
        self,
        sentinels: &[&str],
        master: &str,
    ) -> Result<RedisStore, Error> {
        self.validate()?;
        if sentinels.is_empty() {
            return Err(Error::invalid(Field::Config, "no sentinel to ask"));
        }
        let sentinels = Sentinels::new(sentinels, master, &self.tcp()).map_err(store_error)?;
        let subscribers = Nodes::Sentinel(sentinels.clone());
        let config = self.single();
        let within = self.connection_timeout + self.response_timeout;
        let store = self
            .open(Target::Sentinel(sentinels.clone(), config), subscribers)
            .await?;
        crate::follow::spawn(Arc::downgrade(&store.conns), sentinels, within);
        Ok(store)
    }

    /// Opens the store's connection (driven by the current runtime) and keeps its opener, which
    /// checks every connection it opens (see [`Opener`]), for every later one.
    async fn open(self, target: Target, subscribers: Nodes) -> Result<RedisStore, Error> {
        let opener = Opener::new(target, !self.allow_eviction);
        // Bounded whatever the driver does (C13): a cluster client connects to every master.
        let deadline = self.connection_timeout + self.response_timeout;
        let conn = tokio::time::timeout(deadline, opener.open())
            .await
            .map_err(|_| {
                Error::store(
                    BACKEND,
                    StoreErrorKind::Unavailable,
                    format!("no connection within {deadline:?}"),
                )
            })??;
        let timeouts = Timeouts {
            response: self.response_timeout,
            connection: self.connection_timeout,
        };
        let conns = Arc::new(Connections::new(conn, opener, timeouts));
        Connections::spawn_rechecks(&conns);
        Ok(RedisStore {
            conns,
            identity: Arc::default(),
            prefix: self.prefix,
            grace: self.grace,
            holder: Arc::from(self.holder.encode()),
            feed: Arc::new(self.feed),
            wait_for_replica: self.wait_for_replica,
            subscribers: Arc::new(Subscribers {
                nodes: subscribers,
                connect_within: deadline,
            }),
            announce_within: deadline,
            read_first: self.read_first,
        })
    }
}

impl RedisStore {
    /// Starts configuring a store.
    pub fn builder() -> RedisStoreBuilder {
        RedisStoreBuilder {
            prefix: "idem".to_owned(),
            grace: Duration::from_secs(60),
            response_timeout: DEFAULT_RESPONSE_TIMEOUT,
            connection_timeout: DEFAULT_CONNECTION_TIMEOUT,
            allow_eviction: false,
            wait_for_replica: None,
            feed: feed_settings::default_settings(),
            holder: Holder::this_process().clone(),
            read_first: true,
        }
    }

    /// A store on one Redis with the default settings.
    pub async fn connect(url: &str) -> Result<Self, Error> {
        Self::builder().connect(url).await
    }

    /// `"1"` where reads come first: the scripts then keep each record's read header, which
    /// [`read`](Store::read) fetches instead of its fields (lua/complete.lua).
    fn header_flag(&self) -> &'static str {
        if self.read_first {
            "1"
        } else {
            "0"
        }
    }

    /// The key of a record: the prefix and the hex of [`RecordId::digest`], a length-prefixed
    /// blake3 of (consumer, route, key), so no two triples share a key (C2).
    pub fn key_of(&self, id: &RecordId) -> String {
        record::key(&self.prefix, id)
    }

    /// The key of a record's audit trail (the reconciliation decisions about it): a list in the
    /// record's hash slot, `{<record key>}:audit`, so that a decision and its entry are one
    /// script on a Cluster too. It outlives the record (a released record's trail stays), each
    /// entry kept for the policy's [`audit_retention`](idem_core::Policy::audit_retention).
    ///
    /// ```
    /// # async fn demo(store: idem_redis::RedisStore, id: idem_core::RecordId) {
    /// let trail = store.audit_key_of(&id);
    /// assert_eq!(trail, format!("{{{}}}:audit", store.key_of(&id)));
    /// # }
    /// ```
    pub fn audit_key_of(&self, id: &RecordId) -> String {
        audit::key(&self.key_of(id))
    }

    fn scanner(&self) -> Scanner<'_> {
        Scanner::new(&self.conns, &self.prefix)
    }

    async fn fenced(&self, invocation: &ScriptInvocation<'_>) -> Result<(), Error> {
        match integer(&self.conns.invoke(invocation).await?, "fenced result")? {
            1 => Ok(()),
            _ => Err(Error::LeaseLost),
        }
    }
}

#[async_trait]
impl Store for RedisStore {
    /// The address of what this store and its clones share (C9: one registry of live executions
    /// for every engine over them).
    fn identity(&self) -> Option<usize> {
        Some(Arc::as_ptr(&self.conns).cast::<()>() as usize)
    }

    /// Moves at every failure of a connection (after which the driver may reconnect, perhaps
    /// to a restarted server or a promoted replica that lost writes), every rebuild, and every
    /// change of the server's role or replication ID, asked once a second while it is called
    /// (the engine calls it only with a replay cache; a master demoted by hand keeps its
    /// clients' connections): the engine's replay cache is emptied. `None` on a Cluster, whose
    /// client follows a master's restart and a failover without a failure the store could
    /// count: nothing is cached there.
    fn generation(&self) -> Option<u64> {
        if self.conns.is_cluster() {
            return None;
        }
        self.identity.ask_if_due(&self.conns);
        Some(
            self.conns
                .generation()
                .wrapping_add(self.identity.changes()),
        )
    }

    /// The record's read header by one `HMGET` (the header and the response), then `TIME`
    /// (C11): one round trip, no script. A completed record without a usable header (in doubt,
    /// written by a store that does not read first, or by an older release) is read again, its
    /// fields by one `HMGET`, then `TIME`. Neither a header nor a response (no record, one not
    /// ours, one in progress without a header) is left to `reserve` (`Lost`), which reports it
    /// as it is.
    async fn read(&self, request: &Request, deadline: Deadline) -> Result<Reserved, Error> {
        deadline
            .bound(Operation::Lookup, async {
                let key = self.key_of(request.id());
                // The clock after the record: a `TIME` read later than the `HMGET` only makes
                // the record older, never live for longer, so no `MULTI`. On a Cluster the
                // pipeline goes to the key's node, `TIME` having no key.
                let pipe = fields_then_time(&key, &["rh", "resp"]);
                let replies = self.conns.pipeline(&pipe).await?;
                if let Some(found) = record::read_header(replies, request)? {
                    return Ok(found);
                }
                let fields = ["v", "fp", "tok", "st", "dl", "id", "dbt", "resp"];
                let replies = self
                    .conns
                    .pipeline(&fields_then_time(&key, &fields))
                    .await?;
                record::read(replies, request)
            })
            .await
    }

    async fn reserve(&self, claim: &Claim<'_>, deadline: Deadline) -> Result<Reserved, Error> {
        deadline
            .bound(Operation::Reserve, async {
                let request = claim.request();
                let key = self.key_of(request.id());
                let [fingerprint, alternative] = request.fingerprints();
                // Every step of a reservation sends the claim's token: after a lost answer the script
                // recognises the reservation it wrote (never a key held by nobody until the lease
                // passes).
                let mut invocation = scripts().reserve.prepare_invoke();
                invocation
                    .key(&key)
                    .arg(fingerprint.as_bytes().as_slice())
                    .arg(claim.token().as_bytes().as_slice())
                    .arg(bounded_millis(
                        claim.lease_for(),
                        Policy::MAX_LEASE,
                        "lease",
                    )?)
                    .arg(duration_millis(self.grace))
                    .arg(record::triple(request.id()))
                    .arg(&*self.holder)
                    .arg(self.header_flag())
                    .arg(alternative.as_bytes().as_slice());
                let reply = self.conns.invoke(&invocation).await?;
                let (packed, response) = packed::split(reply, "reserve")?;
                let (fields, count) = packed::unpack::<10>(&packed, "reserve")?;
                let now = timestamp(record::packed_integer(fields[1], "now")?)?;
                match (fields[0], count) {
                    (Packed::Text(b"inserted"), 3) => Ok(Reserved::Written {
                        until: timestamp(record::packed_integer(fields[2], "deadline")?)?,
                    }),
                    // The record's fields, whether it stores a response, whether it is in
                    // doubt; the response beside them, moved in (never copied).
                    (Packed::Text(b"existing"), 10) => {
                        let [_, _, stored @ .., has_response, in_doubt] = fields;
                        let flag = |value, name| record::packed_integer(value, name);
                        record::found(
                            &stored,
                            record::stores_response(flag(has_response, "stored")?)?,
                            response,
                            now,
                            flag(in_doubt, "doubt")? == 1,
                            request,
                        )
                    }
                    (_, count) => Err(Error::store(
                        BACKEND,
                        StoreErrorKind::Other,
                        format!("reserve answered {count} values of an unknown form"),
                    )),
                }
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
                let Some((previous, completed)) = acquire.replaces() else {
                    return Ok(Reserved::Lost);
                };
                let request = claim.request();
                let mut invocation = scripts().replace.prepare_invoke();
                invocation
                    .key(self.key_of(request.id()))
                    .arg(previous.as_bytes().as_slice())
                    .arg(if completed { "1" } else { "0" })
                    .arg(request.fingerprint().as_bytes().as_slice())
                    .arg(claim.token().as_bytes().as_slice())
                    .arg(bounded_millis(
                        claim.lease_for(),
                        Policy::MAX_LEASE,
                        "lease",
                    )?)
                    .arg(duration_millis(self.grace))
                    .arg(record::triple(request.id()))
                    .arg(&*self.holder)
                    .arg(self.header_flag());
                match self.conns.invoke(&invocation).await? {
                    Value::Nil => Ok(Reserved::Lost),
                    until => Ok(Reserved::Written {
                        until: timestamp(integer(&until, "deadline")?)?,
                    }),
                }
            })
            .await
    }

    async fn complete(&self, completion: &Completion, deadline: Deadline) -> Result<(), Error> {
        deadline
            .bound(Operation::Complete, async {
                let key = self.key_of(completion.id());
                let mut invocation = scripts().complete.prepare_invoke();
                invocation
                    .key(&key)
                    .arg(completion.token().as_bytes().as_slice())
                    .arg(completion.encoded())
                    .arg(bounded_millis(
                        completion.retain_for(),
                        Policy::MAX_RETENTION,
                        "retention",
                    )?)
                    .arg(completion.doubt().unwrap_or_default())
                    .arg(self.header_flag());
                let Some(within) = self.wait_for_replica else {
                    return self.fenced(&invocation).await;
                };
                // The WAIT takes at most half of what is left of the call's deadline: a
                // completion that landed is never turned into a timeout by its replica.
                let within = || within.min(deadline.remaining() / 2);
                let (reply, acknowledged) = self
                    .conns
                    .invoke_then_wait(&invocation, &key, within)
                    .await?;
                match integer(&reply, "fenced result")? {
                    1 => {
                        if acknowledged.is_none_or(|count| count < 1) {
                            tracing::warn!(
                                target: "idem_redis",
                                within = ?self.wait_for_replica,
                                "a completion was not acknowledged by a replica in time: a \
                                 failover may lose it"
                            );
                        }
                        Ok(())
                    }
                    _ => Err(Error::LeaseLost),
                }
            })
            .await
    }

    async fn release(&self, lease: &Lease, deadline: Deadline) -> Result<(), Error> {
        deadline
            .bound(Operation::Release, async {
                let mut invocation = scripts().release.prepare_invoke();
                invocation
                    .key(self.key_of(lease.id()))
                    .arg(lease.token().as_bytes().as_slice());
                self.fenced(&invocation).await
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
                let mut invocation = scripts().renew.prepare_invoke();
                invocation
                    .key(self.key_of(lease.id()))
                    .arg(lease.token().as_bytes().as_slice())
                    .arg(bounded_millis(lease_for, Policy::MAX_LEASE, "lease")?)
                    .arg(duration_millis(self.grace));
                match self.conns.invoke(&invocation).await? {
                    Value::Nil => Err(Error::LeaseLost),
                    until => timestamp(integer(&until, "deadline")?),
                }
            })
            .await
    }

    /// Redis deletes expired records itself: nothing to purge.
    async fn purge_expired(&self, _limit: usize, deadline: Deadline) -> Result<usize, Error> {
        deadline.bound(Operation::Purge, async { Ok(0) }).await
    }

    /// `lua/resolve.lua` on the record and its audit trail (one hash slot): fenced on the
    /// token, the mark as read and the record being live and completed by Redis's clock; the
    /// change and the entry in one script.
    async fn resolve(&self, resolution: &Resolution, deadline: Deadline) -> Result<bool, Error> {
        deadline
            .bound(Operation::Resolve, async {
                let record_key = self.key_of(resolution.id());
                let trail_key = audit::key(&record_key);
                let mut invocation = scripts().resolve.prepare_invoke();
                crate::resolve::prepare(&mut invocation, resolution, &record_key, &trail_key);
                match integer(&self.conns.invoke(&invocation).await?, "resolve result")? {
                    1 => Ok(true),
                    0 => Ok(false),
                    other => Err(Error::store(
                        BACKEND,
                        StoreErrorKind::Other,
                        format!("resolve returned {other}"),
                    )),
                }
            })
            .await
    }

    /// The record's protocol fields only: what operators read beside it (its holder, its
    /// times) is not even fetched, so no value of theirs can change what the engine decides.
    async fn lookup(&self, id: &RecordId, deadline: Deadline) -> Result<Option<Record>, Error> {
        deadline
            .bound(Operation::Lookup, async {
                let mut invocation = scripts().lookup.prepare_invoke();
                invocation.key(self.key_of(id));
                match self.conns.invoke(&invocation).await? {
                    Value::Nil => Ok(None),
                    Value::Array(fields) => Ok(Some(decoded_record(fields, id)?)),
                    other => Err(unexpected("lookup", &other)),
                }
            })
            .await
    }

    fn capabilities(&self) -> Capabilities {
        Capabilities::default()
            .with_server_ttl(true)
            .with_change_feed(self.feed.enabled)
            .with_read_first(self.read_first)
    }

    /// `PUBLISH <channel> <digest>` through the store's connection, from a task of its own
    /// (nothing waits for it), cut off after one connection timeout plus one response timeout.
    fn announce(&self, id: &RecordId) {
        if !self.feed.enabled {
            return;
        }
        let Ok(runtime) = tokio::runtime::Handle::try_current() else {
            return;
        };
        let (conns, feed) = (Arc::clone(&self.conns), Arc::clone(&self.feed));
        let digest = digest_to_hex(&id.digest());
        let within = self.announce_within;
        drop(runtime.spawn(async move {
            let sent = tokio::time::timeout(within, conns.publish(&feed.channel, &digest)).await;
            if !matches!(sent, Ok(Ok(()))) {
                tracing::debug!(
                    target: "idem_redis",
                    "an announcement could not be published: waiters elsewhere poll for it"
                );
            }
        }));
    }

    /// Starts the change feed (`crate::feed`) on a task of the current runtime.
    fn watch(&self, changes: Changes) -> bool {
        self.feed.enabled
            && crate::feed::feed(
                &self.conns,
                &self.feed,
                (*self.subscribers).clone(),
                changes,
            )
            .spawn()
    }
}

#[async_trait]
impl Operator for RedisStore {
    fn listing_order(&self) -> ListingOrder {
        ListingOrder::Scan
    }

    async fn inspect(&self, id: &RecordId, deadline: Deadline) -> Result<Option<Inspected>, Error> {
        deadline
            .bound(Operation::Inspect, async {
                let mut invocation = scripts().lookup.prepare_invoke();
                invocation.key(self.key_of(id)).arg("1");
                match self.conns.invoke(&invocation).await? {
                    Value::Nil => Ok(None),
                    Value::Array(mut fields) => {
                        let (
                            Some(check_at),
                            Some(mark),
                            Some(holder),
                            Some(completed_at),
                            Some(reserved_at),
                        ) = (
                            fields.pop(),
                            fields.pop(),
                            fields.pop(),
                            fields.pop(),
                            fields.pop(),
                        )
                        else {
                            return Err(unexpected("lookup", &Value::Array(fields)));
                        };
                        let record = decoded_record(fields, id)?;
                        let provenance = record::shown_for(
                            record::provenance(&reserved_at, &completed_at, &holder),
                            record.is_completed(),
                        );
                        let (doubt, check_at) = record::doubt(&mark, &check_at)?;
                        Ok(Some(Inspected {
                            record,
                            provenance,
                            doubt,
                            check_at,
                        }))
                    }
                    other => Err(unexpected("lookup", &other)),
                }
            })
            .await
    }
    /// By `SCAN` of the prefix (every master of a Cluster in turn): bounded work per call, in
    /// the server's order, a page possibly short or empty before the end (see the crate docs).
    async fn list(&self, query: &ListQuery, deadline: Deadline) -> Result<Page, Error> {
        deadline
            .bound(Operation::List, async { self.scanner().list(query).await })
            .await
    }
    /// A `SCAN` of the whole prefix (every master of a Cluster), read in pipelined batches.
    async fn stats(&self, deadline: Deadline) -> Result<Stats, Error> {
        deadline
            .bound(Operation::List, async { self.scanner().stats().await })
            .await
    }

    /// The audit trail's list (`lua/reconciliations.lua`, one read with Redis's clock): its
    /// elements still kept, oldest first, at most the newest [`ListQuery::MAX_LIMIT`] (the list
    /// keeps no more). An element that does not decode is [`Error::CorruptRecord`].
    async fn reconciliations(
        &self,
        id: &RecordId,
        deadline: Deadline,
    ) -> Result<Vec<Reconciliation>, Error> {
        deadline
            .bound(Operation::Inspect, async {
                let mut invocation = scripts().reconciliations.prepare_invoke();
                invocation.key(self.audit_key_of(id));
                let reply = self.conns.invoke(&invocation).await?;
                let bad = || unexpected("reconciliations", &reply);
                let Value::Array(parts) = &reply else {
                    return Err(bad());
                };
                let [now, Value::Array(elements)] = parts.as_slice() else {
                    return Err(bad());
                };
                let now = timestamp(integer(now, "now")?)?;
                let mut kept = Vec::with_capacity(elements.len());
                for element in elements {
                    let element = Element::parse(text(element, "audit entry")?)?;
                    if element.kept_until > now {
                        kept.push(element.decode()?);
                    }
                }
                Ok(kept)
            })
            .await
    }
}

/// `HMGET key fields…`, then `TIME`, in one pipeline, its buffers sized once: grown an
/// argument at a time, they cost a read about 2 000 client instructions more (4%).
fn fields_then_time(key: &str, fields: &[&str]) -> redis::Pipeline {
    let size = key.len() + fields.iter().map(|f| f.len()).sum::<usize>();
    let mut hmget = redis::Cmd::with_capacity(fields.len() + 2, size + 5);
    hmget.arg("HMGET").arg(key).arg(fields);
    let mut time = redis::Cmd::with_capacity(1, 4);
    time.arg("TIME");
    let mut pipe = redis::Pipeline::with_capacity(2);
    pipe.add_command(hmget).add_command(time);
    pipe
}

/// A record read by `lua/lookup.lua` (its protocol fields), response decoded.
fn decoded_record(fields: Vec<Value>, id: &RecordId) -> Result<Record, Error> {
    record::decode(fields, id)?.try_map_response(|response| {
        StoredResponse::decode(&response.ok_or_else(|| {
            Error::CorruptRecord("redis record: a completed record without a response".to_owned())
        })?)
    })
}

/// `duration` in milliseconds, refused above `max` (the bound the engine's [`Policy`] keeps):
/// a direct [`Store`] call with a longer lease or retention writes nothing, where a script
/// would write the record and then fail to set its expiry (a record Redis never deletes).
fn bounded_millis(duration: Duration, max: Duration, what: &str) -> Result<i64, Error> {
    if duration > max {
        return Err(Error::InvalidInput {
            field: Field::Config,
            reason: format!("a {what} of {duration:?} is over {max:?}"),
        });
    }
    Ok(duration_millis(duration))
}
