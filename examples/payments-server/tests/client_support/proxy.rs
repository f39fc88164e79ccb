//! A TCP proxy in front of a server that records every request head it forwards (to see the
//! idempotency key of every attempt) and can swallow the answers of the first connections
//! (an answer lost on the way back: the client times out although the server finished).

use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Arc, Mutex};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

/// The bytes a client sent on one connection.
type Stream = Arc<Mutex<Vec<u8>>>;

/// The proxy.
pub(crate) struct Proxy {
    /// `http://127.0.0.1:PORT` of the proxy.
    pub base_url: String,
    streams: Arc<Mutex<Vec<Stream>>>,
    task: tokio::task::JoinHandle<()>,
}

impl Proxy {
    /// A proxy to `upstream` (`127.0.0.1:PORT`, connected anew for every connection) that
    /// swallows what the server sends back on the first `swallow` connections.
    pub(crate) async fn start(upstream: &str, swallow: u32) -> Proxy {
        let listener = TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind the proxy");
        let addr = listener.local_addr().expect("its address");
        let streams: Arc<Mutex<Vec<Stream>>> = Arc::default();
        let upstream = upstream.to_owned();
        let seen = streams.clone();
        let count = Arc::new(AtomicU32::new(0));
        let task = tokio::spawn(async move {
            while let Ok((client, _)) = listener.accept().await {
                let index = count.fetch_add(1, Ordering::SeqCst);
                let log = Arc::new(Mutex::new(Vec::new()));
                seen.lock().expect("lock").push(log.clone());
                let upstream = upstream.clone();
                tokio::spawn(async move {
                    if let Ok(server) = TcpStream::connect(&upstream).await {
                        relay(client, server, log, index < swallow).await;
                    }
                });
            }
        });
        Proxy {
            base_url: format!("http://{addr}"),
            streams,
            task,
        }
    }

    /// `base_url` + `path`.
    pub(crate) fn url(&self, path: &str) -> String {
        format!("{}{path}", self.base_url)
    }

    /// Every request head line seen, e.g. `POST /v1/charges HTTP/1.1`, with the value of its
    /// `Idempotency-Key` header (if any), in order per connection.
    pub(crate) fn requests(&self) -> Vec<(String, Option<String>)> {
        let mut out = Vec::new();
        for log in self.streams.lock().expect("lock").iter() {
            let bytes = log.lock().expect("lock").clone();
            out.extend(parse_requests(&bytes));
        }
        out
    }

    /// The keys of every `POST` seen.
    pub(crate) fn post_keys(&self) -> Vec<Option<String>> {
        self.requests()
            .into_iter()
            .filter(|(line, _)| line.starts_with("POST "))
            .map(|(_, key)| key)
            .collect()
    }
}

/// The requests on one connection, framed by their `Content-Length` (the only framing the
/// client's buffered bodies use): each request line with its `Idempotency-Key` value. A
/// request whose head or body is incomplete ends the list.
pub(crate) fn parse_requests(bytes: &[u8]) -> Vec<(String, Option<String>)> {
    let mut out = Vec::new();
    let mut rest = bytes;
    while let Some(end) = rest.windows(4).position(|w| w == b"\r\n\r\n") {
        let head = String::from_utf8_lossy(&rest[..end]).into_owned();
        let mut lines = head.split("\r\n");
        let line = lines.next().unwrap_or_default().to_owned();
        let mut key = None;
        let mut length = 0usize;
        for header in lines {
            let Some((name, value)) = header.split_once(':') else {
                continue;
            };
            let (name, value) = (name.trim(), value.trim());
            if name.eq_ignore_ascii_case("idempotency-key") {
                key = Some(value.to_owned());
            } else if name.eq_ignore_ascii_case("content-length") {
                length = value.parse().unwrap_or(0);
            }
        }
        let body_start = end + 4;
        if rest.len() < body_start + length {
            break;
        }
        out.push((line, key));
        rest = &rest[body_start + length..];
    }
    out
}

impl Drop for Proxy {
    fn drop(&mut self) {
        self.task.abort();
    }
}

async fn relay(client: TcpStream, server: TcpStream, log: Stream, swallow: bool) {
    let (mut client_read, mut client_write) = client.into_split();
    let (mut server_read, mut server_write) = server.into_split();
    let up = async {
        let mut buf = [0u8; 8192];
        loop {
            match client_read.read(&mut buf).await {
                Ok(0) | Err(_) => break,
                Ok(n) => {
                    log.lock().expect("lock").extend_from_slice(&buf[..n]);
                    if server_write.write_all(&buf[..n]).await.is_err() {
                        break;
                    }
                }
            }
        }
    };
    let down = async {
        let mut buf = [0u8; 8192];
        loop {
            match server_read.read(&mut buf).await {
                Ok(0) | Err(_) => break,
                Ok(n) => {
                    if !swallow && client_write.write_all(&buf[..n]).await.is_err() {
                        break;
                    }
                }
            }
        }
    };
    // Either side ending ends the relay: both connections are closed when dropped.
    tokio::select! {
        _ = up => {}
        _ = down => {}
    }
}
