//! The retry loop against a local scripted server: which answers are retried, how often, how
//! long it waits, the deadline, the key on every attempt, a streaming body refused before
//! anything is sent, and what the tracing output holds.

mod support;

use idem_client::{
    Backoff, Client, Error, IdempotencyKey, Outcome, RetryPolicy, Stop, DEFAULT_KEY_HEADER,
};
use reqwest::header::HeaderName;
use std::time::{Duration, Instant};
use support::scripted::{Scripted, Step};

fn client(policy: RetryPolicy) -> Client {
    let http = reqwest::Client::builder()
        .no_proxy()
        .build()
        .expect("a reqwest client");
    Client::new(http).with_policy(policy)
}

/// Three attempts at most, 10 ms pauses, a 10 s deadline.
fn three_quick_attempts() -> RetryPolicy {
    RetryPolicy::default()
        .max_attempts(3)
        .deadline(Duration::from_secs(10))
        .attempt_timeout(Duration::from_secs(2))
        .backoff(Backoff::new(
            Duration::from_millis(10),
            Duration::from_millis(10),
        ))
}

#[tokio::test]
async fn each_status_is_retried_or_not_as_the_table_says() {
    // (status, attempts made under three_quick_attempts, outcome)
    let table: &[(u16, u32, Outcome)] = &[
        (400, 1, Outcome::NotExecuted),
        (401, 1, Outcome::NotExecuted),
        (403, 1, Outcome::NotExecuted),
        (404, 1, Outcome::NotExecuted),
        (422, 1, Outcome::NotExecuted),
        (501, 1, Outcome::InDoubt),
        (409, 3, Outcome::InDoubt),
        (429, 3, Outcome::NotExecuted),
        (500, 3, Outcome::InDoubt),
        (502, 3, Outcome::InDoubt),
        (503, 3, Outcome::InDoubt),
        (504, 3, Outcome::InDoubt),
    ];
    let client = client(three_quick_attempts());
    for &(status, attempts, outcome) in table {
        let server = Scripted::start(vec![Step::status(status)]).await;
        let error = client
            .send(client.post(server.url("/op")).body("{}"))
            .await
            .expect_err("a failure status");
        let response = error.response().expect("the last answer is kept");
        assert_eq!(response.status().as_u16(), status);
        assert_eq!(error.attempts(), attempts, "{status}: attempts");
        assert_eq!(
            server.received().len() as u32,
            attempts,
            "{status}: requests"
        );
        let stop = if attempts == 1 {
            Stop::NotRetryable
        } else {
            Stop::Attempts
        };
        assert_eq!(error.stop(), Some(stop), "{status}");
        assert_eq!(error.outcome(), outcome, "{status}: {error}");
    }
}

#[tokio::test]
async fn c07_a_replayed_answer_is_final_whatever_its_status() {
    // A stored 409 (a business conflict the handler chose) and a stored 500 ("outcome
    // unknown", C8): a retry would get them again. Both come from an endpoint that ran:
    // in doubt, never "not executed".
    let client = client(three_quick_attempts());
    for (status, outcome) in [(409, Outcome::InDoubt), (500, Outcome::InDoubt)] {
        let server = Scripted::start(vec![Step::with_header(
            status,
            "idempotent-replayed",
            "true",
        )])
        .await;
        let error = client
            .send(client.post(server.url("/op")).body("x"))
            .await
            .expect_err("a stored failure");
        assert_eq!(error.attempts(), 1, "{status}");
        assert_eq!(error.stop(), Some(Stop::NotRetryable), "{status}");
        assert_eq!(error.outcome(), outcome, "{status}");
        assert!(error.response().is_some_and(|r| r.replayed()));
    }
}

/// C8: a 4xx the server stored (it echoes the key, as a server built on idem does on every
/// answer it stores, or replays it) may follow an effect (`Happened`: a 422 after a charge went
/// through): in doubt, so the caller never sends it again under a new key; the same 4xx
/// without the echo is a refusal the server gave back: not executed. A replayed 4xx after an
/// attempt that may have run stays in doubt.
#[tokio::test]
async fn c08_a_stored_4xx_is_in_doubt_and_a_refusal_not_executed() {
    let client = client(three_quick_attempts());
    let cases = [
        (
            vec![Step::with_header(422, "idempotency-key", "k-1")],
            Outcome::InDoubt,
        ),
        (
            vec![Step::with_header(402, "idempotency-key", "k-1")],
            Outcome::InDoubt,
        ),
        (vec![Step::status(422)], Outcome::NotExecuted),
        (
            vec![
                Step::status(503),
                Step::with_header(422, "idempotent-replayed", "true"),
            ],
            Outcome::InDoubt,
        ),
    ];
    for (round, (steps, outcome)) in cases.into_iter().enumerate() {
        let server = Scripted::start(steps).await;
        let error = client
            .send(client.post(server.url("/op")).body("x"))
            .await
            .expect_err("a 4xx");
        assert_eq!(error.stop(), Some(Stop::NotRetryable), "case {round}");
        assert_eq!(error.outcome(), outcome, "case {round}: {error}");
    }
}

#[tokio::test]
async fn a_retried_failure_then_a_success_is_the_success() {
    let server = Scripted::start(vec![
        Step::status(503),
        Step::status(502),
        Step::Answer(201, vec![], r#"{"id":"ch_1"}"#),
    ])
    .await;
    let client = client(three_quick_attempts());
    let response = client
        .send(
            client
                .post(server.url("/op"))
                .json(&serde_json::json!({"amount": 1})),
        )
        .await
        .expect("the third attempt succeeds");
    assert_eq!(response.status().as_u16(), 201);
    assert_eq!(response.attempts(), 3);
    assert_eq!(response.body().as_ref(), br#"{"id":"ch_1"}"#);
    assert!(!response.replayed());
    let received = server.received();
    let bodies: Vec<&[u8]> = received.iter().map(|r| r.body.as_slice()).collect();
    assert!(
        bodies.iter().all(|b| *b == br#"{"amount":1}"#),
        "the same body every time"
    );
}

#[tokio::test]
async fn every_attempt_carries_the_operation_key_and_the_next_operation_another() {
    let server = Scripted::start(vec![
        Step::status(500),
        Step::status(500),
        Step::status(200),
    ])
    .await;
    let client = client(three_quick_attempts());
    let first = client
        .send(client.post(server.url("/op")).body("a=1"))
        .await
        .expect("the third attempt succeeds");
    let second = client
        .send(client.patch(server.url("/op")).body("a=1"))
        .await
        .expect("succeeds");
    let keys: Vec<Option<String>> = server
        .received()
        .iter()
        .map(|r| r.header(DEFAULT_KEY_HEADER).map(str::to_owned))
        .collect();
    let first_key = first.key().expect("a POST has a key").as_str();
    let second_key = second.key().expect("a PATCH has a key").as_str();
    assert_ne!(first_key, second_key);
    assert_eq!(
        keys,
        [
            Some(first_key.to_owned()),
            Some(first_key.to_owned()),
            Some(first_key.to_owned()),
            Some(second_key.to_owned())
        ]
    );
}

#[tokio::test]
async fn the_callers_key_is_kept_whether_given_or_already_in_its_header() {
    let server = Scripted::start(vec![Step::status(503), Step::status(200)]).await;
    let client =
        client(three_quick_attempts()).with_key_header(HeaderName::from_static("x-operation-key"));
    let key = IdempotencyKey::new("order-17").expect("key");
    let response = client
        .operation(client.post(server.url("/op")).body("x"))
        .key(key.clone())
        .send()
        .await
        .expect("the second attempt succeeds");
    assert_eq!(response.key(), Some(&key));
    let in_header = client
        .send(
            client
                .post(server.url("/op"))
                .header("x-operation-key", "order-18")
                .body("x"),
        )
        .await
        .expect("succeeds");
    assert_eq!(
        in_header.key().map(IdempotencyKey::as_str),
        Some("order-18")
    );
    let received = server.received();
    let keys: Vec<Option<&str>> = received
        .iter()
        .map(|r| r.header("x-operation-key"))
        .collect();
    assert_eq!(keys, [Some("order-17"), Some("order-17"), Some("order-18")]);
    assert!(received
        .iter()
        .all(|r| r.header(DEFAULT_KEY_HEADER).is_none()));

    let bad = client
        .send(
            client
                .post(server.url("/op"))
                .header("x-operation-key", "")
                .body("x"),
        )
        .await
        .expect_err("an empty key is refused");
    assert!(matches!(bad, Error::InvalidKey(_)), "{bad:?}");
    assert_eq!(
        server.received().len(),
        3,
        "nothing sent for an invalid key"
    );
}

#[tokio::test]
async fn safe_methods_are_retried_without_a_key_and_put_and_delete_with_one() {
    let client = client(three_quick_attempts());
    for method in [
        reqwest::Method::GET,
        reqwest::Method::HEAD,
        reqwest::Method::OPTIONS,
        reqwest::Method::TRACE,
    ] {
        let server = Scripted::start(vec![Step::status(503), Step::status(200)]).await;
        let response = client
            .send(client.request(method.clone(), server.url("/thing/1")))
            .await
            .expect("the retry succeeds");
        assert_eq!(response.attempts(), 2, "{method}");
        assert_eq!(response.key(), None, "{method}");
        assert!(
            server
                .received()
                .iter()
                .all(|r| r.header(DEFAULT_KEY_HEADER).is_none()),
            "{method}"
        );
    }
    for method in [reqwest::Method::PUT, reqwest::Method::DELETE] {
        let server = Scripted::start(vec![Step::status(503), Step::status(200)]).await;
        let response = client
            .send(
                client
                    .request(method.clone(), server.url("/thing/1"))
                    .body("v"),
            )
            .await
            .expect("the retry succeeds");
        assert_eq!(response.attempts(), 2, "{method}");
        let key = response.key().expect("PUT and DELETE are keyed").as_str();
        let keys: Vec<Option<String>> = server
            .received()
            .iter()
            .map(|r| r.header(DEFAULT_KEY_HEADER).map(str::to_owned))
            .collect();
        assert_eq!(
            keys,
            [Some(key.to_owned()), Some(key.to_owned())],
            "{method}"
        );
    }
}

#[tokio::test]
async fn c01_keys_are_sent_in_the_header_form_the_server_reads() {
    let server = Scripted::start(vec![Step::status(200)]).await;
    let client = client(three_quick_attempts());
    for (key, sent) in [
        ("abc", "abc"),
        ("\"abc\"", "\"\\\"abc\\\"\""),
        ("q83vEg==", "\"q83vEg==\""),
        ("a,b", "\"a,b\""),
        ("k=v", "\"k=v\""),
    ] {
        client
            .operation(client.post(server.url("/op")).body("x"))
            .key(IdempotencyKey::new(key).expect("key"))
            .send()
            .await
            .expect("answered");
        let received = server.received();
        let last = received.last().expect("a request");
        assert_eq!(last.header(DEFAULT_KEY_HEADER), Some(sent), "{key}");
    }
    // A key already in the header is read as the server reads it, and sent back alike.
    let response = client
        .send(
            client
                .post(server.url("/op"))
                .header(DEFAULT_KEY_HEADER, "\"q83vEg==\"")
                .body("x"),
        )
        .await
        .expect("answered");
    assert_eq!(response.key().map(IdempotencyKey::as_str), Some("q83vEg=="));
    let received = server.received();
    assert_eq!(
        received.last().and_then(|r| r.header(DEFAULT_KEY_HEADER)),
        Some("\"q83vEg==\"")
    );
    // A bare value the server would refuse (`=` is not a token character) is refused here,
    // before anything is sent.
    let before = server.received().len();
    let refused = client
        .send(
            client
                .post(server.url("/op"))
                .header(DEFAULT_KEY_HEADER, "q83vEg==")
                .body("x"),
        )
        .await
        .expect_err("the server would answer 400");
    assert!(matches!(refused, Error::InvalidKey(_)), "{refused:?}");
    assert_eq!(server.received().len(), before);
}

#[tokio::test]
async fn retry_after_in_seconds_or_as_a_date_is_waited_for() {
    for as_date in [false, true] {
        let retry_after = if as_date {
            httpdate_in(Duration::from_secs(2))
        } else {
            "1".to_owned()
        };
        let server = Scripted::start(vec![
            Step::with_header(429, "retry-after", &retry_after),
            Step::status(200),
        ])
        .await;
        let client = client(three_quick_attempts());
        let started = Instant::now();
        let response = client
            .send(client.post(server.url("/op")).body("x"))
            .await
            .expect("the retry succeeds");
        assert_eq!(response.attempts(), 2);
        // An HTTP-date has whole seconds: "in 2 s" is at least 1 s away.
        assert!(
            started.elapsed() >= Duration::from_millis(950),
            "Retry-After {retry_after:?} waited only {:?}",
            started.elapsed()
        );
    }
}

/// An HTTP-date `after` from now.
fn httpdate_in(after: Duration) -> String {
    httpdate::fmt_http_date(std::time::SystemTime::now() + after)
}

#[tokio::test]
async fn a_retry_after_beyond_the_deadline_returns_the_last_answer_at_once() {
    let server = Scripted::start(vec![Step::with_header(503, "retry-after", "120")]).await;
    let client = client(
        three_quick_attempts()
            .deadline(Duration::from_secs(5))
            .max_retry_after(Duration::from_secs(600)),
    );
    let started = Instant::now();
    let error = client
        .send(client.post(server.url("/op")).body("x"))
        .await
        .expect_err("no time to wait two minutes");
    assert!(
        started.elapsed() < Duration::from_secs(2),
        "{:?}",
        started.elapsed()
    );
    assert_eq!(error.attempts(), 1);
    assert_eq!(error.stop(), Some(Stop::Deadline));
    assert_eq!(error.response().map(|r| r.status().as_u16()), Some(503));
    assert_eq!(server.received().len(), 1);
}

#[tokio::test]
async fn a_long_retry_after_is_capped() {
    let server = Scripted::start(vec![
        Step::with_header(409, "retry-after", "3600"),
        Step::status(200),
    ])
    .await;
    let client = client(three_quick_attempts().max_retry_after(Duration::from_millis(300)));
    let started = Instant::now();
    let response = client
        .send(client.post(server.url("/op")).body("x"))
        .await
        .expect("retried after the cap");
    let elapsed = started.elapsed();
    assert_eq!(response.attempts(), 2);
    assert!(
        elapsed >= Duration::from_millis(290) && elapsed < Duration::from_secs(5),
        "{elapsed:?}"
    );
}

#[tokio::test]
async fn timeouts_are_retried_and_the_deadline_bounds_the_whole_operation() {
    let server = Scripted::start(vec![Step::Hang]).await;
    // A second attempt of 700 ms would end past the deadline: its timeout is cut to what
    // the deadline leaves.
    let client = client(
        RetryPolicy::default()
            .max_attempts(100)
            .attempt_timeout(Duration::from_millis(700))
            .deadline(Duration::from_millis(1000))
            .backoff(Backoff::new(
                Duration::from_millis(10),
                Duration::from_millis(10),
            )),
    );
    let started = Instant::now();
    let error = client
        .send(client.post(server.url("/op")).body("x"))
        .await
        .expect_err("never an answer");
    let elapsed = started.elapsed();
    assert!(
        // Without the cut the second attempt would run its whole 700 ms: past 1.4 s.
        elapsed >= Duration::from_millis(950) && elapsed < Duration::from_millis(1300),
        "{elapsed:?}"
    );
    assert_eq!(error.attempts(), 2, "{error}");
    assert_eq!(error.stop(), Some(Stop::Deadline));
    assert_eq!(
        error.outcome(),
        Outcome::InDoubt,
        "a timed-out attempt may have run"
    );
    match &error {
        Error::Transport(failure) => {
            assert!(matches!(
                failure.last,
                idem_client::AttemptError::Timeout(_)
            ))
        }
        other => panic!("not a transport failure: {other:?}"),
    }
    assert_eq!(server.received().len() as u32, error.attempts());
}

#[tokio::test]
async fn a_streaming_body_is_refused_before_anything_is_sent() {
    let server = Scripted::start(vec![Step::status(200)]).await;
    let client = client(three_quick_attempts());
    let chunks: Vec<Result<&'static [u8], std::io::Error>> = vec![Ok(b"amount="), Ok(b"1")];
    let body = reqwest::Body::wrap_stream(futures_util::stream::iter(chunks));
    let error = client
        .send(client.post(server.url("/op")).body(body))
        .await
        .expect_err("a stream cannot be replayed");
    assert!(matches!(error, Error::StreamingBody), "{error:?}");
    assert_eq!(error.outcome(), Outcome::NotExecuted);
    assert_eq!(error.attempts(), 0);
    tokio::time::sleep(Duration::from_millis(100)).await;
    assert_eq!(server.connections(), 0, "not even a connection was opened");
    // The same request with a buffered body goes through: the listener does count.
    client
        .send(client.post(server.url("/op")).body("amount=1"))
        .await
        .expect("a buffered body is sent");
    assert_eq!(server.connections(), 1);
}

/// A writer into a shared buffer, for the tracing subscriber.
#[derive(Clone, Default)]
struct Captured(std::sync::Arc<std::sync::Mutex<Vec<u8>>>);

impl std::io::Write for Captured {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.0.lock().expect("lock").extend_from_slice(buf);
        Ok(buf.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

/// The tracing output of one operation (503, then 200) with the key `key`, at `level`.
async fn traced(level: tracing::Level, key: &str) -> String {
    let server = Scripted::start(vec![Step::status(503), Step::status(200)]).await;
    let client = client(three_quick_attempts());
    let captured = Captured::default();
    let writer = captured.clone();
    let subscriber = tracing_subscriber::fmt()
        .with_max_level(level)
        .with_ansi(false)
        .with_writer(move || writer.clone())
        .finish();
    let operation = client
        .operation(client.post(server.url("/op")).body("x"))
        .key(IdempotencyKey::new(key).expect("key"))
        .send();
    let dispatch = tracing::Dispatch::new(subscriber);
    let response = tracing::dispatcher::with_default(&dispatch, || {
        tokio::task::block_in_place(|| tokio::runtime::Handle::current().block_on(operation))
    })
    .expect("the retry succeeds");
    assert_eq!(response.attempts(), 2);
    let text = String::from_utf8_lossy(&captured.0.lock().expect("lock")).into_owned();
    text
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tracing_shows_each_attempt_and_its_delay_but_the_key_only_at_debug() {
    let info = traced(tracing::Level::INFO, "secret-order-991").await;
    assert!(info.contains("idem_client.operation"), "{info}");
    assert!(info.contains("idem_client.attempt"), "{info}");
    assert!(
        info.contains("attempt=1") && info.contains("retrying"),
        "{info}"
    );
    assert!(info.contains("delay_ms="), "{info}");
    assert!(
        !info.contains("secret-order-991"),
        "the key at info level: {info}"
    );

    let debug = traced(tracing::Level::DEBUG, "secret-order-992").await;
    assert!(
        debug.contains("secret-order-992"),
        "the key at debug level: {debug}"
    );
}

/// A client of at most `attempts` attempts with 10 ms pauses, 300 ms per attempt.
fn short_attempts(attempts: u32) -> RetryPolicy {
    three_quick_attempts()
        .max_attempts(attempts)
        .attempt_timeout(Duration::from_millis(300))
}

#[tokio::test]
async fn a_timeout_then_429s_until_the_attempts_run_out_is_in_doubt() {
    let server = Scripted::start(vec![Step::Hang, Step::status(429)]).await;
    let client = client(short_attempts(3));
    let error = client
        .send(client.post(server.url("/op")).body("x"))
        .await
        .expect_err("429 to the end");
    assert_eq!(error.attempts(), 3);
    assert_eq!(error.stop(), Some(Stop::Attempts));
    assert_eq!(error.response().map(|r| r.status().as_u16()), Some(429));
    assert_eq!(
        error.outcome(),
        Outcome::InDoubt,
        "the first attempt may have run: {error}"
    );
}

#[tokio::test]
async fn a_timeout_then_refused_connections_is_in_doubt() {
    let server = Scripted::start(vec![Step::HangAndStopListening]).await;
    let client = client(short_attempts(3));
    let error = client
        .send(client.post(server.url("/op")).body("x"))
        .await
        .expect_err("no server any more");
    assert_eq!(error.attempts(), 3, "{error}");
    assert_eq!(server.received().len(), 1);
    match &error {
        Error::Transport(failure) => assert!(
            matches!(failure.last, idem_client::AttemptError::Connect(_)),
            "{error}"
        ),
        other => panic!("not a transport failure: {other:?}"),
    }
    assert_eq!(
        error.outcome(),
        Outcome::InDoubt,
        "the first attempt may have run: {error}"
    );
}

#[tokio::test]
async fn a_connection_closed_after_the_request_was_read_is_in_doubt() {
    let server = Scripted::start(vec![Step::CloseAfterRead]).await;
    let client = client(short_attempts(3));
    let error = client
        .send(client.post(server.url("/op")).body("x"))
        .await
        .expect_err("never an answer");
    assert_eq!(error.attempts(), 3, "{error}");
    assert_eq!(server.received().len(), 3);
    assert_eq!(error.stop(), Some(Stop::Attempts));
    assert_eq!(error.outcome(), Outcome::InDoubt, "{error}");
}

#[tokio::test]
async fn a_success_whose_body_is_cut_off_is_retried() {
    let server = Scripted::start(vec![Step::Truncated(200), Step::status(200)]).await;
    let client = client(short_attempts(3));
    let response = client
        .send(client.post(server.url("/op")).body("x"))
        .await
        .expect("the retry gets the whole answer");
    assert_eq!(response.attempts(), 2);
    assert_eq!(response.body().as_ref(), b"{}");
}

#[tokio::test]
async fn a_body_cut_off_after_a_status_that_is_not_retried_is_final() {
    // A head the server stored (echoing the key, or replayed) is in doubt as its whole
    // answer would be (C8), whatever its body became.
    for (step, status, outcome) in [
        (Step::Truncated(400), 400, Outcome::NotExecuted),
        (Step::Truncated(422), 422, Outcome::NotExecuted),
        (Step::Truncated(501), 501, Outcome::InDoubt),
        (
            Step::TruncatedWithHeader(422, "idempotency-key", "k-1"),
            422,
            Outcome::InDoubt,
        ),
        (
            Step::TruncatedWithHeader(402, "idempotent-replayed", "true"),
            402,
            Outcome::InDoubt,
        ),
    ] {
        let server = Scripted::start(vec![step]).await;
        let client = client(short_attempts(3));
        let error = client
            .send(client.post(server.url("/op")).body("x"))
            .await
            .expect_err("a refusal");
        assert_eq!(error.attempts(), 1, "{status}: {error}");
        assert_eq!(server.received().len(), 1, "{status}");
        assert_eq!(error.stop(), Some(Stop::NotRetryable), "{status}");
        assert_eq!(error.outcome(), outcome, "{status}: {error}");
        match &error {
            Error::Transport(failure) => {
                assert_eq!(failure.status.map(|s| s.as_u16()), Some(status))
            }
            other => panic!("not a transport failure: {other:?}"),
        }
    }
}

#[tokio::test]
async fn an_answer_over_the_size_limit_is_final_and_in_doubt() {
    let limit = 4096;
    for chunked in [false, true] {
        let server = Scripted::start(vec![Step::Large {
            status: 200,
            bytes: limit + 1,
            chunked,
        }])
        .await;
        let client = client(short_attempts(3).max_response_bytes(limit));
        let error = client
            .send(client.post(server.url("/op")).body("x"))
            .await
            .expect_err("too large");
        assert_eq!(error.attempts(), 1, "chunked {chunked}: {error}");
        assert_eq!(error.stop(), Some(Stop::NotRetryable));
        assert_eq!(error.outcome(), Outcome::InDoubt, "the server answered");
        match &error {
            Error::Transport(failure) => assert!(
                matches!(failure.last, idem_client::AttemptError::TooLarge { limit: l } if l == limit),
                "{error}"
            ),
            other => panic!("not a transport failure: {other:?}"),
        }
        // At the limit exactly, the answer is read.
        let server = Scripted::start(vec![Step::Large {
            status: 200,
            bytes: limit,
            chunked,
        }])
        .await;
        let response = client
            .send(client.post(server.url("/op")).body("x"))
            .await
            .expect("at the limit");
        assert_eq!(response.body().len(), limit);
    }
}

#[tokio::test]
async fn no_deadline_and_no_attempt_timeout_do_not_overflow() {
    let server = Scripted::start(vec![Step::status(503), Step::status(200)]).await;
    let client = client(
        three_quick_attempts()
            .deadline(Duration::MAX)
            .attempt_timeout(Duration::MAX),
    );
    let response = client
        .send(client.post(server.url("/op")).body("x"))
        .await
        .expect("the retry succeeds");
    assert_eq!(response.attempts(), 2);
}

#[tokio::test]
async fn no_attempt_is_sent_with_less_than_the_least_attempt_time_left() {
    // After a 1 s Retry-After, ~50 ms would be left: less than the 100 ms an attempt needs.
    let server =
        Scripted::start(vec![Step::with_header(429, "retry-after", "1"), Step::Hang]).await;
    let client = client(three_quick_attempts().deadline(Duration::from_millis(1050)));
    let started = Instant::now();
    let error = client
        .send(client.post(server.url("/op")).body("x"))
        .await
        .expect_err("no time for a second attempt");
    assert!(
        // A second attempt would first wait the whole second of Retry-After.
        started.elapsed() < Duration::from_millis(900),
        "{:?}",
        started.elapsed()
    );
    assert_eq!(error.attempts(), 1, "{error}");
    assert_eq!(error.stop(), Some(Stop::Deadline));
    assert_eq!(error.outcome(), Outcome::NotExecuted, "{error}");
    assert_eq!(server.received().len(), 1);
}

#[tokio::test]
async fn debug_forms_never_show_the_key() {
    let secret = "secret-key-5521";
    let echoed = Step::with_header(200, DEFAULT_KEY_HEADER, secret);
    let server = Scripted::start(vec![
        echoed,
        Step::with_header(422, DEFAULT_KEY_HEADER, secret),
    ])
    .await;
    let client = client(three_quick_attempts());
    let key = IdempotencyKey::new(secret).expect("key");
    let operation = client
        .operation(
            client
                .post(server.url("/op"))
                .header(DEFAULT_KEY_HEADER, secret)
                .body("x"),
        )
        .key(key.clone());
    let shown = format!("{operation:?}");
    assert!(!shown.contains(secret), "operation: {shown}");
    let response = operation.send().await.expect("a 200");
    assert_eq!(
        response
            .headers()
            .get(DEFAULT_KEY_HEADER)
            .map(|v| v.as_bytes()),
        Some(secret.as_bytes()),
        "the server echoes the key"
    );
    assert!(
        response
            .headers()
            .get(DEFAULT_KEY_HEADER)
            .is_some_and(|v| v.is_sensitive()),
        "the echoed key is marked sensitive"
    );
    let shown = format!("{response:?}");
    assert!(!shown.contains(secret), "response: {shown}");
    let error = client
        .operation(client.post(server.url("/op")).body("x"))
        .key(key)
        .send()
        .await
        .expect_err("a 422");
    let shown = format!("{error:?}");
    assert!(!shown.contains(secret), "error: {shown}");
    assert!(!error.to_string().contains(secret), "error: {error}");
}

#[tokio::test]
async fn a_redirect_loop_is_final_and_in_doubt() {
    let server = Scripted::start(vec![Step::with_header(307, "location", "/op")]).await;
    let client = client(three_quick_attempts());
    let error = client
        .send(client.post(server.url("/op")).body("x"))
        .await
        .expect_err("a loop");
    assert_eq!(error.attempts(), 1, "{error}");
    assert_eq!(error.stop(), Some(Stop::NotRetryable));
    assert_eq!(error.outcome(), Outcome::InDoubt);
    match &error {
        Error::Transport(failure) => assert!(
            matches!(failure.last, idem_client::AttemptError::Redirect(_)),
            "{error}"
        ),
        other => panic!("not a transport failure: {other:?}"),
    }
    // One attempt's worth of requests: the first and the redirects reqwest follows (10).
    let requests = server.received().len();
    assert!((2..=11).contains(&requests), "{requests} requests");
}

#[tokio::test]
async fn the_error_source_is_the_underlying_error_not_a_repetition() {
    let port = {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
        listener.local_addr().expect("addr").port()
    };
    let client = client(three_quick_attempts());
    let error = client
        .send(client.post(format!("http://127.0.0.1:{port}/op")).body("x"))
        .await
        .expect_err("refused");
    let source = std::error::Error::source(&error).expect("a source");
    assert!(
        source.downcast_ref::<reqwest::Error>().is_some(),
        "the source is reqwest's error, not {source}"
    );
    let (outer, inner) = (error.to_string(), source.to_string());
    assert!(!outer.contains(&inner), "{outer} repeats {inner}");
    assert!(outer.contains("cannot connect"), "{outer}");
}

#[tokio::test]
async fn an_announced_length_over_the_limit_ends_the_attempt_before_reading_the_body() {
    // 512 MiB announced, nothing sent: the limit is checked on the head, not by waiting.
    let server = Scripted::start(vec![Step::Announce(200, 512 * 1024 * 1024)]).await;
    let client = client(short_attempts(3));
    let started = Instant::now();
    let error = client
        .send(client.post(server.url("/op")).body("x"))
        .await
        .expect_err("too large");
    assert!(
        // Waiting for the body instead would take three 300 ms attempt timeouts.
        started.elapsed() < Duration::from_millis(600),
        "{:?}",
        started.elapsed()
    );
    assert_eq!(error.attempts(), 1, "{error}");
    assert_eq!(error.outcome(), Outcome::InDoubt);
    match &error {
        Error::Transport(failure) => {
            assert!(
                matches!(
                    failure.last,
                    idem_client::AttemptError::TooLarge { limit } if limit == idem_client::DEFAULT_MAX_RESPONSE_BYTES
                ),
                "{error}"
            );
            assert_eq!(failure.status.map(|s| s.as_u16()), Some(200));
        }
        other => panic!("not a transport failure: {other:?}"),
    }
}

/// C8: "not executed" is a 4xx refusal (other than a live 409), nothing else. A status past
/// 599 (LinkedIn's 999, a broken proxy's) is neither a refusal nor a success: the request
/// reached a server, so the outcome is in doubt, never a licence to resend under a new key.
#[tokio::test]
async fn c08_a_status_past_599_is_in_doubt_never_not_executed() {
    let client = client(three_quick_attempts());
    for status in [600, 799, 999] {
        let server = Scripted::start(vec![Step::status(status)]).await;
        let error = client
            .send(client.post(server.url("/op")).body("x"))
            .await
            .expect_err("not a success");
        assert_eq!(error.attempts(), 1, "{status}: not retried");
        assert_eq!(error.stop(), Some(Stop::NotRetryable), "{status}");
        assert_eq!(error.outcome(), Outcome::InDoubt, "{status}: {error}");
        // Its body cut off after the head: the same.
        let server = Scripted::start(vec![Step::Truncated(status)]).await;
        let error = client
            .send(client.post(server.url("/op")).body("x"))
            .await
            .expect_err("not a success");
        assert_eq!(error.attempts(), 1, "{status}: cut, not retried");
        assert_eq!(error.outcome(), Outcome::InDoubt, "{status} cut: {error}");
    }
}

/// C8: a POST that ran and answered "see other" (a 302 or 303 to the created charge, as many
/// frameworks redirect after a create) is followed by reqwest as a GET; when that GET is
/// refused (a 404, or a 401 once reqwest dropped the credentials on another origin), the
/// refusal is the GET's, not the POST's: the outcome is in doubt, never "not executed".
#[tokio::test]
async fn c08_a_refusal_of_a_redirects_target_is_in_doubt() {
    let client = client(three_quick_attempts());
    for (redirect, refusal) in [(302, 404), (303, 401)] {
        let server = Scripted::start(vec![
            Step::with_header(redirect, "location", "/v1/charges/ch_1"),
            Step::status(refusal),
        ])
        .await;
        let error = client
            .send(client.post(server.url("/v1/charges")).body("amount=1"))
            .await
            .expect_err("a refusal");
        let lines: Vec<String> = server.received().iter().map(|r| r.line.clone()).collect();
        assert_eq!(lines[0], "POST /v1/charges HTTP/1.1");
        assert_eq!(
            error.outcome(),
            Outcome::InDoubt,
            "{redirect} then {refusal} ({lines:?}): {error}"
        );
    }
    // A URL's fragment, never sent, is no redirect: a refusal is still a refusal.
    let server = Scripted::start(vec![Step::status(404)]).await;
    let error = client
        .send(client.post(server.url("/v1/charges#top")).body("amount=1"))
        .await
        .expect_err("a refusal");
    assert_eq!(error.outcome(), Outcome::NotExecuted, "{error}");
}

/// C8: a 301 or 302 turns a POST into a GET without its body, and reqwest follows it: the
/// charge was never sent, yet the GET's 200 came back. A keyed request's answer from another
/// URL is therefore never its result unless the answer was stored under its key: in doubt,
/// final (a retry would be redirected alike). A 307 re-sends the POST itself; when that
/// answer echoes the key, it is the result. A safe request follows redirects as ever.
#[tokio::test]
async fn c08_a_keyed_requests_success_from_a_redirects_target_is_not_its_result() {
    let client = client(three_quick_attempts());
    for redirect in [301, 302, 303] {
        let server = Scripted::start(vec![
            Step::with_header(redirect, "location", "/v1/charges/ch_1"),
            Step::status(200),
        ])
        .await;
        let error = client
            .send(client.post(server.url("/v1/charges")).body("amount=1"))
            .await
            .expect_err("not the POST's answer");
        let lines: Vec<String> = server.received().iter().map(|r| r.line.clone()).collect();
        assert_eq!(
            lines.len(),
            2,
            "{redirect}: one attempt, followed once: {lines:?}"
        );
        assert_eq!(error.outcome(), Outcome::InDoubt, "{redirect}: {error}");
        assert_eq!(error.stop(), Some(Stop::NotRetryable), "{redirect}");
        match &error {
            Error::Status(failure) => assert_eq!(failure.response.status().as_u16(), 200),
            other => panic!("{redirect}: not the target's answer: {other:?}"),
        }
    }
    // The POST re-sent by a 307 to a server that stored its answer under the key.
    let server = Scripted::start(vec![
        Step::with_header(307, "location", "/v2/charges"),
        Step::with_header(201, "idempotency-key", "k"),
    ])
    .await;
    let response = client
        .send(client.post(server.url("/v1/charges")).body("amount=1"))
        .await
        .expect("the POST's own answer");
    assert_eq!(response.status().as_u16(), 201);
    // A GET, sent without a key, follows a redirect to its result.
    let server = Scripted::start(vec![
        Step::with_header(302, "location", "/v1/charges/ch_1"),
        Step::status(200),
    ])
    .await;
    let response = client
        .send(client.get(server.url("/v1/charges")))
        .await
        .expect("a safe request's result");
    assert_eq!(response.status().as_u16(), 200);
}

/// C5: a 409's `Retry-After` is a floor under the pause even when the answer's body is cut
/// off after its head: the head said when to come back, and coming back sooner only finds the
/// original still running and burns an attempt.
#[tokio::test]
async fn c05_a_retry_after_is_honoured_when_the_body_after_it_is_cut_off() {
    for status in [409, 503] {
        let server = Scripted::start(vec![
            Step::TruncatedWithHeader(status, "retry-after", "1"),
            Step::with_header(200, "idempotent-replayed", "true"),
        ])
        .await;
        let client = client(three_quick_attempts());
        let started = Instant::now();
        let response = client
            .send(client.post(server.url("/op")).body("x"))
            .await
            .expect("the replay");
        assert_eq!(response.attempts(), 2, "{status}");
        let elapsed = started.elapsed();
        assert!(
            elapsed >= Duration::from_millis(990),
            "{status}: Retry-After: 1 not waited for: {elapsed:?}"
        );
    }
}
