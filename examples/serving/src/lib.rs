//! Serving the example servers to clients that may be slow or hostile: HTTP/1 connections with a deadline
//! for the request head, a deadline and a byte budget for request bodies, a cap on open
//! connections, and every request run to its end on a task of its own.

mod body;
mod connections;
mod tasks;

pub use body::{buffer_body, BodyGate, Refusal};
pub use connections::serve;
pub use tasks::Tasks;

use std::time::Duration;

/// What a connection and a request may cost the server.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Limits {
    /// How long a client may take to send a request's head (request line and headers), and
    /// how long an idle keep-alive connection stays open. Past it the connection is closed.
    pub header_timeout: Duration,
    /// How long a client may take to send a request's body, from the end of its head. Past
    /// it the request is answered 408 and the connection closed.
    pub body_timeout: Duration,
    /// The most connections open at once; more wait in the listen queue until one closes.
    pub max_connections: usize,
    /// The most request-body bytes held in memory at once, all requests together. A request
    /// whose body finds no room is refused at once (503 with `Retry-After`).
    pub max_buffered_body_bytes: usize,
}

impl Default for Limits {
    fn default() -> Self {
        Self {
            header_timeout: Duration::from_secs(10),
            body_timeout: Duration::from_secs(30),
            max_connections: 1024,
            max_buffered_body_bytes: 16 * 1024 * 1024,
        }
    }
}
