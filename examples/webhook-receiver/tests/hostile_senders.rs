//! The receiver against the clients of the open internet: slow and stalled raw-socket senders
//! (half a request line, half the headers, half a body), a slow-loris crowd, oversized bodies,
//! wrong methods, and a sender that hangs up while its event is processed. Short timeouts are
//! configured so that each test proves the receiver cuts what it must within them while it
//! keeps acknowledging real deliveries.

mod support;

use e2e_support::{Closed, RawClient};
use idem::inbox::SignatureScheme;
use reqwest::{Method, StatusCode};
use std::time::Duration;
use support::{new_event_id, now_unix, order_amount, Event, Server, TestEnv};

const SECRET: &str = "whsec_e2e_hostile_0123456789";

/// The head deadline the tests configure.
const HEADER_TIMEOUT: Duration = Duration::from_millis(1000);
/// The body deadline the tests configure.
const BODY_TIMEOUT: Duration = Duration::from_millis(1500);
/// How late after its deadline a cut may come (a loaded test machine).
const SLACK: Duration = Duration::from_millis(1500);

/// The tests' short deadlines, as the receiver reads them from its environment.
const DEADLINES: [(&str, &str); 2] = [
    ("IDEM_HEADER_TIMEOUT_MS", "1000"),
    ("IDEM_BODY_TIMEOUT_MS", "1500"),
];

fn scheme() -> SignatureScheme {
    SignatureScheme::from_comma_separated(SECRET).expect("a signature scheme")
}

/// Asserts `reply` is a problem (RFC 9457) of `status` and `kind`.
fn assert_problem(reply: &support::Reply, status: u16, kind: &str) {
    assert_eq!(reply.status.as_u16(), status, "{}", reply.describe());
    assert_eq!(
        reply.header("content-type").as_deref(),
        Some("application/problem+json"),
        "{}",
        reply.describe()
    );
    assert_eq!(reply.problem_kind(), kind, "{}", reply.describe());
    assert_eq!(reply.json()["status"], status, "{}", reply.describe());
}

/// Asserts that `client`'s connection is closed by the receiver within `deadline` + [`SLACK`]
/// of its opening, and not before the deadline.
async fn assert_cut(client: &mut RawClient, what: &str, deadline: Duration) -> Closed {
    let left = (deadline + SLACK).saturating_sub(client.age());
    let Some(closed) = client.closed_within(left).await else {
        panic!(
            "{what}: the receiver still held the connection {:?} after it opened (deadline \
             {deadline:?})",
            client.age()
        );
    };
    assert!(
        closed.after + Duration::from_millis(200) >= deadline,
        "{what}: cut after {:?}, before the deadline {deadline:?}: {}",
        closed.after,
        closed.text()
    );
    eprintln!(
        "{what}: closed after {:?}: {:?}",
        closed.after,
        closed.status()
    );
    closed
}

/// A real delivery, acknowledged at once while slow senders hold connections.
async fn assert_acknowledged(server: &Server, n: u32) {
    let event = Event::payment_succeeded(
        &new_event_id(&format!("beside{n}")),
        &format!("ord_{n}"),
        order_amount(n),
    );
    let reply = server.sender().deliver_once(&event, &scheme()).await;
    assert_eq!(reply.status, StatusCode::OK, "{}", reply.describe());
    assert!(
        reply.latency < Duration::from_millis(800),
        "a delivery took {:?} beside the slow senders",
        reply.latency
    );
}

/// Half a request line, half the headers, a connection that sends nothing, and headers then
/// half a body: each is closed within its deadline (the stalled body answered with a 408
/// problem), while real deliveries are acknowledged.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn stalled_heads_and_bodies_are_cut_within_their_deadlines() {
    let env = TestEnv::new("stalled");
    let server = Server::start_with(&env, SECRET, &DEADLINES).await;
    let addr = server.addr().to_owned();

    let mut half_line = RawClient::connect(&addr).await;
    assert!(half_line.send(b"POST /webhooks/str").await);
    let mut half_headers = RawClient::connect(&addr).await;
    assert!(
        half_headers
            .send(b"POST /webhooks/stripe HTTP/1.1\r\nHost: x\r\nStripe-Signature: t=1")
            .await
    );
    let mut silent = RawClient::connect(&addr).await;
    let mut half_body = RawClient::connect(&addr).await;
    let event = Event::payment_succeeded(&new_event_id("half"), "ord_9", order_amount(9));
    let signature = scheme().sign(&event.body, now_unix());
    let head = format!(
        "POST /webhooks/stripe HTTP/1.1\r\nHost: x\r\nStripe-Signature: {signature}\r\n\
         Content-Type: application/json\r\nContent-Length: {}\r\n\r\n",
        event.body.len()
    );
    assert!(half_body.send(head.as_bytes()).await);
    assert!(half_body.send(&event.body[..event.body.len() / 2]).await);

    assert_acknowledged(&server, 1).await;

    assert_cut(&mut half_line, "half a request line", HEADER_TIMEOUT).await;
    assert_cut(&mut half_headers, "half the headers", HEADER_TIMEOUT).await;
    assert_cut(&mut silent, "nothing sent", HEADER_TIMEOUT).await;
    let closed = assert_cut(&mut half_body, "half a body", BODY_TIMEOUT).await;
    assert_eq!(closed.status(), Some(408), "{}", closed.text());
    assert!(
        closed.text().contains("application/problem+json")
            && closed.text().contains("request-timeout"),
        "the 408 is a problem: {}",
        closed.text()
    );
    assert_acknowledged(&server, 2).await;
    assert_eq!(
        server.sender().invoice_count().await,
        2,
        "the stalled delivery never ran"
    );
}

/// Fifty slow-loris connections dribbling their headers a byte at a time: all are closed
/// within the head deadline, while real deliveries are acknowledged throughout.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn fifty_slow_loris_connections_are_closed_while_deliveries_are_acknowledged() {
    const LORISES: usize = 50;
    let env = TestEnv::new("loris");
    let server = Server::start_with(&env, SECRET, &DEADLINES).await;
    let addr = server.addr().to_owned();

    let mut lorises = Vec::new();
    for _ in 0..LORISES {
        let addr = addr.clone();
        lorises.push(tokio::spawn(async move {
            let mut client = RawClient::connect(&addr).await;
            let head = b"POST /webhooks/stripe HTTP/1.1\r\nHost: x\r\nX-Loris: aaaaaaaaaaaaaaaaaaaaaaaaaaaaa";
            for byte in head.iter() {
                if !client.send(std::slice::from_ref(byte)).await {
                    break;
                }
                if let Some(closed) = client.closed_within(Duration::from_millis(100)).await {
                    return closed;
                }
            }
            let left = (HEADER_TIMEOUT + SLACK).saturating_sub(client.age());
            client.closed_within(left).await.unwrap_or_else(|| {
                panic!(
                    "a slow-loris connection was still open {:?} after it opened",
                    client.age()
                )
            })
        }));
    }
    let started = std::time::Instant::now();
    let mut n = 0;
    while started.elapsed() < HEADER_TIMEOUT {
        n += 1;
        assert_acknowledged(&server, n).await;
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    for loris in lorises {
        let closed = loris.await.expect("a slow-loris task panicked");
        assert!(
            closed.after <= HEADER_TIMEOUT + SLACK,
            "a slow-loris connection was closed only after {:?}",
            closed.after
        );
    }
    eprintln!("{n} deliveries acknowledged beside {LORISES} slow-loris connections");
    assert!(n >= 3, "only {n} deliveries were acknowledged");
}

/// A body over the limit, declared or streamed: a 413 problem, nothing recorded.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn an_oversized_body_is_a_problem_413() {
    let env = TestEnv::new("413");
    let server = Server::start_with(&env, SECRET, &DEADLINES).await;
    let big = vec![b'x'; 2 * 1024 * 1024];
    let signature = scheme().sign(&big, now_unix());
    let reply = server
        .sender()
        .post(&big, Some(&signature), &[])
        .await
        .expect("an answer to the oversized delivery");
    assert_problem(&reply, 413, "body-too-large");

    // The same without a Content-Length: chunks until the limit is crossed.
    let mut client = RawClient::connect(server.addr()).await;
    let head = format!(
        "POST /webhooks/stripe HTTP/1.1\r\nHost: x\r\nStripe-Signature: {signature}\r\n\
         Content-Type: application/json\r\nTransfer-Encoding: chunked\r\n\r\n"
    );
    assert!(client.send(head.as_bytes()).await);
    let chunk = format!("10000\r\n{}\r\n", "x".repeat(0x10000));
    for _ in 0..20 {
        if !client.send(chunk.as_bytes()).await {
            break;
        }
    }
    let closed = client
        .closed_within(BODY_TIMEOUT + SLACK)
        .await
        .expect("the receiver closes the oversized stream");
    assert_eq!(closed.status(), Some(413), "{}", closed.text());
    assert!(
        closed.text().contains("application/problem+json")
            && closed.text().contains("body-too-large"),
        "{}",
        closed.text()
    );
    assert!(server.sender().audit().await.is_empty(), "nothing recorded");
}

/// A method a path does not serve: a 405 problem with `Allow`.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_wrong_method_is_a_problem_405_with_allow() {
    let env = TestEnv::new("405");
    let server = Server::start_with(&env, SECRET, &DEADLINES).await;
    for (method, path, allowed) in [
        (Method::GET, "/webhooks/stripe", "POST"),
        (Method::PUT, "/webhooks/stripe", "POST"),
        (Method::DELETE, "/audit", "GET"),
    ] {
        let reply = server.sender().send(method.clone(), path, Vec::new()).await;
        assert_problem(&reply, 405, "method-not-allowed");
        let allow = reply
            .header("allow")
            .unwrap_or_else(|| panic!("{method} {path}: no Allow: {}", reply.describe()));
        assert!(allow.contains(allowed), "{method} {path}: Allow {allow:?}");
    }
}

/// A sender that hangs up while its event is processed: the event is processed once, and the
/// log has one request line and one delivery line for it, written when the processing ended.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_sender_that_hangs_up_still_gets_its_log_lines() {
    let env = TestEnv::new("hang-up");
    let server = Server::start_with(&env, SECRET, &DEADLINES).await;
    let sender = server.sender();
    let event = Event::payment_succeeded(&new_event_id("hangup"), "ord_5", order_amount(5));
    let signature = scheme().sign(&event.body, now_unix());
    let cut = sender
        .post_within(
            &event.body,
            Some(&signature),
            &[("x-test-delay-ms", "1500")],
            Duration::from_millis(300),
        )
        .await;
    assert!(
        cut.is_err(),
        "the sender hangs up before the answer: {cut:?}"
    );
    let mut count = 0;
    for _ in 0..50 {
        count = sender.invoice_count().await;
        if count == 1 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert_eq!(count, 1, "the abandoned delivery is processed once");
    let lines = |server: &Server, what: &str| -> Vec<String> {
        server
            .log()
            .lines()
            .filter(|l| l.contains(what))
            .map(str::to_owned)
            .collect()
    };
    let mut requests = Vec::new();
    for _ in 0..20 {
        requests = lines(&server, "path=\"/webhooks/stripe\"");
        if !requests.is_empty() {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert_eq!(
        requests.len(),
        1,
        "one request line for the delivery whose sender hung up; the log:\n{}",
        server.log_tail(30)
    );
    assert!(
        requests[0].contains("status=200") && requests[0].contains("client=\"gone\""),
        "{}",
        requests[0]
    );
    let deliveries = lines(&server, &event.id);
    assert_eq!(deliveries.len(), 1, "one delivery line: {deliveries:#?}");
    assert!(
        deliveries[0].contains("outcome=\"processed\""),
        "{}",
        deliveries[0]
    );
}
