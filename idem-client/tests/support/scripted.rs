//! A local HTTP server that answers each connection with the next scripted answer (one
//! request per connection, then close) and records what it received.

use std::collections::VecDeque;
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

/// What the server does with one connection.
#[derive(Clone, Debug)]
pub(crate) enum Step {
    /// Reads the request, answers `status` with these extra headers and `body`, closes.
    Answer(u16, Vec<(&'static str, String)>, &'static str),
    /// Reads the request and never answers (holds the connection for a minute).
    Hang,
    /// Reads the request, then stops listening (later connections are refused) and never
    /// answers.
    HangAndStopListening,
    /// Reads the request, then closes the connection without answering.
    CloseAfterRead,
    /// Reads the request, answers `status` announcing a 100-byte body, sends 10 bytes of it
    /// and closes.
    Truncated(u16),
    /// [`Step::Truncated`] with one extra header (name, value).
    TruncatedWithHeader(u16, &'static str, &'static str),
    /// Reads the request, answers `status` announcing a body of this many bytes
    /// (`Content-Length`), sends none of it and holds the connection for a minute.
    Announce(u16, u64),
    /// Reads the request and answers `status` with a body of `bytes` bytes, announced by
    /// `Content-Length` or (`chunked`) sent chunked with no length.
    Large {
        /// The status.
        status: u16,
        /// The body's length.
        bytes: usize,
        /// Whether the body is sent chunked, without a `Content-Length`.
        chunked: bool,
    },
}

impl Step {
    /// An answer with no extra header and a small body.
    pub(crate) fn status(status: u16) -> Step {
        Step::Answer(status, Vec::new(), "{}")
    }

    /// An answer with one extra header.
    pub(crate) fn with_header(status: u16, name: &'static str, value: &str) -> Step {
        Step::Answer(status, vec![(name, value.to_owned())], "{}")
    }
}

/// One request as received.
#[derive(Clone, Debug)]
pub(crate) struct Received {
    /// The request line, e.g. `POST /x HTTP/1.1`.
    pub line: String,
    /// Header names (lower case) and values.
    pub headers: Vec<(String, String)>,
    /// The body.
    pub body: Vec<u8>,
}

impl Received {
    /// A header's value, if present.
    pub(crate) fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(n, _)| n == name)
            .map(|(_, v)| v.as_str())
    }
}

/// The scripted server.
pub(crate) struct Scripted {
    /// `http://127.0.0.1:PORT`.
    pub base_url: String,
    connections: Arc<Mutex<u32>>,
    received: Arc<Mutex<Vec<Received>>>,
    task: tokio::task::JoinHandle<()>,
}

impl Scripted {
    /// Starts a server answering with `steps` in order, then with the last one forever.
    pub(crate) async fn start(steps: Vec<Step>) -> Scripted {
        let listener = TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind a local listener");
        let addr = listener.local_addr().expect("its address");
        let connections = Arc::new(Mutex::new(0));
        let received = Arc::new(Mutex::new(Vec::new()));
        let script = Arc::new(Mutex::new(VecDeque::from(steps)));
        let (c, r) = (connections.clone(), received.clone());
        let stop = Arc::new(tokio::sync::Notify::new());
        let task = tokio::spawn(async move {
            loop {
                let accepted = tokio::select! {
                    accepted = listener.accept() => accepted,
                    _ = stop.notified() => break,
                };
                let Ok((stream, _)) = accepted else { break };
                *c.lock().expect("lock") += 1;
                let step = {
                    let mut script = script.lock().expect("lock");
                    if script.len() > 1 {
                        script.pop_front()
                    } else {
                        script.front().cloned()
                    }
                };
                let (r, stop) = (r.clone(), stop.clone());
                tokio::spawn(async move { serve(stream, step, r, stop).await });
            }
            // The listener is dropped here: later connections are refused.
        });
        Scripted {
            base_url: format!("http://{addr}"),
            connections,
            received,
            task,
        }
    }

    /// `base_url` + `path`.
    pub(crate) fn url(&self, path: &str) -> String {
        format!("{}{path}", self.base_url)
    }

    /// Connections accepted so far.
    pub(crate) fn connections(&self) -> u32 {
        *self.connections.lock().expect("lock")
    }

    /// Requests received so far.
    pub(crate) fn received(&self) -> Vec<Received> {
        self.received.lock().expect("lock").clone()
    }
}

impl Drop for Scripted {
    fn drop(&mut self) {
        self.task.abort();
    }
}

async fn serve(
    mut stream: TcpStream,
    step: Option<Step>,
    received: Arc<Mutex<Vec<Received>>>,
    stop: Arc<tokio::sync::Notify>,
) {
    let Some(request) = read_request(&mut stream).await else {
        return;
    };
    received.lock().expect("lock").push(request);
    match step {
        None | Some(Step::Hang) => tokio::time::sleep(Duration::from_secs(60)).await,
        Some(Step::HangAndStopListening) => {
            stop.notify_one();
            tokio::time::sleep(Duration::from_secs(60)).await;
        }
        Some(Step::CloseAfterRead) => {
            let _ = stream.shutdown().await;
        }
        Some(Step::Truncated(status)) => truncated(&mut stream, status, "").await,
        Some(Step::TruncatedWithHeader(status, name, value)) => {
            truncated(&mut stream, status, &format!("{name}: {value}\r\n")).await
        }
        Some(Step::Announce(status, length)) => {
            let head = format!("HTTP/1.1 {status} Scripted\r\ncontent-length: {length}\r\n\r\n");
            let _ = stream.write_all(head.as_bytes()).await;
            tokio::time::sleep(Duration::from_secs(60)).await;
        }
        Some(Step::Large {
            status,
            bytes,
            chunked,
        }) => {
            let framing = if chunked {
                "transfer-encoding: chunked".to_owned()
            } else {
                format!("content-length: {bytes}")
            };
            let head =
                format!("HTTP/1.1 {status} Scripted\r\n{framing}\r\nconnection: close\r\n\r\n");
            if stream.write_all(head.as_bytes()).await.is_err() {
                return;
            }
            let piece = vec![b'x'; 1024];
            let mut left = bytes;
            while left > 0 {
                let n = left.min(piece.len());
                let written = if chunked {
                    let mut framed = format!("{n:x}\r\n").into_bytes();
                    framed.extend_from_slice(&piece[..n]);
                    framed.extend_from_slice(b"\r\n");
                    stream.write_all(&framed).await
                } else {
                    stream.write_all(&piece[..n]).await
                };
                if written.is_err() {
                    return;
                }
                left -= n;
            }
            if chunked {
                let _ = stream.write_all(b"0\r\n\r\n").await;
            }
            let _ = stream.shutdown().await;
        }
        Some(Step::Answer(status, headers, body)) => {
            let mut out = format!(
                "HTTP/1.1 {status} Scripted\r\ncontent-type: application/json\r\ncontent-length: {}\r\nconnection: close\r\n",
                body.len()
            );
            for (name, value) in headers {
                out.push_str(&format!("{name}: {value}\r\n"));
            }
            out.push_str("\r\n");
            out.push_str(body);
            let _ = stream.write_all(out.as_bytes()).await;
            let _ = stream.shutdown().await;
        }
    }
}

/// Answers `status` with the `extra` header lines, announcing a 100-byte body, sends 10 bytes
/// of it and closes.
async fn truncated(stream: &mut TcpStream, status: u16, extra: &str) {
    let out = format!(
        "HTTP/1.1 {status} Scripted\r\ncontent-type: application/json\r\n{extra}content-length: 100\r\nconnection: close\r\n\r\n{{\"id\":\"x"
    );
    let _ = stream.write_all(out.as_bytes()).await;
    let _ = stream.shutdown().await;
}

async fn read_request(stream: &mut TcpStream) -> Option<Received> {
    let mut buf = Vec::new();
    let mut chunk = [0u8; 4096];
    let head_end = loop {
        if let Some(i) = buf.windows(4).position(|w| w == b"\r\n\r\n") {
            break i;
        }
        let n = stream.read(&mut chunk).await.ok()?;
        if n == 0 {
            return None;
        }
        buf.extend_from_slice(&chunk[..n]);
    };
    let head = String::from_utf8_lossy(&buf[..head_end]).into_owned();
    let mut lines = head.split("\r\n");
    let line = lines.next()?.to_owned();
    let headers: Vec<(String, String)> = lines
        .filter_map(|l| l.split_once(':'))
        .map(|(n, v)| (n.trim().to_ascii_lowercase(), v.trim().to_owned()))
        .collect();
    let length: usize = headers
        .iter()
        .find(|(n, _)| n == "content-length")
        .and_then(|(_, v)| v.parse().ok())
        .unwrap_or(0);
    let mut body = buf[head_end + 4..].to_vec();
    while body.len() < length {
        let n = stream.read(&mut chunk).await.ok()?;
        if n == 0 {
            break;
        }
        body.extend_from_slice(&chunk[..n]);
    }
    Some(Received {
        line,
        headers,
        body,
    })
}
