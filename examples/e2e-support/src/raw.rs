//! A raw TCP client, for the clients a real HTTP library never is: one that sends half a
//! request and stalls, dribbles its headers, or never reads the answer.

use std::time::{Duration, Instant};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

/// A TCP connection to a server, written to by hand.
#[derive(Debug)]
pub struct RawClient {
    stream: TcpStream,
    opened: Instant,
}

/// How a connection ended, as its client saw it.
#[derive(Debug)]
pub struct Closed {
    /// From the connection's opening to the end of the stream (or the reset).
    pub after: Duration,
    /// Everything the server sent before it closed.
    pub received: Vec<u8>,
}

impl Closed {
    /// What the server sent, as text (lossy).
    pub fn text(&self) -> String {
        String::from_utf8_lossy(&self.received).into_owned()
    }

    /// The status of the answer the server sent before closing, if any.
    pub fn status(&self) -> Option<u16> {
        let text = self.text();
        let line = text.lines().next()?;
        line.strip_prefix("HTTP/1.1 ")?.get(..3)?.parse().ok()
    }
}

impl RawClient {
    /// Connects to `addr` (`127.0.0.1:PORT`).
    pub async fn connect(addr: &str) -> RawClient {
        let stream = TcpStream::connect(addr)
            .await
            .unwrap_or_else(|e| panic!("cannot connect to {addr}: {e}"));
        RawClient {
            stream,
            opened: Instant::now(),
        }
    }

    /// Sends `bytes`; false if the server already closed the connection.
    pub async fn send(&mut self, bytes: &[u8]) -> bool {
        self.stream.write_all(bytes).await.is_ok() && self.stream.flush().await.is_ok()
    }

    /// Reads until the server closes the connection, for at most `within` from now; `None`
    /// if it is still open then.
    pub async fn closed_within(&mut self, within: Duration) -> Option<Closed> {
        let deadline = tokio::time::Instant::now() + within;
        let mut received = Vec::new();
        let mut buf = [0u8; 16 * 1024];
        loop {
            match tokio::time::timeout_at(deadline, self.stream.read(&mut buf)).await {
                Err(_) => return None,
                Ok(Ok(0)) | Ok(Err(_)) => {
                    return Some(Closed {
                        after: self.opened.elapsed(),
                        received,
                    })
                }
                Ok(Ok(n)) => received.extend_from_slice(&buf[..n]),
            }
        }
    }

    /// How long the connection has been open.
    pub fn age(&self) -> Duration {
        self.opened.elapsed()
    }
}
