//! Charges created through `IdempotencyMiddleware` against the payments server
//! (examples/payments-server), then counted:
//!
//! ```sh
//! cargo run -p payments-server -- --database payments.db &
//! cargo run -p idem-client --example middleware -- http://127.0.0.1:8080 3
//! ```

use idem_client::{is_replayed, reqwest, reqwest_middleware, Attempts, IdempotencyMiddleware};

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let mut args = std::env::args().skip(1);
    let base = args
        .next()
        .unwrap_or_else(|| "http://127.0.0.1:8080".to_owned());
    let orders: u32 = args.next().map_or(Ok(3), |n| n.parse())?;
    let http = reqwest::Client::builder().no_proxy().build()?;
    let client = reqwest_middleware::ClientBuilder::new(http)
        .with(IdempotencyMiddleware::default())
        .build();
    for order in 1..=orders {
        let description = format!("order-{order}");
        let response = client
            .post(format!("{base}/v1/charges"))
            .basic_auth("sk_test_123", None::<&str>)
            .form(&[
                ("description", description.as_str()),
                ("amount", "4242"),
                ("currency", "usd"),
            ])
            .send()
            .await?;
        let attempts = response
            .extensions()
            .get::<Attempts>()
            .map_or(1, Attempts::count);
        let replayed = is_replayed(response.headers());
        println!(
            "{description}: {attempts} attempt(s), {}, replayed: {replayed}",
            response.status()
        );
    }
    let list: serde_json::Value = client
        .get(format!("{base}/v1/charges?limit=100"))
        .basic_auth("sk_test_123", None::<&str>)
        .send()
        .await?
        .json()
        .await?;
    println!("charges: {}", list["data"].as_array().map_or(0, Vec::len));
    Ok(())
}
