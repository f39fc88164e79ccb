//! The accept loop: at most `max_connections` open, each served by hyper's HTTP/1 server with
//! a deadline for every request head, and a graceful end that lets requests under way answer.

use super::Limits;
use axum::Router;
use hyper::server::conn::http1;
use hyper_util::rt::{TokioIo, TokioTimer};
use hyper_util::server::graceful::GracefulShutdown;
use hyper_util::service::TowerToHyperService;
use std::future::Future;
use std::io;
use std::sync::Arc;
use std::time::{Duration, Instant};
use tokio::net::TcpListener;
use tokio::sync::Semaphore;

/// The most bytes hyper buffers per connection while it reads (a request head must fit):
/// keeps what a stalled connection holds small.
const MAX_READ_BUFFER: usize = 64 * 1024;

/// How often, at most, reaching the connection cap is logged.
const CAP_WARNING: Duration = Duration::from_secs(10);

/// Serves `app` on `listener` until `shutdown` completes, then stops accepting, lets the
/// requests under way answer (each connection closes after its current request) and returns
/// once every connection has closed.
pub async fn serve(
    listener: TcpListener,
    app: Router,
    limits: &Limits,
    shutdown: impl Future<Output = ()>,
) {
    let mut http = http1::Builder::new();
    http.timer(TokioTimer::new())
        .header_read_timeout(limits.header_timeout)
        .max_buf_size(MAX_READ_BUFFER);
    let slots = Arc::new(Semaphore::new(limits.max_connections.max(1)));
    let graceful = GracefulShutdown::new();
    let mut warned: Option<Instant> = None;
    tokio::pin!(shutdown);
    loop {
        let slot = tokio::select! {
            slot = Arc::clone(&slots).acquire_owned() => slot,
            () = &mut shutdown => break,
        };
        let Ok(slot) = slot else { break };
        if slots.available_permits() == 0 && warned.is_none_or(|at| at.elapsed() >= CAP_WARNING) {
            warned = Some(Instant::now());
            tracing::warn!(
                max_connections = limits.max_connections,
                "the connection cap is reached; new connections wait until one closes"
            );
        }
        let accepted = tokio::select! {
            accepted = listener.accept() => accepted,
            () = &mut shutdown => break,
        };
        let stream = match accepted {
            Ok((stream, _peer)) => stream,
            Err(error) => {
                accept_failed(error).await;
                continue;
            }
        };
        let _ = stream.set_nodelay(true);
        let service = TowerToHyperService::new(app.clone());
        let connection = graceful.watch(http.serve_connection(TokioIo::new(stream), service));
        tokio::spawn(async move {
            if let Err(error) = connection.await {
                // A head not sent in time, a malformed request, a client gone mid-answer.
                tracing::debug!(%error, "connection closed");
            }
            drop(slot);
        });
    }
    drop(listener);
    graceful.shutdown().await;
}

/// A failed `accept`: a connection reset before it was accepted is skipped; anything else (out
/// of file descriptors) is logged and waited out for a second.
async fn accept_failed(error: io::Error) {
    if matches!(
        error.kind(),
        io::ErrorKind::ConnectionRefused
            | io::ErrorKind::ConnectionAborted
            | io::ErrorKind::ConnectionReset
    ) {
        return;
    }
    tracing::error!(%error, "accepting a connection failed; retrying in a second");
    tokio::time::sleep(Duration::from_secs(1)).await;
}
