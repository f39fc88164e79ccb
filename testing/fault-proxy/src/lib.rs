//! A TCP proxy that breaks the network on demand, between a client (a store) and a server
//! (PostgreSQL, Redis), on loopback: the stores' fault tests start one in front of the server
//! they break.
//!
//! ```no_run
//! # use fault_proxy::*;
//! # async fn demo(key: &str) -> std::io::Result<()> {
//! let proxy = FaultProxy::start("127.0.0.1:5432").await?;   // listens on 127.0.0.1:<free port>
//! let url = format!("postgres://app@{}/db", proxy.addr());
//! proxy.set(LoseAnswer::to(key.as_bytes()));  // the next request naming the key: answer lost
//! proxy.set(Fault::Freeze);                   // a frozen server, sockets open
//! proxy.set(Fault::HalfOpen(Direction::ToClient));
//! proxy.set(Fault::Delay(std::time::Duration::from_secs(2))); // every piece, two seconds late
//! proxy.set(Fault::ClientGone);               // clients see EOF, the server hears nothing
//! proxy.set(Fault::ServerGone);               // servers see EOF, the client hears nothing
//! proxy.set(Orphan::at(key.as_bytes()));      // the same, for the connection that sends the key
//! proxy.set(Hold::to(COMMIT_QUERY));          // the next COMMIT waits in the proxy...
//! proxy.set(Fault::PassThrough);              // ...until the proxy is switched again
//! # let _ = url;
//! # Ok(())
//! # }
//! ```
//!
//! - [`fault`]: what the proxy can do to the traffic ([`Fault`], [`LoseAnswer`], [`Hold`]);
//! - `link`: one proxied connection;
//! - [`matcher`]: finding a pattern in bytes that arrive in pieces;
//! - `self_test`: each fault against an echo server.
//!
//! The fault applies to every connection, open or to come, from the moment it is set. Dropping
//! the proxy stops it listening and closes every connection it carries.

pub mod fault;
mod link;
pub mod matcher;
#[cfg(test)]
mod self_test;

pub use fault::{
    Direction, Fault, Hold, LoseAnswer, Orphan, COMMIT_QUERY, READY_FOR_QUERY_IDLE,
    READY_FOR_QUERY_IN_TRANSACTION,
};

use std::io;
use std::net::{Ipv4Addr, SocketAddr};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use tokio::net::{lookup_host, TcpListener, TcpStream};
use tokio::sync::watch;
use tokio::task::{JoinHandle, JoinSet};

/// A running proxy; see the [module](self).
#[derive(Debug)]
pub struct FaultProxy {
    addr: SocketAddr,
    control: Arc<Control>,
    accept: JoinHandle<()>,
}

/// What the proxy and its connections share.
#[derive(Debug)]
struct Control {
    faults: watch::Sender<Fault>,
    answers_lost: AtomicUsize,
    requests_held: AtomicUsize,
    orphaned: AtomicUsize,
    connections: AtomicUsize,
}

impl Control {
    /// Claims the armed `lose` for the calling connection, and switches the proxy back to
    /// pass-through: one answer is lost, on one connection. False if it is no longer armed.
    fn claim(&self, lose: &LoseAnswer) -> bool {
        let claimed = self.faults.send_if_modified(|fault| match fault {
            Fault::LoseAnswer(armed) if armed == lose => {
                *fault = Fault::PassThrough;
                true
            }
            _ => false,
        });
        if claimed {
            self.answers_lost.fetch_add(1, Ordering::SeqCst);
        }
        claimed
    }

    /// Claims the armed `orphan` for the calling connection, and switches the proxy back to
    /// pass-through. False if it is no longer armed.
    fn claim_orphan(&self, orphan: &Orphan) -> bool {
        let claimed = self.faults.send_if_modified(|fault| match fault {
            Fault::Orphan(armed) if armed == orphan => {
                *fault = Fault::PassThrough;
                true
            }
            _ => false,
        });
        if claimed {
            self.orphaned.fetch_add(1, Ordering::SeqCst);
        }
        claimed
    }

    /// Claims the armed `hold` for the calling connection: the proxy shows it as
    /// [`Fault::Holding`], which holds that connection only. False if it is no longer armed.
    fn claim_hold(&self, hold: &Hold) -> bool {
        let claimed = self.faults.send_if_modified(|fault| match fault {
            Fault::Hold(armed) if armed == hold => {
                *fault = Fault::Holding(hold.clone());
                true
            }
            _ => false,
        });
        if claimed {
            self.requests_held.fetch_add(1, Ordering::SeqCst);
        }
        claimed
    }
}

impl FaultProxy {
    /// Starts a proxy in front of `upstream` (`host:port`), passing everything through,
    /// listening on a free port of 127.0.0.1.
    pub async fn start(upstream: &str) -> io::Result<Self> {
        let upstream = lookup_host(upstream).await?.next().ok_or_else(|| {
            io::Error::new(io::ErrorKind::NotFound, format!("{upstream}: no address"))
        })?;
        let listener = TcpListener::bind((Ipv4Addr::LOCALHOST, 0)).await?;
        let addr = listener.local_addr()?;
        let control = Arc::new(Control {
            faults: watch::Sender::new(Fault::PassThrough),
            answers_lost: AtomicUsize::new(0),
            requests_held: AtomicUsize::new(0),
            orphaned: AtomicUsize::new(0),
            connections: AtomicUsize::new(0),
        });
        let accept = tokio::spawn(accept(listener, upstream, Arc::clone(&control)));
        Ok(Self {
            addr,
            control,
            accept,
        })
    }

    /// Where clients connect.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// Switches every connection, open or to come, to `fault`, at once.
    pub fn set(&self, fault: impl Into<Fault>) {
        self.control.faults.send_replace(fault.into());
    }

    /// The fault in force (a [`LoseAnswer`] that fired is back to [`Fault::PassThrough`], a
    /// [`Hold`] that fired is [`Fault::Holding`]).
    pub fn fault(&self) -> Fault {
        self.control.faults.borrow().clone()
    }

    /// How many answers were lost so far.
    pub fn answers_lost(&self) -> usize {
        self.control.answers_lost.load(Ordering::SeqCst)
    }

    /// How many requests were held so far (one per [`Hold`] that fired).
    pub fn requests_held(&self) -> usize {
        self.control.requests_held.load(Ordering::SeqCst)
    }

    /// How many connections were orphaned so far (one per [`Orphan`] that fired).
    pub fn orphaned(&self) -> usize {
        self.control.orphaned.load(Ordering::SeqCst)
    }

    /// How many client connections were accepted so far.
    pub fn connections(&self) -> usize {
        self.control.connections.load(Ordering::SeqCst)
    }
}

impl Drop for FaultProxy {
    fn drop(&mut self) {
        // Dropping the accept task drops its connections' tasks, and with them their sockets.
        self.accept.abort();
    }
}

/// Accepts clients and connects each to `upstream`; a client whose server connection fails is
/// closed.
async fn accept(listener: TcpListener, upstream: SocketAddr, control: Arc<Control>) {
    let mut links = JoinSet::new();
    loop {
        tokio::select! {
            accepted = listener.accept() => {
                let Ok((client, _)) = accepted else { continue };
                control.connections.fetch_add(1, Ordering::SeqCst);
                let control = Arc::clone(&control);
                links.spawn(async move {
                    if let Ok(server) = TcpStream::connect(upstream).await {
                        let _ = (client.set_nodelay(true), server.set_nodelay(true));
                        link::forward(client, server, control).await;
                    }
                });
            }
            Some(_) = links.join_next(), if !links.is_empty() => {}
        }
    }
}
