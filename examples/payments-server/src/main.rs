//! A charges API shaped like Stripe's, made idempotent by idem's HTTP layer: SQLite by default,
//! PostgreSQL when `--database`/`DATABASE_URL` is a `postgres://` URL.
//!
//! ```sh
//! cargo run -p payments-server
//! curl -s localhost:8080/v1/charges -u sk_test_123: -H 'Idempotency-Key: 5d4f...' \
//!      -d amount=4242 -d currency=usd -d description='Tea for two'
//! ```
//!
//! It bounds what slow or hostile clients can hold: a deadline for each request's head
//! (`--header-timeout-ms`, default 10 s; also how long an idle connection stays open) and body
//! (`--body-timeout-ms`, default 30 s, then 408), a cap on open connections
//! (`--max-connections`, default 1024) and on the body bytes held at once
//! (`--max-buffered-body-bytes`, default 16 MiB, then 503); `--help` lists every setting and
//! its environment variable. Every request runs to its end on a task of its own and logs one
//! `request` line, also when its client hung up (`client="gone"`).
//!
//! Each charge is authorised first at a simulated card network inside the server
//! (`network`), under the request's downstream key (the same on every retry of one request):
//! the network charges a key once. When the network does not answer in time, the charge may
//! have gone through: the client gets a 502 (`card_network_timeout`) that is stored marked in
//! doubt and replayed to every retry with the key, never a second charge. A reconciler
//! (`reconcile`) asks the network about each record in doubt every `--reconcile-every` seconds
//! (default 30; 0 turns it off): the charge was authorised (the row is recorded and every
//! retry gets the real charge), or it was not (the key is released and the next retry
//! charges). The network is the process's own, so run one instance per database (`network`).
//!
//! With `--webhook-url URL --webhook-secret whsec_...` (or `IDEM_WEBHOOK_URL`,
//! `IDEM_WEBHOOK_SECRET`) each succeeded charge emits a `charge.succeeded` event (the charge
//! under `data.object`) through the outbox: enqueued in the charge's own transaction,
//! delivered at least once, signed (Standard Webhooks), with one `webhook-id` on every
//! attempt; examples/webhook-receiver verifies and processes it once at
//! `/webhooks/standard` (docs/outbox.md). For tests only, with `IDEM_TEST_HOOKS=1`,
//! `--test-webhook-schedule-ms 200,200,...` (`IDEM_TEST_WEBHOOK_SCHEDULE_MS`) replaces the
//! outbox's retry schedule (5 s, 5 min, 30 min, ...) by short unjittered delays.

mod account;
mod app;
mod charge;
mod db;
mod errors;
mod network;
mod reconcile;
mod request_log;
mod settings;
mod webhooks;

use db::{Backend, Postgres, Sqlite};
use idem::Policy;
use network::Network;
use reconcile::Reconciler;
use serving::Tasks;
use settings::{Database, Settings};
use std::io::{IsTerminal, Write};
use std::process::ExitCode;
use std::sync::Arc;
use std::time::Duration;

#[tokio::main]
async fn main() -> ExitCode {
    tracing_subscriber::fmt()
        .with_writer(std::io::stderr)
        .with_ansi(std::io::stderr().is_terminal())
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env()
                .unwrap_or_else(|_| "info,idem=warn,idem_tower=warn".into()),
        )
        .init();
    let settings = match Settings::from_args(std::env::args().skip(1)) {
        Ok(settings) => settings,
        Err(message) => {
            eprintln!("{message}");
            return ExitCode::from(2);
        }
    };
    match serve(settings).await {
        Ok(()) => ExitCode::SUCCESS,
        Err(error) => {
            tracing::error!(%error, "payments-server stopped");
            ExitCode::FAILURE
        }
    }
}

type BoxError = Box<dyn std::error::Error + Send + Sync>;

async fn serve(settings: Settings) -> Result<(), BoxError> {
    if settings.test_hooks {
        tracing::warn!("IDEM_TEST_HOOKS=1: TEST HOOKS ARE ON (X-Test-Delay-Ms, X-Test-Network, GET /test/charges/count, GET /test/network/authorizations/count, POST /test/reconcile). Never in production.");
    }
    let policy = Policy::default().lease(settings.lease);
    let limits = &settings.limits;
    tracing::info!(
        database = settings.database.describe(),
        lease_ms = settings.lease.as_millis() as u64,
        reconcile_every_s = settings.reconcile_every.map_or(0, |every| every.as_secs()),
        webhook_url = settings.webhook.as_ref().map_or("", |w| w.url.as_str()),
        header_timeout_ms = limits.header_timeout.as_millis() as u64,
        body_timeout_ms = limits.body_timeout.as_millis() as u64,
        max_connections = limits.max_connections,
        max_buffered_body_bytes = limits.max_buffered_body_bytes,
        "opening"
    );
    match &settings.database {
        Database::Sqlite(path) => {
            let backend = Sqlite::open(path, policy, settings.webhook.as_ref()).await?;
            run(backend, &settings).await
        }
        Database::Postgres(url) => {
            let backend = Postgres::connect(url, policy, settings.webhook.as_ref()).await?;
            run(backend, &settings).await
        }
    }
}

async fn run<B: Backend>(backend: B, settings: &Settings) -> Result<(), BoxError> {
    let idem = backend.idem().clone();
    let backend = Arc::new(backend);
    let network = Arc::new(Network::new());
    let listener = tokio::net::TcpListener::bind(settings.addr).await?;
    let addr = listener.local_addr()?;
    let purger = idem::ops::purge_every(&idem, Duration::from_secs(60));
    // The records in doubt are settled from the network's answers, now and every period.
    let reconciling = settings.reconcile_every.map(|every| {
        idem::ops::reconcile_every(
            &idem,
            every,
            Reconciler::new(backend.clone(), network.clone()),
        )
    });
    // The one line on stdout: where to reach the server (scripts and tests read it).
    println!("listening on http://{addr}");
    std::io::stdout().flush()?;
    tracing::info!(%addr, "listening");
    let gate = idem.clone();
    let (tasks, drained) = Tasks::new();
    let app = app::router(
        backend,
        network,
        settings.test_hooks,
        &settings.limits,
        tasks,
    );
    serving::serve(listener, app, &settings.limits, async move {
        serving::shutdown_signal().await;
        // Requests still arriving on open connections start nothing: 503, Retry-After.
        gate.close();
    })
    .await;
    // Requests whose clients went away finish, store their responses and log their lines
    // before we exit.
    drained.wait().await;
    if let Some(reconciling) = reconciling {
        reconciling.stop().await;
    }
    idem.shutdown().await;
    purger.stop().await;
    tracing::info!("stopped");
    Ok(())
}
