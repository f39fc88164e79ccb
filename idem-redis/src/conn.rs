//! The connection: one Redis or a Redis Cluster, and how to open one. Every record operation is
//! a script on its key, routed by the key's slot; a scan also needs the nodes themselves (every
//! master of a Cluster) and commands sent to one of them.

use crate::error::{classify, store_error, unexpected, BACKEND};
use crate::sentinel::Sentinels;
use idem_core::{Error, StoreErrorKind};
use redis::aio::{ConnectionManager, ConnectionManagerConfig};
use redis::cluster::ClusterClient;
use redis::cluster_async::ClusterConnection;
use redis::cluster_routing::{
    MultipleNodeRoutingInfo, Route, RoutingInfo, SingleNodeRoutingInfo, SlotAddr,
};
use redis::{Cmd, ConnectionAddr, FromRedisValue, Pipeline, RedisResult, ScriptInvocation, Value};
use std::fmt;
use std::time::Duration;

/// A connection. Its socket is driven by a task of the runtime it was opened on (the manager's
/// or the cluster client's), so a call made elsewhere waits for that runtime's workers.
#[derive(Clone)]
pub(crate) enum Conn {
    Single(ConnectionManager),
    Cluster(ClusterConnection),
    /// The master the sentinels named when it was opened, and its address.
    Sentinel(ConnectionManager, ConnectionAddr),
}

/// Where a [`Conn`] goes: the client, with the settings the store applies (response and
/// connection timeouts, no hidden reconnect retries on one Redis), so every connection the
/// store opens behaves the same. Under Sentinel, the master the sentinels name at the time,
/// with the settings of one Redis.
pub(crate) enum Target {
    Single(redis::Client, ConnectionManagerConfig),
    Cluster(ClusterClient),
    Sentinel(Sentinels, ConnectionManagerConfig),
}

/// What opens every [`Conn`] of a store (its first, each rebuild, the heartbeat's, one on a
/// newly promoted master): the target, and whether each connection opened is checked for a
/// Redis that may evict records (see [`refuse_eviction`]) before anything uses it.
pub(crate) struct Opener {
    target: Target,
    refuse_eviction: bool,
}

impl Opener {
    /// Opens connections to `target`; `refuse_eviction` unless the builder allows eviction.
    pub(crate) fn new(target: Target, refuse_eviction: bool) -> Self {
        Self {
            target,
            refuse_eviction,
        }
    }

    pub(crate) fn is_cluster(&self) -> bool {
        matches!(self.target, Target::Cluster(_))
    }

    /// Whether the connections it opens are checked for a Redis that may evict records.
    pub(crate) fn refuses_eviction(&self) -> bool {
        self.refuse_eviction
    }

    /// Checks `conn`, opened earlier, again: the policy may have been changed since (`CONFIG
    /// SET`). A refusal is misconfigured, as at opening.
    pub(crate) async fn check(&self, conn: &Conn) -> Result<(), Error> {
        if self.refuse_eviction {
            refuse_eviction(conn).await?;
        }
        Ok(())
    }

    /// Opens a connection, driven by the current runtime, and checks it: one refused (a
    /// Redis that may evict records) is dropped, and its error returned.
    pub(crate) async fn open(&self) -> Result<Conn, Error> {
        let conn = self.connect().await?;
        if self.refuse_eviction {
            refuse_eviction(&conn).await?;
        }
        Ok(conn)
    }

    async fn connect(&self) -> Result<Conn, Error> {
        match &self.target {
            Target::Single(client, config) => client
                .get_connection_manager_with_config(config.clone())
                .await
                .map(Conn::Single),
            Target::Cluster(client) => client.get_async_connection().await.map(Conn::Cluster),
            Target::Sentinel(sentinels, config) => match sentinels.master().await {
                Ok(client) => {
                    let address = client.get_connection_info().addr().clone();
                    client
                        .get_connection_manager_with_config(config.clone())
                        .await
                        .map(|conn| Conn::Sentinel(conn, address))
                }
                Err(error) => Err(error),
            },
        }
        .map_err(store_error)
    }
}

/// Refuses a Redis whose `maxmemory-policy` may evict our records (anything but
/// `noeviction`): an evicted record makes its key new again while the first holder still runs,
/// or a completed one after it (C14). Asked of every connection the store opens, and again of
/// those in use every few seconds (`crate::connections::RECHECK_EVERY`): on a
/// Cluster, of every node the cluster client is connected to (masters and replicas, a replica
/// being a master after a failover). A Redis that does not answer `CONFIG GET` is refused too,
/// with the way out.
///
/// Not asked: a node the cluster client connects to by itself later (redis-rs 1.8 has no
/// hook for it; the next rebuild asks it), a node the fan-out skips for having no connection,
/// and a connection manager reconnecting to the same address.
async fn refuse_eviction(conn: &Conn) -> Result<(), Error> {
    let mut cmd = redis::cmd("CONFIG");
    cmd.arg("GET").arg("maxmemory-policy");
    let answers = match conn {
        Conn::Single(_) | Conn::Sentinel(..) => vec![conn.query::<Value>(&cmd).await],
        Conn::Cluster(conn) => {
            let every_node = RoutingInfo::MultiNode((MultipleNodeRoutingInfo::AllNodes, None));
            match conn.clone().route_command(cmd, every_node).await {
                // One answer a node, a node's own error among them.
                Ok(Value::Map(answers)) => answers
                    .into_iter()
                    .map(|(_, answer)| match answer {
                        Value::ServerError(error) => Err(error.into()),
                        answer => Ok(answer),
                    })
                    .collect(),
                Ok(other) => return Err(unexpected("CONFIG GET on every node", &other)),
                Err(error) => vec![Err(error)],
            }
        }
    };
    for answer in answers {
        let pair = answer.and_then(|value| Ok(Vec::<String>::from_redis_value(value)?));
        let policy = match pair {
            Ok(pair) => pair.get(1).cloned().unwrap_or_default(),
            // A Redis that is down or does not answer in time: retry later, not an operator's
            // error (C13).
            Err(error) if classify(&error) == StoreErrorKind::Unavailable => {
                return Err(store_error(error))
            }
            Err(error) => {
                return Err(Error::store(
                    BACKEND,
                    StoreErrorKind::Misconfigured,
                    format!(
                        "cannot read maxmemory-policy ({error}); if it is noeviction, say so with RedisStoreBuilder::allow_eviction(true)"
                    ),
                ))
            }
        };
        if policy != "noeviction" {
            return Err(Error::store(
                BACKEND,
                StoreErrorKind::Misconfigured,
                format!(
                    "maxmemory-policy is {policy}: Redis may evict idempotency records and an effect would run twice; set it to noeviction"
                ),
            ));
        }
    }
    Ok(())
}

/// A node that holds records: the one Redis, or a master of a Cluster by the address the
/// cluster client knows it by. The order is the order a scan visits the masters in.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
pub(crate) enum Node {
    Only,
    Master { host: String, port: u16 },
}

impl fmt::Display for Node {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Node::Only => f.write_str("the Redis"),
            Node::Master { host, port } => write!(f, "{host}:{port}"),
        }
    }
}

/// A command's own answer: its error (in a pipeline or a fan-out, an error is one answer among
/// others) as an error.
pub(crate) fn answer(value: Value) -> Result<Value, Error> {
    match value {
        Value::ServerError(error) => Err(store_error(error.into())),
        value => Ok(value),
    }
}

impl Conn {
    /// The master's address, for a connection opened where the sentinels said it was.
    pub(crate) fn sentinel_master(&self) -> Option<&ConnectionAddr> {
        match self {
            Conn::Sentinel(_, address) => Some(address),
            Conn::Single(_) | Conn::Cluster(_) => None,
        }
    }

    /// Runs `cmd` where the client routes it, with redis-rs's own error.
    pub(crate) async fn query<T: FromRedisValue>(&self, cmd: &Cmd) -> RedisResult<T> {
        match self {
            Conn::Single(conn) | Conn::Sentinel(conn, _) => {
                cmd.query_async(&mut conn.clone()).await
            }
            Conn::Cluster(conn) => cmd.query_async(&mut conn.clone()).await,
        }
    }

    pub(crate) async fn invoke(&self, invocation: &ScriptInvocation<'_>) -> Result<Value, Error> {
        match self {
            Conn::Single(conn) | Conn::Sentinel(conn, _) => {
                invocation.invoke_async(&mut conn.clone()).await
            }
            Conn::Cluster(conn) => invocation.invoke_async(&mut conn.clone()).await,
        }
        .map_err(store_error)
    }

    /// `WAIT 1 <within>` where `key` lives (on a Cluster, its slot's master): how many
    /// replicas acknowledged every write this connection made before it, after at most
    /// `within` (more than zero: `WAIT 1 0` waits for ever).
    pub(crate) async fn wait_for_replica(&self, key: &str, within: Duration) -> Result<i64, Error> {
        let mut cmd = redis::cmd("WAIT");
        cmd.arg(1)
            .arg(u64::try_from(within.as_millis()).unwrap_or(u64::MAX).max(1));
        let acknowledged = match self {
            Conn::Single(conn) | Conn::Sentinel(conn, _) => {
                cmd.query_async(&mut conn.clone()).await
            }
            Conn::Cluster(conn) => {
                let route = Route::with_key(key.as_bytes(), SlotAddr::Master);
                conn.clone()
                    .route_command(
                        cmd,
                        RoutingInfo::SingleNode(SingleNodeRoutingInfo::SpecificNode(route)),
                    )
                    .await
            }
        }
        // The completion before it landed: whatever WAIT fails with (the master demoted under
        // it, `UNBLOCKED`; a replica by now, `ERR WAIT cannot be used with replica instances`;
        // a lost link) is unavailable, so that the engine retries the completion, which lands
        // on the new master or is found landed. Taken for a refusal, it would store the 500 of
        // a refused completion in place of the answer (C8).
        .map_err(|error| Error::store(BACKEND, StoreErrorKind::Unavailable, error))?;
        match acknowledged {
            Value::Int(count) => Ok(count),
            // A Cluster's routed command gives the node's error as a value.
            Value::ServerError(error) => Err(Error::store(
                BACKEND,
                StoreErrorKind::Unavailable,
                redis::RedisError::from(error),
            )),
            other => Err(unexpected("WAIT", &other)),
        }
    }

    /// The nodes that hold records, in order: the one Redis, or every master of the Cluster
    /// (asked of the cluster client, which names them as it routes to them).
    pub(crate) async fn nodes(&self) -> Result<Vec<Node>, Error> {
        let Conn::Cluster(conn) = self else {
            return Ok(vec![Node::Only]);
        };
        let every_master = RoutingInfo::MultiNode((MultipleNodeRoutingInfo::AllMasters, None));
        let reply = conn
            .clone()
            .route_command(redis::cmd("PING"), every_master)
            .await
            .map_err(store_error)?;
        let Value::Map(answers) = reply else {
            return Err(unexpected("PING on every master", &reply));
        };
        let mut nodes = answers
            .into_iter()
            .map(|(address, pong)| {
                answer(pong)?;
                let parsed = match &address {
                    Value::BulkString(text) => std::str::from_utf8(text)
                        .ok()
                        .and_then(|text| text.rsplit_once(':'))
                        .and_then(|(host, port)| Some((host.to_owned(), port.parse().ok()?))),
                    _ => None,
                };
                let (host, port) = parsed.ok_or_else(|| unexpected("a master", &address))?;
                Ok(Node::Master { host, port })
            })
            .collect::<Result<Vec<_>, Error>>()?;
        nodes.sort_unstable();
        Ok(nodes)
    }

    fn route(node: &Node) -> Result<SingleNodeRoutingInfo, Error> {
        match node {
            Node::Master { host, port } => Ok(SingleNodeRoutingInfo::ByAddress {
                host: host.clone(),
                port: *port,
            }),
            Node::Only => Err(Error::store(
                BACKEND,
                StoreErrorKind::Other,
                "a command for a Cluster named no master",
            )),
        }
    }

    /// Runs `cmd` on `node`.
    pub(crate) async fn query_on(&self, node: &Node, cmd: &Cmd) -> Result<Value, Error> {
        match self {
            Conn::Single(conn) | Conn::Sentinel(conn, _) => {
                cmd.query_async(&mut conn.clone()).await
            }
            Conn::Cluster(conn) => {
                let route = RoutingInfo::SingleNode(Self::route(node)?);
                conn.clone().route_command(cmd.clone(), route).await
            }
        }
        .map_err(store_error)
    }

    /// Runs `pipe`, whose commands are on one key, where the key lives, in one round trip.
    pub(crate) async fn pipeline(&self, pipe: &Pipeline) -> Result<Vec<Value>, Error> {
        match self {
            Conn::Single(conn) | Conn::Sentinel(conn, _) => {
                pipe.query_async(&mut conn.clone()).await
            }
            Conn::Cluster(conn) => pipe.query_async(&mut conn.clone()).await,
        }
        .map_err(store_error)
    }

    /// Runs `pipe` on `node` in one round trip: one answer per command, a command's error
    /// among them as [`Value::ServerError`] (see [`answer`]).
    pub(crate) async fn pipeline_on(
        &self,
        node: &Node,
        mut pipe: Pipeline,
    ) -> Result<Vec<Value>, Error> {
        pipe.ignore_errors();
        match self {
            Conn::Single(conn) | Conn::Sentinel(conn, _) => {
                pipe.query_async(&mut conn.clone()).await
            }
            Conn::Cluster(conn) => {
                let count = pipe.len();
                conn.clone()
                    .route_pipeline(pipe, 0, count, Self::route(node)?)
                    .await
            }
        }
        .map_err(store_error)
    }
}
