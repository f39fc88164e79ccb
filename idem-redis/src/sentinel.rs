//! Redis under Sentinel (C13: a store given several hosts follows a failover without a
//! restart): where the master is, asked of the sentinels every time a connection is opened.
//!
//! The store's connection, the heartbeat's and the change feed's subscription each ask the
//! sentinels for the master of the name when they are opened, and again when they are
//! rebuilt (`crate::supervised`). A master that died, or was demoted to a replica, makes
//! calls fail unavailable (a refused or lost connection, a timeout, a `READONLY` reply,
//! [`crate::classify`]), which rebuilds the connection: it goes where the sentinels say the
//! master now is. Until they have promoted a replica, they name no valid master (the old one
//! is down, or fails the `ROLE` check), so the rebuild fails and the next one follows after
//! the back-off.

use redis::aio::MultiplexedConnection;
use redis::io::tcp::TcpSettings;
use redis::sentinel::{SentinelClient, SentinelNodeConnectionInfo, SentinelServerType};
use redis::{ConnectionInfo, RedisResult};

/// The sentinel a store asks which master it names, and a connection to it kept between
/// questions.
#[derive(Default)]
pub(crate) struct Asking {
    at: usize,
    conn: Option<MultiplexedConnection>,
}

impl Asking {
    /// Asks the next sentinel from now on.
    pub(crate) fn next(&mut self) {
        self.at = self.at.wrapping_add(1);
        self.conn = None;
    }
}

/// The sentinels of one master name; see the [module](self).
#[derive(Debug, Clone)]
pub(crate) struct Sentinels {
    /// The sentinels' addresses, asked in this order.
    sentinels: Vec<ConnectionInfo>,
    /// The master's name in the sentinels' configuration (`sentinel monitor <name> ...`).
    master: String,
    /// How the master is connected to.
    node: SentinelNodeConnectionInfo,
}

impl Sentinels {
    /// The sentinels at `urls` (`redis://host:26379`), watching `master`; every connection,
    /// to a sentinel or to the master, with `tcp`.
    pub(crate) fn new(urls: &[&str], master: &str, tcp: &TcpSettings) -> RedisResult<Self> {
        let sentinels = urls
            .iter()
            .map(|url| crate::tcp::info(url, tcp))
            .collect::<RedisResult<Vec<_>>>()?;
        // Checked now, so that a lookup never meets a bad configuration.
        SentinelClient::build(
            sentinels.clone(),
            master.to_owned(),
            None,
            SentinelServerType::Master,
        )?;
        Ok(Self {
            sentinels,
            master: master.to_owned(),
            node: SentinelNodeConnectionInfo::default().set_tcp_settings(tcp.clone()),
        })
    }

    /// A client for the master as the sentinels name it now, checked with `ROLE` (redis-rs's
    /// lookup: the first sentinel, in order, that names a master up and confirmed wins).
    /// Unbounded here: the caller bounds it. Boxed: the lookup's future is deep, and every
    /// call that may open a connection would carry it.
    pub(crate) async fn master(&self) -> RedisResult<redis::Client> {
        let mut client = SentinelClient::build(
            self.sentinels.clone(),
            self.master.clone(),
            Some(self.node.clone()),
            SentinelServerType::Master,
        )?;
        Box::pin(async move { client.async_get_client().await }).await
    }

    /// The master's address as the sentinel `asking` names it (`SENTINEL
    /// get-master-addr-by-name`, no check of the master: a cheap question, asked often), or
    /// the next one that answers. `None`: the sentinel does not know the name.
    pub(crate) async fn named_master(
        &self,
        asking: &mut Asking,
    ) -> RedisResult<Option<(String, u16)>> {
        let mut cmd = redis::cmd("SENTINEL");
        cmd.arg("get-master-addr-by-name").arg(&self.master);
        let mut last_error = None;
        for _ in 0..self.sentinels.len() {
            let mut conn = match asking.conn.take() {
                Some(conn) => conn,
                None => match self.connect(asking.at % self.sentinels.len()).await {
                    Ok(conn) => conn,
                    Err(error) => {
                        last_error = Some(error);
                        asking.next();
                        continue;
                    }
                },
            };
            match cmd.query_async::<Option<(String, u16)>>(&mut conn).await {
                Ok(named) => {
                    asking.conn = Some(conn);
                    return Ok(named);
                }
                Err(error) => {
                    last_error = Some(error);
                    asking.next();
                }
            }
        }
        Err(last_error.unwrap_or_else(|| {
            redis::RedisError::from((redis::ErrorKind::EmptySentinelList, "no sentinel"))
        }))
    }

    /// A connection to sentinel `n` (redis-rs's default timeouts: 1 s to connect, 500 ms an
    /// answer).
    async fn connect(&self, n: usize) -> RedisResult<MultiplexedConnection> {
        let info = self.sentinels.get(n).cloned().ok_or_else(|| {
            redis::RedisError::from((redis::ErrorKind::EmptySentinelList, "no sentinel"))
        })?;
        redis::Client::open(info)?
            .get_multiplexed_async_connection()
            .await
    }
}
