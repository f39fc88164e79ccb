//! `IdempotencyMiddleware` in a `reqwest_middleware` chain, against a local scripted server:
//! one key on every attempt of a `send`, the same retry rules as the client (`Retry-After`,
//! 409, statuses never retried, the deadline), the caller's key kept, a body that cannot be
//! cloned sent once, and what comes back (`Attempts`, the key, `Error` in the chain's error).

mod support;

use idem_client::reqwest_middleware::{self, ClientBuilder, ClientWithMiddleware};
use idem_client::{
    is_replayed, reqwest, AttemptError, Attempts, Backoff, Error, IdempotencyKey,
    IdempotencyMiddleware, Outcome, RetryPolicy, Stop, DEFAULT_KEY_HEADER,
};
use std::time::{Duration, Instant};
use support::scripted::{Scripted, Step};

fn client(policy: RetryPolicy) -> ClientWithMiddleware {
    let http = reqwest::Client::builder()
        .no_proxy()
        .build()
        .expect("a reqwest client");
    ClientBuilder::new(http)
        .with(IdempotencyMiddleware::new().with_policy(policy))
        .build()
}

/// Three attempts at most, 10 ms pauses, 2 s per attempt, a 10 s deadline.
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

fn attempts(response: &reqwest::Response) -> Attempts {
    *response
        .extensions()
        .get::<Attempts>()
        .expect("the middleware's Attempts")
}

fn key_of(response: &reqwest::Response) -> Option<&IdempotencyKey> {
    response.extensions().get::<IdempotencyKey>()
}

/// The key header of every request the server received, in order.
fn keys_received(server: &Scripted, header: &str) -> Vec<Option<String>> {
    server
        .received()
        .iter()
        .map(|r| r.header(header).map(str::to_owned))
        .collect()
}

/// The crate's error in the chain's error.
fn idem_error(error: &reqwest_middleware::Error) -> &Error {
    Error::in_middleware(error).unwrap_or_else(|| panic!("not the crate's error: {error:?}"))
}

#[tokio::test]
async fn a_500_then_a_200_is_retried_with_the_same_key_and_the_same_body() {
    let server = Scripted::start(vec![
        Step::status(500),
        Step::Answer(200, vec![], r#"{"id":"ch_1"}"#),
    ])
    .await;
    let client = client(three_quick_attempts());
    let response = client
        .post(server.url("/v1/charges"))
        .form(&[("amount", "4242"), ("currency", "usd")])
        .send()
        .await
        .expect("the second attempt succeeds");
    assert_eq!(response.status().as_u16(), 200);
    let tried = attempts(&response);
    assert_eq!(tried.count(), 2);
    assert_eq!(tried.stop(), None);
    assert_eq!(tried.outcome(), None);
    let key = key_of(&response)
        .expect("a POST is keyed")
        .as_str()
        .to_owned();
    assert_eq!(key.len(), 36, "a UUID v4: {key}");
    assert_eq!(
        keys_received(&server, DEFAULT_KEY_HEADER),
        [Some(key.clone()), Some(key.clone())]
    );
    let received = server.received();
    assert!(
        received
            .iter()
            .all(|r| r.body == b"amount=4242&currency=usd"),
        "the same body every time"
    );
    assert_eq!(response.text().await.expect("the body"), r#"{"id":"ch_1"}"#);

    // The next send is another operation: another key.
    let next = client
        .post(server.url("/v1/charges"))
        .form(&[("amount", "4242"), ("currency", "usd")])
        .send()
        .await
        .expect("answered");
    let next_key = key_of(&next).expect("keyed").as_str().to_owned();
    assert_ne!(next_key, key);
    assert_eq!(server.received().len(), 3);
}

#[tokio::test]
async fn a_409_with_retry_after_is_waited_for_then_retried() {
    let server = Scripted::start(vec![
        Step::with_header(409, "retry-after", "1"),
        Step::with_header(200, "idempotent-replayed", "true"),
    ])
    .await;
    let client = client(three_quick_attempts());
    let started = Instant::now();
    let response = client
        .post(server.url("/v1/charges"))
        .body("amount=1")
        .send()
        .await
        .expect("the original's answer, replayed");
    let elapsed = started.elapsed();
    assert_eq!(response.status().as_u16(), 200);
    assert_eq!(attempts(&response).count(), 2);
    assert!(is_replayed(response.headers()));
    assert!(
        elapsed >= Duration::from_millis(990) && elapsed < Duration::from_secs(5),
        "Retry-After: 1 waited for: {elapsed:?}"
    );
    let keys = keys_received(&server, DEFAULT_KEY_HEADER);
    assert_eq!(keys.len(), 2);
    assert!(keys[0].is_some() && keys[0] == keys[1], "{keys:?}");
}

#[tokio::test]
async fn a_422_and_a_400_are_answered_at_once_and_not_retried() {
    let client = client(three_quick_attempts());
    for status in [422, 400] {
        let server = Scripted::start(vec![Step::status(status), Step::status(200)]).await;
        let response = client
            .post(server.url("/v1/charges"))
            .body("amount=1")
            .send()
            .await
            .expect("an answer, whatever its status");
        assert_eq!(response.status().as_u16(), status);
        let tried = attempts(&response);
        assert_eq!(tried.count(), 1, "{status}");
        assert_eq!(tried.stop(), Some(Stop::NotRetryable), "{status}");
        assert_eq!(tried.outcome(), Some(Outcome::NotExecuted), "{status}");
        assert_eq!(server.received().len(), 1, "{status}: one request");
    }
}

#[tokio::test]
async fn the_rules_are_the_clients_a_replayed_500_is_final_and_503s_run_out() {
    let client = client(three_quick_attempts());
    let server = Scripted::start(vec![Step::with_header(500, "idempotent-replayed", "true")]).await;
    let response = client
        .post(server.url("/op"))
        .body("x")
        .send()
        .await
        .expect("the stored answer");
    let tried = attempts(&response);
    assert_eq!(
        (tried.count(), tried.stop(), tried.outcome()),
        (1, Some(Stop::NotRetryable), Some(Outcome::InDoubt))
    );

    let server = Scripted::start(vec![Step::status(503)]).await;
    let response = client
        .post(server.url("/op"))
        .body("x")
        .send()
        .await
        .expect("the last answer");
    assert_eq!(response.status().as_u16(), 503);
    let tried = attempts(&response);
    assert_eq!(
        (tried.count(), tried.stop(), tried.outcome()),
        (3, Some(Stop::Attempts), Some(Outcome::InDoubt))
    );
    assert_eq!(server.received().len(), 3);
}

#[tokio::test]
async fn a_key_the_caller_set_is_kept_in_its_header_or_its_extensions() {
    let server = Scripted::start(vec![Step::status(503), Step::status(200)]).await;
    let client = client(three_quick_attempts());
    let response = client
        .post(server.url("/op"))
        .header(DEFAULT_KEY_HEADER, "order-42-payment")
        .body("x")
        .send()
        .await
        .expect("the retry succeeds");
    assert_eq!(attempts(&response).count(), 2);
    assert_eq!(
        key_of(&response).map(IdempotencyKey::as_str),
        Some("order-42-payment")
    );

    let key = IdempotencyKey::new("order-43-payment").expect("a key");
    let response = client
        .post(server.url("/op"))
        .with_extension(key.clone())
        .body("x")
        .send()
        .await
        .expect("answered");
    assert_eq!(key_of(&response), Some(&key));
    assert_eq!(
        keys_received(&server, DEFAULT_KEY_HEADER),
        [
            Some("order-42-payment".to_owned()),
            Some("order-42-payment".to_owned()),
            Some("order-43-payment".to_owned()),
        ]
    );

    // A key the server would refuse is refused here, before anything is sent.
    let refused = client
        .post(server.url("/op"))
        .header(DEFAULT_KEY_HEADER, "q83vEg==")
        .body("x")
        .send()
        .await
        .expect_err("an invalid key");
    let error = idem_error(&refused);
    assert!(matches!(error, Error::InvalidKey(_)), "{error:?}");
    assert_eq!(error.outcome(), Outcome::NotExecuted);
    assert_eq!(server.received().len(), 3, "nothing sent");
}

#[tokio::test]
async fn safe_methods_are_retried_without_a_key() {
    let client = client(three_quick_attempts());
    let server = Scripted::start(vec![Step::status(503), Step::status(200)]).await;
    let response = client
        .get(server.url("/v1/charges"))
        .send()
        .await
        .expect("the retry succeeds");
    assert_eq!(attempts(&response).count(), 2);
    assert_eq!(key_of(&response), None);
    assert_eq!(keys_received(&server, DEFAULT_KEY_HEADER), [None, None]);
}

#[tokio::test]
async fn the_deadline_bounds_the_whole_operation() {
    // Attempts that never get an answer: the second one's timeout is cut to what the
    // deadline leaves, and the operation fails in doubt, with its key.
    let server = Scripted::start(vec![Step::Hang]).await;
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
    let failed = client
        .post(server.url("/op"))
        .body("x")
        .send()
        .await
        .expect_err("never an answer");
    let elapsed = started.elapsed();
    assert!(
        elapsed >= Duration::from_millis(950) && elapsed < Duration::from_millis(1300),
        "{elapsed:?}"
    );
    let error = idem_error(&failed);
    assert_eq!(error.attempts(), 2, "{error}");
    assert_eq!(error.stop(), Some(Stop::Deadline));
    assert_eq!(error.outcome(), Outcome::InDoubt);
    match error {
        Error::Transport(failure) => {
            assert!(matches!(failure.last, AttemptError::Timeout(_)), "{error}")
        }
        other => panic!("not a transport failure: {other:?}"),
    }
    let key = error.key().expect("a POST is keyed").as_str().to_owned();
    assert_eq!(
        keys_received(&server, DEFAULT_KEY_HEADER),
        [Some(key.clone()), Some(key)]
    );

    // A Retry-After reaching past the deadline: the last answer at once, no sleep in vain.
    let server = Scripted::start(vec![Step::with_header(503, "retry-after", "30")]).await;
    let quick = self::client(three_quick_attempts().deadline(Duration::from_secs(3)));
    let started = Instant::now();
    let response = quick
        .post(server.url("/op"))
        .body("x")
        .send()
        .await
        .expect("the last answer");
    assert!(started.elapsed() < Duration::from_secs(1));
    assert_eq!(response.status().as_u16(), 503);
    assert_eq!(attempts(&response).stop(), Some(Stop::Deadline));
    assert_eq!(server.received().len(), 1);
}

#[tokio::test]
async fn a_body_that_cannot_be_cloned_is_sent_once() {
    let server = Scripted::start(vec![Step::status(503), Step::status(200)]).await;
    let client = client(three_quick_attempts());
    let chunks: Vec<Result<&'static [u8], std::io::Error>> = vec![Ok(b"amount="), Ok(b"1")];
    let body = reqwest::Body::wrap_stream(futures_util::stream::iter(chunks));
    let response = client
        .post(server.url("/op"))
        .body(body)
        .send()
        .await
        .expect("the one answer");
    assert_eq!(response.status().as_u16(), 503, "not retried");
    let tried = attempts(&response);
    assert_eq!(tried.count(), 1);
    assert_eq!(tried.stop(), Some(Stop::Attempts));
    let received = server.received();
    assert_eq!(received.len(), 1, "sent once");
    let key = key_of(&response).expect("keyed all the same").as_str();
    assert_eq!(received[0].header(DEFAULT_KEY_HEADER), Some(key));
}

#[tokio::test]
async fn no_answer_at_all_is_an_error_with_the_key_and_the_outcome() {
    let server = Scripted::start(vec![Step::CloseAfterRead]).await;
    let client = client(three_quick_attempts());
    let failed = client
        .post(server.url("/op"))
        .body("x")
        .send()
        .await
        .expect_err("never an answer");
    let error = idem_error(&failed);
    assert_eq!(error.attempts(), 3, "{error}");
    assert_eq!(error.stop(), Some(Stop::Attempts));
    assert_eq!(error.outcome(), Outcome::InDoubt, "{error}");
    assert!(error.key().is_some());
    assert_eq!(server.received().len(), 3);

    // Nothing listens: every attempt fails to connect, nothing can have run.
    let gone = {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("a free port");
        listener.local_addr().expect("its address")
    };
    let failed = client
        .post(format!("http://{gone}/op"))
        .body("x")
        .send()
        .await
        .expect_err("no server");
    let error = idem_error(&failed);
    assert_eq!(error.attempts(), 3, "{error}");
    assert_eq!(error.outcome(), Outcome::NotExecuted, "{error}");
}

/// C8: the rules are the client's: a status past 599 is in doubt, never "not executed".
#[tokio::test]
async fn c08_a_status_past_599_is_in_doubt_never_not_executed() {
    let client = client(three_quick_attempts());
    let server = Scripted::start(vec![Step::status(999)]).await;
    let response = client
        .post(server.url("/op"))
        .body("x")
        .send()
        .await
        .expect("an answer, whatever its status");
    let tried = attempts(&response);
    assert_eq!(
        (tried.count(), tried.stop(), tried.outcome()),
        (1, Some(Stop::NotRetryable), Some(Outcome::InDoubt))
    );
}

/// C8: as for the client, the refusal of a redirect's target (the GET reqwest made of a
/// POST's 302) is not the POST's: in doubt, never "not executed".
#[tokio::test]
async fn c08_a_refusal_of_a_redirects_target_is_in_doubt() {
    let client = client(three_quick_attempts());
    let server = Scripted::start(vec![
        Step::with_header(302, "location", "/v1/charges/ch_1"),
        Step::status(404),
    ])
    .await;
    let response = client
        .post(server.url("/v1/charges"))
        .body("amount=1")
        .send()
        .await
        .expect("an answer, whatever its status");
    assert_eq!(response.status().as_u16(), 404);
    let tried = attempts(&response);
    assert_eq!(
        (tried.count(), tried.stop(), tried.outcome()),
        (1, Some(Stop::NotRetryable), Some(Outcome::InDoubt))
    );
}

/// C8: as for the client, a keyed POST's success from a redirect's target (the GET reqwest
/// made of its 302) is not its result: the answer is passed on, marked final and in doubt.
#[tokio::test]
async fn c08_a_keyed_requests_success_from_a_redirects_target_is_not_its_result() {
    let client = client(three_quick_attempts());
    let server = Scripted::start(vec![
        Step::with_header(302, "location", "/v1/charges/ch_1"),
        Step::status(200),
    ])
    .await;
    let response = client
        .post(server.url("/v1/charges"))
        .body("amount=1")
        .send()
        .await
        .expect("an answer, whatever its status");
    assert_eq!(response.status().as_u16(), 200);
    let tried = attempts(&response);
    assert_eq!(
        (tried.count(), tried.stop(), tried.outcome()),
        (1, Some(Stop::NotRetryable), Some(Outcome::InDoubt))
    );
}
