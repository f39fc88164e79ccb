//! The outbox beside a hand-written one on the same driver (sqlx, PostgreSQL at `IDEM_PG_URL`,
//! a database of its own), side by side in one run:
//!
//! - `outbox/enqueue`: a charge's transaction (BEGIN, the charge's INSERT, COMMIT) alone, with
//!   `PgOutbox::enqueue`, and with a hand-written INSERT of the same row;
//! - `outbox/dispatch`: draining 200 due messages to a local receiver (axum on loopback) by
//!   `Dispatcher::dispatch_due`, against a hand-written loop: claim a batch with
//!   `FOR UPDATE SKIP LOCKED`, sign (idem-signature), POST them at once with reqwest, mark each
//!   delivered (and the same loop writing each attempt's row, as the outbox does). Same batch
//!   (16), same client settings (no redirects, 30 s idle connections, a 15 s request timeout).
//!   Printed: messages per second and the ratios (target >= 0.80).

use std::sync::Arc;
use std::time::{Duration, Instant};

use criterion::{criterion_group, criterion_main, Criterion};
use idem::postgres::sqlx::{self, AssertSqlSafe, Connection, Executor, PgConnection, PgPool};
use idem::postgres::PgStore;
use idem_outbox::{Endpoint, Message, PgOutbox, Schedule};
use idem_signature::StandardWebhooks;
use tokio::runtime::Runtime;

const SECRET: &str = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw";
const BATCH: usize = 16;
/// An endpoint's default attempt timeout, which the dispatcher puts on each request.
const ATTEMPT_TIMEOUT: Duration = idem_outbox::DEFAULT_TIMEOUT;
const DRAIN: usize = 200;
const RAW_SCHEMA: &str =
    "CREATE TABLE IF NOT EXISTS raw_outbox (id bigserial PRIMARY KEY, message_id text NOT NULL, \
     payload bytea NOT NULL, state text NOT NULL, created_at timestamptz NOT NULL DEFAULT now()); \
     CREATE INDEX IF NOT EXISTS raw_outbox_due ON raw_outbox (id) WHERE state = 'pending'; \
     CREATE TABLE IF NOT EXISTS raw_attempts (id bigserial PRIMARY KEY, outbox_id bigint NOT NULL, status integer, \
     duration_ms bigint NOT NULL, response bytea); \
     CREATE TABLE IF NOT EXISTS charges (id bigserial PRIMARY KEY, cents bigint NOT NULL)";
const RAW_INSERT: &str =
    "INSERT INTO raw_outbox (message_id, payload, state) VALUES ($1, $2, 'pending')";
const RAW_CLAIM: &str = "WITH due AS (SELECT id FROM raw_outbox WHERE state = 'pending' ORDER BY id LIMIT $1 \
     FOR UPDATE SKIP LOCKED) UPDATE raw_outbox r SET state = 'claimed' FROM due WHERE r.id = due.id \
     RETURNING r.id, r.message_id, r.payload";
const RAW_DONE: &str = "UPDATE raw_outbox SET state = 'delivered' WHERE id = $1";
/// The same, and the attempt's row, as the outbox records every attempt.
const RAW_DONE_RECORDED: &str = "WITH done AS (UPDATE raw_outbox SET state = 'delivered' WHERE id = $1 RETURNING id) \
     INSERT INTO raw_attempts (outbox_id, status, duration_ms, response) SELECT id, $2, $3, $4 FROM done";

struct Bench {
    pool: PgPool,
    outbox: PgOutbox,
    url: String,
}

fn runtime() -> Runtime {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("a runtime")
}

async fn setup() -> Bench {
    let base = std::env::var("IDEM_PG_URL").expect("IDEM_PG_URL (scripts/services.sh starts one)");
    let name = format!("outbox_bench_{}", std::process::id());
    let mut admin = PgConnection::connect(&base).await.expect("the server");
    let _ = admin
        .execute(AssertSqlSafe(format!("DROP DATABASE IF EXISTS {name}")))
        .await;
    admin
        .execute(AssertSqlSafe(format!("CREATE DATABASE {name}")))
        .await
        .expect("a database");
    let slash = base.rfind('/').expect("a database in IDEM_PG_URL");
    let db_url = format!("{}/{name}", &base[..slash]);
    let store = PgStore::builder()
        .max_connections(16)
        .connect(&db_url)
        .await
        .expect("a store");
    store.migrate().await.expect("migrated");
    sqlx::raw_sql(RAW_SCHEMA)
        .execute(store.pool())
        .await
        .expect("raw tables");
    let outbox = PgOutbox::open(&store).await.expect("an outbox");
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("a port");
    let url = format!(
        "http://{}/hooks",
        listener.local_addr().expect("an address")
    );
    tokio::spawn(async move {
        let app = axum::Router::new().fallback(|| async { "ok" });
        let _ = axum::serve(listener, app).await;
    });
    let schedule = Schedule::new([Duration::from_secs(60)]).expect("a schedule");
    let endpoint = Endpoint::new("merchant", &url, [SECRET])
        .expect("an endpoint")
        .schedule(schedule);
    outbox.register(&endpoint).await.expect("registered");
    Bench {
        pool: store.pool().clone(),
        outbox,
        url,
    }
}

fn payload(n: u64) -> Vec<u8> {
    format!(r#"{{"type":"charge.succeeded","data":{{"object":{{"id":"ch_{n}","amount":4242}}}}}}"#)
        .into_bytes()
}

async fn charge(pool: &PgPool, enqueue: u8, outbox: &PgOutbox, n: u64) {
    let mut tx = pool.begin().await.expect("a transaction");
    sqlx::query("INSERT INTO charges (cents) VALUES (4242)")
        .execute(&mut *tx)
        .await
        .expect("a charge");
    match enqueue {
        1 => {
            let message = Message::bytes("application/json", payload(n)).to("merchant");
            outbox.enqueue(&mut tx, &message).await.expect("enqueued");
        }
        2 => {
            sqlx::query(RAW_INSERT)
                .bind(format!("msg_{n}"))
                .bind(payload(n))
                .execute(&mut *tx)
                .await
                .expect("inserted");
        }
        _ => {}
    }
    tx.commit().await.expect("committed");
}

fn enqueue(c: &mut Criterion, rt: &Runtime, bench: &Arc<Bench>) {
    let mut group = c.benchmark_group("outbox/enqueue");
    group.sample_size(20);
    for (name, mode) in [
        ("effect only", 0u8),
        ("idem-outbox", 1),
        ("hand-written", 2),
    ] {
        let bench = Arc::clone(bench);
        group.bench_function(name, |b| {
            b.to_async(rt).iter_custom(|iters| {
                let bench = Arc::clone(&bench);
                async move {
                    let started = Instant::now();
                    for n in 0..iters {
                        charge(&bench.pool, mode, &bench.outbox, n).await;
                    }
                    started.elapsed()
                }
            });
        });
    }
    group.finish();
    // Leave nothing due for the dispatch runs.
    rt.block_on(async {
        sqlx::query("DELETE FROM idem_outbox_deliveries")
            .execute(&bench.pool)
            .await
            .expect("cleared");
        sqlx::query("DELETE FROM raw_outbox")
            .execute(&bench.pool)
            .await
            .expect("cleared");
    });
}

async fn drain_outbox(bench: &Bench, dispatcher: &idem_outbox::Dispatcher) -> Duration {
    for n in 0..DRAIN as u64 {
        let mut tx = bench.pool.begin().await.expect("a transaction");
        let message = Message::bytes("application/json", payload(n)).to("merchant");
        bench
            .outbox
            .enqueue(&mut tx, &message)
            .await
            .expect("enqueued");
        tx.commit().await.expect("committed");
    }
    let started = Instant::now();
    let mut delivered = 0;
    while delivered < DRAIN {
        delivered += dispatcher.dispatch_due().await.expect("dispatched");
    }
    started.elapsed()
}

async fn drain_raw(
    bench: &Bench,
    client: &reqwest::Client,
    signer: &StandardWebhooks,
    record: bool,
) -> Duration {
    for n in 0..DRAIN as u64 {
        let mut tx = bench.pool.begin().await.expect("a transaction");
        sqlx::query(RAW_INSERT)
            .bind(format!("msg_{n}"))
            .bind(payload(n))
            .execute(&mut *tx)
            .await
            .expect("inserted");
        tx.commit().await.expect("committed");
    }
    let started = Instant::now();
    let mut delivered = 0;
    while delivered < DRAIN {
        let rows: Vec<(i64, String, Vec<u8>)> = sqlx::query_as(RAW_CLAIM)
            .bind(BATCH as i64)
            .fetch_all(&bench.pool)
            .await
            .expect("claimed");
        let mut sends = tokio::task::JoinSet::new();
        for (id, message_id, body) in rows {
            let (client, pool, url, signer) = (
                client.clone(),
                bench.pool.clone(),
                bench.url.clone(),
                signer.clone(),
            );
            sends.spawn(async move {
                let now = idem_signature::now_unix();
                let signature = signer.sign_with_all_secrets(&message_id, now, &body);
                let started = Instant::now();
                let response = client
                    .post(url)
                    .header("content-type", "application/json")
                    .header("webhook-id", &message_id)
                    .header("webhook-timestamp", now.to_string())
                    .header("webhook-signature", signature)
                    .body(body)
                    .timeout(ATTEMPT_TIMEOUT)
                    .send()
                    .await
                    .expect("sent");
                let status = i32::from(response.status().as_u16());
                let body = response
                    .bytes()
                    .await
                    .map(|b| b.to_vec())
                    .unwrap_or_default();
                if record {
                    sqlx::query(RAW_DONE_RECORDED)
                        .bind(id)
                        .bind(status)
                        .bind(i64::try_from(started.elapsed().as_millis()).unwrap_or(i64::MAX))
                        .bind(body)
                        .execute(&pool)
                        .await
                        .expect("recorded");
                } else {
                    sqlx::query(RAW_DONE)
                        .bind(id)
                        .execute(&pool)
                        .await
                        .expect("recorded");
                }
            });
        }
        while let Some(sent) = sends.join_next().await {
            sent.expect("a send");
            delivered += 1;
        }
    }
    started.elapsed()
}

fn dispatch(rt: &Runtime, bench: &Arc<Bench>) {
    let dispatcher = bench.outbox.dispatcher().allow_loopback(true).batch(BATCH);
    // The dispatcher's client settings: no redirects, idle connections kept 30 s, its user
    // agent; each request bounded by the endpoint's timeout (the dispatcher's resolver is not
    // consulted for an address literal like the receiver's).
    let client = reqwest::Client::builder()
        .redirect(reqwest::redirect::Policy::none())
        .pool_idle_timeout(Duration::from_secs(30))
        .user_agent("idem-outbox-bench")
        .build()
        .expect("a client");
    let signer = StandardWebhooks::new([SECRET]).expect("a secret");
    let (mut library, mut raw, mut recorded) = (Vec::new(), Vec::new(), Vec::new());
    rt.block_on(async {
        // Warm each (connections, the client's pool), then alternate rounds.
        drain_outbox(bench, &dispatcher).await;
        drain_raw(bench, &client, &signer, false).await;
        drain_raw(bench, &client, &signer, true).await;
        for _ in 0..5 {
            library.push(drain_outbox(bench, &dispatcher).await);
            raw.push(drain_raw(bench, &client, &signer, false).await);
            recorded.push(drain_raw(bench, &client, &signer, true).await);
        }
    });
    let per_second = |mut runs: Vec<Duration>| {
        runs.sort();
        DRAIN as f64 / runs[runs.len() / 2].as_secs_f64()
    };
    let (library, raw, recorded) = (per_second(library), per_second(raw), per_second(recorded));
    println!(
        "outbox/dispatch: idem-outbox {library:.0} msg/s; hand-written SKIP LOCKED loop {raw:.0} msg/s (ratio {:.2}, target >= 0.80); \
         the same loop recording each attempt's row {recorded:.0} msg/s (ratio {:.2})",
        library / raw,
        library / recorded
    );
}

fn outbox(c: &mut Criterion) {
    let rt = runtime();
    let bench = Arc::new(rt.block_on(setup()));
    enqueue(c, &rt, &bench);
    dispatch(&rt, &bench);
}

criterion_group! {
    name = benches;
    config = Criterion::default().warm_up_time(Duration::from_millis(500)).measurement_time(Duration::from_secs(2));
    targets = outbox
}
criterion_main!(benches);
