//! The change feed's Redis mechanics (C5, C13): a pub/sub connection SUBSCRIBEd to the channel
//! what other processes announce (`PUBLISH <channel> <digest>`), and pings published through
//! the store's connection. The supervision (pings every interval, the ping deadline,
//! resubscription with back-off, [`Changes::missed`] after every (re)subscription, the end once
//! the engines are gone) is the core's [`Feed`](idem_ops::feed::Feed).
//!
//! - **Its own connection.** The subscription is a connection of its own (RESP2 pub/sub),
//!   outside the store's supervised connection, which no waiter holds. On a Redis Cluster a
//!   `PUBLISH` reaches the subscribers of every node, so the feed subscribes on one seed node
//!   and moves to the next one each time a subscription fails or cannot be opened.
//! - **Pings** are `PUBLISH`es through the store's connection, as announcements travel, on
//!   `<channel>:ping:<16 random hex digits>`, a channel only this feed follows.
//! - Each replacement is a warn log on target `idem_redis`.

use crate::connections::Connections;
use crate::feed_settings::{ping_prefix, FeedSettings};
use crate::sentinel::Sentinels;
use futures_core::Stream;
use idem_core::store::Changes;
use idem_core::Error;
use idem_ops::feed::{Feed, Listen, Received};
use redis::aio::{PubSubSink, PubSubStream};
use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;

/// Where and how the feed subscribes.
#[derive(Debug, Clone)]
pub(crate) struct Subscribers {
    /// The nodes it subscribes on.
    pub(crate) nodes: Nodes,
    /// How long opening a subscription (the master's address asked, connection and
    /// SUBSCRIBE) may take.
    pub(crate) connect_within: Duration,
}

/// The nodes a feed subscribes on.
#[derive(Debug, Clone)]
pub(crate) enum Nodes {
    /// The one Redis, or a Cluster's seed nodes, tried in turn.
    Fixed(Vec<redis::Client>),
    /// The master the sentinels name each time a subscription is opened: after a failover,
    /// the new one.
    Sentinel(Sentinels),
}

impl Nodes {
    /// The client of the `n`th subscription.
    async fn client(&self, n: usize) -> Result<redis::Client, String> {
        match self {
            Nodes::Fixed(clients) => clients
                .get(n % clients.len().max(1))
                .cloned()
                .ok_or_else(|| "no node to subscribe on".to_owned()),
            Nodes::Sentinel(sentinels) => sentinels.master().await.map_err(|e| e.to_string()),
        }
    }
}

/// The feed of a store, delivering to `changes`.
pub(crate) fn feed(
    conns: &Arc<Connections>,
    settings: &FeedSettings,
    subscribers: Subscribers,
    changes: Changes,
) -> Feed<RedisListen> {
    let listen = RedisListen {
        subscribers,
        node: 0,
    };
    Feed::new(
        listen,
        Arc::downgrade(conns),
        settings,
        &ping_prefix(settings),
        changes,
    )
}

/// How one store's feed subscribes and pings.
pub(crate) struct RedisListen {
    subscribers: Subscribers,
    /// How many subscriptions were opened or tried: the next one is on the next seed node.
    node: usize,
}

/// A subscription: the stream of its messages, and the sink that keeps its connection open.
pub(crate) struct Subscription {
    /// Dropping it would end the connection.
    _sink: PubSubSink,
    stream: PubSubStream,
}

impl Listen for RedisListen {
    type Listener = Subscription;
    type Store = Connections;

    /// A new pub/sub connection to the next seed node, subscribed to the channel and the pings.
    async fn connect(&mut self, channels: [&str; 2]) -> Result<Subscription, String> {
        let (nodes, n) = (&self.subscribers.nodes, self.node);
        self.node = self.node.wrapping_add(1);
        let within = self.subscribers.connect_within;
        let open = async {
            let client = nodes.client(n).await?;
            let mut pubsub = client.get_async_pubsub().await.map_err(|e| e.to_string())?;
            pubsub
                .subscribe(&channels)
                .await
                .map_err(|e| e.to_string())?;
            Ok::<_, String>(pubsub)
        };
        match tokio::time::timeout(within, open).await {
            Ok(Ok(pubsub)) => {
                let (sink, stream) = pubsub.split();
                Ok(Subscription {
                    _sink: sink,
                    stream,
                })
            }
            Ok(Err(error)) => Err(error),
            Err(_) => Err(format!("no subscription within {within:?}")),
        }
    }

    async fn receive(&self, listener: &mut Subscription) -> Result<Option<Received>, String> {
        let stream = &mut listener.stream;
        let message = std::future::poll_fn(|cx| Pin::new(&mut *stream).poll_next(cx)).await;
        Ok(message.map(|message| Received {
            channel: message.get_channel_name().to_owned(),
            payload: message.get_payload_bytes().to_vec(),
        }))
    }

    /// `PUBLISH` through the store's connection.
    async fn ping(conns: Arc<Connections>, channel: String, payload: String) -> Result<(), Error> {
        conns.publish(&channel, &payload).await
    }

    idem_ops::feed_report!(
        target: "idem_redis",
        replacing: "the change feed's subscription failed: subscribing again",
        ping_not_sent: "the change feed's ping could not be published",
    );
}
