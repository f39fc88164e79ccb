//! The dispatcher's address policy when the process has a proxy in its environment
//! (`HTTP_PROXY`, as many deployments set for outbound traffic). A binary of its own: it sets
//! the process's environment.

mod support;

use std::sync::{Arc, Mutex};
use std::time::Duration;

use idem_outbox::{DeliveryState, Message};
use support::*;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpListener;

/// C17 (the dispatcher refuses loopback, private and link-local receivers unless allowed):
/// the policy lives in the HTTP client's DNS resolver and in a check of literal addresses, so
/// a proxy would resolve the receiver's name past it. With `HTTP_PROXY` set, an endpoint named
/// `localhost` (or any name of a private address) is still refused, and nothing reaches the
/// proxy: the dispatcher takes no proxy from the environment.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn c17_pg_a_proxy_from_the_environment_does_not_bypass_the_address_policy() {
    // A forward proxy on loopback: it answers 200 to whatever it is asked to forward.
    let proxy = TcpListener::bind("127.0.0.1:0").await.expect("a port");
    let proxy_addr = proxy.local_addr().expect("an address");
    let forwarded: Arc<Mutex<Vec<String>>> = Arc::default();
    let log = Arc::clone(&forwarded);
    tokio::spawn(async move {
        while let Ok((mut socket, _)) = proxy.accept().await {
            let log = Arc::clone(&log);
            tokio::spawn(async move {
                let mut buf = vec![0u8; 64 * 1024];
                let mut seen = Vec::new();
                while let Ok(n) = socket.read(&mut buf).await {
                    if n == 0 {
                        break;
                    }
                    seen.extend_from_slice(&buf[..n]);
                    if seen.windows(4).any(|w| w == b"\r\n\r\n") {
                        let head = String::from_utf8_lossy(&seen);
                        log.lock()
                            .expect("log")
                            .push(head.lines().next().unwrap_or_default().to_owned());
                        let _ = socket
                            .write_all(b"HTTP/1.1 200 OK\r\ncontent-length: 0\r\n\r\n")
                            .await;
                        seen.clear();
                    }
                }
            });
        }
    });
    let proxy_url = format!("http://{proxy_addr}");
    // Set before any client of this test binary is built (this binary's only test but the
    // support module's pure one).
    std::env::set_var("HTTP_PROXY", &proxy_url);
    std::env::set_var("http_proxy", &proxy_url);
    std::env::remove_var("NO_PROXY");
    std::env::remove_var("no_proxy");

    let url = fresh_database().await;
    let (store, outbox) = pg_outbox(&url).await;
    // A receiver by a name of a loopback address; the dispatcher does not allow loopback.
    outbox
        .register(&endpoint(
            "internal",
            "http://localhost:9/admin",
            quick(0, Duration::from_millis(50)),
        ))
        .await
        .expect("registered");
    let mut tx = store.pool().begin().await.expect("a transaction");
    let id = outbox
        .enqueue(
            &mut tx,
            &Message::bytes("application/json", "{}").to("internal"),
        )
        .await
        .expect("enqueued");
    tx.commit().await.expect("committed");
    let dispatcher = outbox.dispatcher(); // loopback and private addresses refused
    dispatcher.dispatch_due().await.expect("dispatched");
    let delivery = outbox.deliveries(&id).await.expect("read").remove(0);
    let forwarded = forwarded.lock().expect("log").clone();
    assert!(
        forwarded.is_empty() && delivery.state != DeliveryState::Delivered,
        "a receiver at a loopback name, loopback refused: the proxy was asked {forwarded:?}, \
         the delivery is {:?} (last status {:?}, error {:?})",
        delivery.state,
        delivery.last_status,
        delivery.last_error
    );
}
