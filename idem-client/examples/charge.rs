//! One charge against the payments server (examples/payments-server), sent the way a
//! production client sends it, then the same operation again to show its replay.
//!
//! ```sh
//! IDEM_TEST_HOOKS=1 cargo run -p payments-server -- --database payments.db &
//! cargo run -p idem-client --example charge -- http://127.0.0.1:8080 1500
//! ```
//!
//! The second argument (optional) is a delay in milliseconds the server's test hooks add
//! inside the charge's transaction (`X-Test-Delay-Ms`): above the client's 1 s attempt timeout,
//! the first attempt times out and the retries get 409 until the charge commits, then its
//! replay. Without the hooks the header is ignored.

use idem_client::{Client, Error, IdempotencyKey, Outcome, RetryPolicy};
use std::time::Duration;

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let mut args = std::env::args().skip(1);
    let base = args
        .next()
        .unwrap_or_else(|| "http://127.0.0.1:8080".to_owned());
    let delay_ms: u64 = match args.next() {
        Some(ms) => ms.parse()?,
        None => 0,
    };
    let client = Client::new(reqwest::Client::builder().no_proxy().build()?).with_policy(
        RetryPolicy::default()
            .attempt_timeout(Duration::from_secs(1))
            .deadline(Duration::from_secs(30))
            .max_attempts(20),
    );
    let url = format!("{base}/v1/charges");
    let charge = || {
        client
            .post(&url)
            .bearer_auth("sk_test_123")
            .header("X-Test-Delay-Ms", delay_ms.to_string())
            .form(&[
                ("amount", "4242"),
                ("currency", "usd"),
                ("description", "Tea for two"),
            ])
    };
    // One logical operation, one key: keep it to retry the same operation later.
    let key = IdempotencyKey::random()?;
    for round in ["first", "again"] {
        match client.operation(charge()).key(key.clone()).send().await {
            Ok(response) => println!(
                "{round}: {} after {} attempt(s) in {:.2?}, replayed: {}, key {}\n  {}",
                response.status(),
                response.attempts(),
                response.elapsed(),
                response.replayed(),
                key,
                response.text()
            ),
            Err(error @ Error::Status(_)) if error.outcome() == Outcome::NotExecuted => {
                println!("{round}: refused, nothing charged: {error}");
                return Ok(());
            }
            Err(error) => {
                println!("{round}: {error}; retry later under the key {key}");
                return Err(error.into());
            }
        }
    }
    Ok(())
}
