//! Review of 44c5d88: a keyed GET followed through a redirect.

mod support;

use idem_client::{reqwest, Backoff, Client, IdempotencyKey, RetryPolicy};
use std::time::Duration;
use support::scripted::{Scripted, Step};

/// A keyed GET (the caller's key, `Operation::key`, "whatever the method"; or one already in
/// the key header) followed through a 301 stays a GET, without a body to lose: the target's
/// 200 is its result, as for an unkeyed GET. The POST-turned-GET reasoning of 44c5d88 does
/// not apply, yet the answer is reported `Error::Status`, in doubt.
#[tokio::test]
async fn a_keyed_gets_success_through_a_redirect_is_its_result() {
    let http = reqwest::Client::builder()
        .no_proxy()
        .build()
        .expect("a reqwest client");
    let policy = RetryPolicy::default()
        .max_attempts(3)
        .deadline(Duration::from_secs(10))
        .attempt_timeout(Duration::from_secs(2))
        .backoff(Backoff::new(
            Duration::from_millis(10),
            Duration::from_millis(10),
        ));
    let client = Client::new(http).with_policy(policy);
    let server = Scripted::start(vec![
        Step::with_header(301, "location", "/v1/charges/ch_1/"),
        Step::status(200),
    ])
    .await;
    let key = IdempotencyKey::new("lookup-ch_1").expect("a key");
    let result = client
        .operation(client.get(server.url("/v1/charges/ch_1")))
        .key(key)
        .send()
        .await;
    let lines: Vec<String> = server.received().iter().map(|r| r.line.clone()).collect();
    assert_eq!(lines.len(), 2, "followed once: {lines:?}");
    let response = result.expect("a GET's redirect target's 200 is its result");
    assert_eq!(response.status().as_u16(), 200);
}
