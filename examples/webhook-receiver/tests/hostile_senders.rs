//! The receiver against the clients of the open internet: slow and stalled raw-socket senders
//! (half a request line, half the headers, half a body), a slow-loris crowd, oversized bodies,
//! wrong methods, and a sender that hangs up while its event is processed. Short timeouts are
//! configured so that each test proves the receiver cuts what it must within them while it
//! keeps acknowledging real deliveries.

mod support;

use e2e_support::slow::{
    assert_cut, rounds_during, Lorises, StalledHeads, BODY_TIMEOUT, DEADLINES, HEADER_TIMEOUT,
    SLACK,
};
use e2e_support::{poll, Closed, RawClient};
use idem::inbox::SignatureScheme;
use reqwest::{Method, StatusCode};
use std::time::Duration;
use support::{assert_problem, new_event_id, now_unix, order_amount, Event, Server, TestEnv};

const SECRET: &str = "whsec_e2e_hostile_0123456789";

fn scheme() -> SignatureScheme {
    SignatureScheme::from_comma_separated(SECRET).expect("a signature scheme")
}

/// Asserts that the receiver answered a problem of `status` and `kind` before it closed.
fn assert_closed_with_problem(closed: &Closed, status: u16, kind: &str) {
    assert_eq!(closed.status(), Some(status), "{}", closed.text());
    assert!(
        closed.text().contains("application/problem+json") && closed.text().contains(kind),
        "a {status} problem of kind {kind}: {}",
        closed.text()
    );
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

    let heads = StalledHeads::open(
        &addr,
        b"POST /webhooks/str",
        b"POST /webhooks/stripe HTTP/1.1\r\nHost: x\r\nStripe-Signature: t=1",
    )
    .await;
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

    heads.assert_cut().await;
    let closed = assert_cut(&mut half_body, "half a body", BODY_TIMEOUT).await;
    assert_closed_with_problem(&closed, 408, "request-timeout");
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

    let lorises = Lorises::start(
        &addr,
        LORISES,
        b"POST /webhooks/stripe HTTP/1.1\r\nHost: x\r\nX-Loris: aaaaaaaaaaaaaaaaaaaaaaaaaaaaa",
    );
    let n = rounds_during(HEADER_TIMEOUT, |n| assert_acknowledged(&server, n)).await;
    lorises.assert_closed().await;
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
    assert_closed_with_problem(&closed, 413, "body-too-large");
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
    let every = Duration::from_millis(100);
    let count = poll(50, every, || sender.invoice_count(), |count| *count == 1).await;
    assert_eq!(count, 1, "the abandoned delivery is processed once");
    let requests = poll(
        20,
        every,
        || async { server.log_lines(&["path=\"/webhooks/stripe\""]) },
        |lines| !lines.is_empty(),
    )
    .await;
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
    let deliveries = server.log_lines(&[&event.id]);
    assert_eq!(deliveries.len(), 1, "one delivery line: {deliveries:#?}");
    assert!(
        deliveries[0].contains("outcome=\"processed\""),
        "{}",
        deliveries[0]
    );
}
