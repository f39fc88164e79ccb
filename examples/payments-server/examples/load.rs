//! A small load loop against a running payments server: one charge is created, then
//! `CALLERS` tasks ask for it for `SECONDS` seconds, each request after the previous one's
//! answer, on kept-alive connections, and the requests per second are printed for two paths:
//! `GET /v1/charges/{id}` (a read) and the same `POST /v1/charges` again with its idempotency
//! key (a replay).
//!
//! ```sh
//! cargo run -p payments-server -- --addr 127.0.0.1:8080 --database load.db &
//! cargo run -p payments-server --example load -- http://127.0.0.1:8080 8 5
//! ```

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

const API_KEY: &str = "sk_test_load";
const FORM: &[(&str, &str)] = &[("amount", "4242"), ("currency", "usd")];

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let mut args = std::env::args().skip(1);
    let base = args
        .next()
        .unwrap_or_else(|| "http://127.0.0.1:8080".to_owned());
    let callers: usize = args.next().map_or(Ok(8), |n| n.parse())?;
    let seconds: u64 = args.next().map_or(Ok(5), |n| n.parse())?;
    let client = reqwest::Client::builder()
        .pool_max_idle_per_host(callers)
        .build()?;
    let key = format!("load-{}", std::process::id());
    let created = client
        .post(format!("{base}/v1/charges"))
        .bearer_auth(API_KEY)
        .header("Idempotency-Key", &key)
        .form(FORM)
        .send()
        .await?;
    let status = created.status();
    let body: serde_json::Value = created.json().await?;
    let id = body["id"]
        .as_str()
        .ok_or_else(|| format!("no charge id in the answer ({status}): {body}"))?
        .to_owned();
    let window = Duration::from_secs(seconds);
    for path in ["get", "replay"] {
        let done = Arc::new(AtomicU64::new(0));
        let until = Instant::now() + window;
        let tasks: Vec<_> = (0..callers)
            .map(|_| {
                let (client, base, id, key, done) = (
                    client.clone(),
                    base.clone(),
                    id.clone(),
                    key.clone(),
                    Arc::clone(&done),
                );
                tokio::spawn(async move {
                    while Instant::now() < until {
                        let request = if path == "get" {
                            client.get(format!("{base}/v1/charges/{id}"))
                        } else {
                            client
                                .post(format!("{base}/v1/charges"))
                                .header("Idempotency-Key", &key)
                                .form(FORM)
                        };
                        let answer = request.bearer_auth(API_KEY).send().await?;
                        let ok = answer.status().is_success();
                        answer.bytes().await?;
                        if !ok {
                            return Err("a request was not answered with success".into());
                        }
                        done.fetch_add(1, Ordering::Relaxed);
                    }
                    Ok::<_, Box<dyn std::error::Error + Send + Sync>>(())
                })
            })
            .collect();
        for task in tasks {
            task.await?.map_err(|e| e.to_string())?;
        }
        let rate = done.load(Ordering::Relaxed) as f64 / window.as_secs_f64();
        println!("{path}: {rate:.0} requests/s ({callers} callers, {seconds} s)");
    }
    Ok(())
}
