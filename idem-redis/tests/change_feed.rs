//! The change feed (C5, C13) on Redis: the shared change-feed scenarios
//! (`idem_core::testing`, two stores, two clients, two engines: two processes), the waiter woken
//! by the original's announcement (`PUBLISH`) through its subscription; and on a Redis Cluster,
//! whichever node each waiter subscribed on (a `PUBLISH` reaches the subscribers of every node),
//! and a failed subscription moving to the next seed node. A subscription is killed by the
//! server (`CLIENT KILL TYPE pubsub`, on a Redis of the scenario's own, whose pub/sub clients
//! are the feed's alone), and vanishes silently through a fault proxy that the waiter's whole
//! store goes through.

mod common;
mod support;

use common::{cluster_nodes, redis_url, start_on_free_port, temp_dir, Server};
use fault_proxy::{Fault, FaultProxy};
use idem_core::testing::{waiting_engine, ChangeFeedHarness, FeedFault, Rounds};
use idem_core::{FencingToken, Idempotency};
use idem_redis::redis;
use idem_redis::{RedisStore, RedisStoreBuilder};
use std::time::Duration;
use support::private_cluster::PrivateCluster;

/// Settings no other test shares: a key prefix and a channel of this test's own.
fn settings(prefix: &str, channel: &str) -> RedisStoreBuilder {
    RedisStore::builder().prefix(prefix).channel(channel)
}

/// A prefix and a channel for one test.
fn names() -> (String, String) {
    let token = FencingToken::generate().to_string();
    (format!("t{token}"), format!("idem:changes:{token}"))
}

/// Runs `cmd` on the Redis at `url`.
async fn raw<T: redis::FromRedisValue>(url: &str, cmd: &redis::Cmd) -> T {
    let client = redis::Client::open(url).expect("a client");
    let mut conn = client
        .get_multiplexed_async_connection()
        .await
        .expect("connect");
    cmd.query_async(&mut conn).await.expect("a command")
}

/// How many subscribers `channel` has on the Redis at `url`.
async fn subscribers(url: &str, channel: &str) -> i64 {
    let reply: Vec<redis::Value> = raw(url, redis::cmd("PUBSUB").arg("NUMSUB").arg(channel)).await;
    match reply.get(1) {
        Some(redis::Value::Int(n)) => *n,
        other => panic!("PUBSUB NUMSUB answered {other:?}"),
    }
}

/// Waits until `channel` has `count` subscribers on the Redis at `url`, at most `limit`.
async fn until_subscribers(url: &str, channel: &str, count: usize, limit: Duration) {
    let site = Site {
        prefix: String::new(),
        channel: channel.to_owned(),
        fault: FeedFault::None,
        url: url.to_owned(),
        private: None,
        proxy: None,
    };
    RedisFeeds.until_listeners(&site, count, limit).await;
}

/// The ids of the pub/sub clients of the Redis at `url`.
async fn pubsub_clients(url: &str) -> Vec<String> {
    let list: String = raw(
        url,
        redis::cmd("CLIENT").arg("LIST").arg("TYPE").arg("pubsub"),
    )
    .await;
    list.lines()
        .filter_map(|line| {
            line.split(' ')
                .find_map(|field| field.strip_prefix("id="))
                .map(str::to_owned)
        })
        .collect()
}

/// A redis-server of this test's own: killed, and its directory removed, when dropped.
struct Private {
    _server: Server,
    url: String,
}

impl Private {
    fn start() -> Self {
        let dir = temp_dir();
        let (child, port) = start_on_free_port(&dir, &[]);
        Self {
            _server: Server(child, dir),
            url: format!("redis://127.0.0.1:{port}"),
        }
    }
}

/// Two processes' stores on one prefix and channel.
struct RedisFeeds;

/// One scenario's prefix and channel, its server, and what its fault acts through.
struct Site {
    prefix: String,
    channel: String,
    fault: FeedFault,
    /// The server the stores are on (the scenario's own where the fault kills connections).
    url: String,
    private: Option<Private>,
    /// The proxy the waiter's whole store goes through, and the URL through it.
    proxy: Option<(FaultProxy, String)>,
}

impl Site {
    fn proxy(&self) -> &FaultProxy {
        &self.proxy.as_ref().expect("a site with a proxy").0
    }

    fn store(&self) -> RedisStoreBuilder {
        settings(&self.prefix, &self.channel)
    }
}

#[idem_core::store::async_trait]
impl ChangeFeedHarness for RedisFeeds {
    type Store = RedisStore;
    type Site = Site;

    async fn site(&self, fault: FeedFault) -> Site {
        let (prefix, channel) = names();
        let private = matches!(fault, FeedFault::Killed | FeedFault::Lost).then(Private::start);
        let url = private
            .as_ref()
            .map_or_else(redis_url, |private| private.url.clone());
        let proxy = match fault {
            FeedFault::Silenced { .. } => {
                let proxy = FaultProxy::start(url.trim_start_matches("redis://"))
                    .await
                    .expect("start the fault proxy");
                let through = format!("redis://{}", proxy.addr());
                Some((proxy, through))
            }
            _ => None,
        };
        Site {
            prefix,
            channel,
            fault,
            url,
            private,
            proxy,
        }
    }

    async fn original(&self, site: &Site) -> RedisStore {
        site.store().connect(&site.url).await.expect("connect")
    }

    async fn waiter(&self, site: &Site) -> RedisStore {
        match (site.fault, &site.proxy) {
            // The waiter's store, its subscription included, goes through the proxy.
            (FeedFault::Silenced { every, within }, Some((_, through))) => site
                .store()
                .feed_ping(every, within)
                .response_timeout(within)
                .connection_timeout(within)
                .connect(through)
                .await
                .expect("connect through the proxy"),
            _ => site.store().connect(&site.url).await.expect("connect"),
        }
    }

    async fn listeners(&self, site: &Site) -> usize {
        let count = subscribers(&site.url, &site.channel).await;
        usize::try_from(count).expect("a count")
    }

    async fn listener_connections(&self, site: &Site) -> Vec<String> {
        assert!(
            site.private.is_some(),
            "pub/sub clients of a Redis of its own"
        );
        pubsub_clients(&site.url).await
    }

    async fn kill_listener(&self, site: &Site) {
        let killed: i64 = raw(
            &site.url,
            redis::cmd("CLIENT").arg("KILL").arg("TYPE").arg("pubsub"),
        )
        .await;
        assert_eq!(killed, 1);
    }

    /// The server's side of every connection through the proxy closes; the clients hear
    /// nothing.
    async fn cut(&self, site: &Site) {
        site.proxy().set(Fault::ServerGone);
    }

    async fn mend(&self, site: &Site) {
        if let Some((proxy, _)) = &site.proxy {
            proxy.set(Fault::PassThrough);
        }
    }

    /// Nothing tells the subscription: only its ping does, once the store's own connection (as
    /// silent) has been replaced and can publish it.
    const REPLACED_WITHIN: Duration = Duration::from_secs(8);

    /// The subscription is killed (the feed subscribes again after 100 ms).
    async fn lose_listener(&self, site: &Site) {
        self.kill_listener(site).await;
    }
}

idem_core::change_feed_tests!(RedisFeeds);

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn c05_on_a_cluster_waiters_subscribed_on_every_node_are_woken_by_the_announcement() {
    let (prefix, channel) = names();
    let nodes = cluster_nodes();
    // Each waiter's feed subscribes on the first of its seed nodes: one waiter per node, so
    // the announcement reaches most of them through the cluster's broadcast.
    let rotated = |first: usize| -> Vec<String> {
        (0..nodes.len())
            .map(|i| nodes[(first + i) % nodes.len()].clone())
            .collect()
    };
    let connect = |seeds: Vec<String>| {
        let builder = settings(&prefix, &channel);
        async move {
            let seeds: Vec<&str> = seeds.iter().map(String::as_str).collect();
            builder
                .connect_cluster(&seeds)
                .await
                .expect("connect to the cluster")
        }
    };
    let original = waiting_engine(connect(rotated(0)).await);
    let mut waiters = Vec::new();
    for first in 0..nodes.len() {
        waiters.push(waiting_engine(connect(rotated(first)).await));
    }
    let waiters: Vec<&Idempotency<RedisStore>> = waiters.iter().collect();
    Rounds::new(&original, &waiters)
        .prompt(3, "a Redis Cluster")
        .await;
    for node in &nodes {
        assert_eq!(
            subscribers(node, &channel).await,
            1,
            "one waiter's feed subscribed on {node}"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn c13_on_a_cluster_a_failed_subscription_moves_to_the_next_seed_node() {
    let (prefix, channel) = names();
    // A cluster of this test's own: its pub/sub clients are the feed's alone.
    let mut cluster = PrivateCluster::start();
    let urls = cluster.urls();
    let seeds: Vec<&str> = urls.iter().map(String::as_str).collect();
    let connect = || settings(&prefix, &channel).connect_cluster(&seeds);
    let there = waiting_engine(connect().await.expect("connect to the cluster"));
    let here = waiting_engine(connect().await.expect("connect to the cluster"));
    Rounds::new(&there, &[&here])
        .prompt(1, "on the first seed node")
        .await;
    assert_eq!(
        subscribers(&urls[0], &channel).await,
        1,
        "the first seed node"
    );
    // The node drops the subscription: the feed subscribes on the next seed node...
    let killed: i64 = raw(
        &urls[0],
        redis::cmd("CLIENT").arg("KILL").arg("TYPE").arg("pubsub"),
    )
    .await;
    assert_eq!(killed, 1);
    until_subscribers(&urls[1], &channel, 1, Duration::from_secs(5)).await;
    // ...where the announcements, published wherever the cluster routes them, reach it.
    Rounds::new(&there, &[&here])
        .prompt(2, "on the second seed node")
        .await;
    // A node that dies takes the subscription with it: the feed moves on again.
    cluster.kill(1);
    until_subscribers(&urls[2], &channel, 1, Duration::from_secs(10)).await;
}
