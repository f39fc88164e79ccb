//! A receiver for Stripe's webhook events, processed **once** with idem's inbox
//! (`idem::inbox`, docs/inbox.md) on SQLite: a `payment_intent.succeeded` for one of the shop's
//! orders issues exactly one invoice and takes the order's items from stock, however often and
//! in whatever order Stripe delivers it. The events of Standard Webhooks (Svix), GitHub and
//! Shopify are received the same way on routes of their own, each recorded once in
//! `received_events` (docs/inbox.md, "The example receiver's routes"); a Standard Webhooks
//! `charge.succeeded` (the payments server's, through its outbox) also marks its charge
//! (`data.object.id`) paid in `paid_charges`, in the same transaction.
//!
//! # Run it
//!
//! ```sh
//! WEBHOOK_SECRET=whsec_... cargo run -p webhook-receiver
//! # listening on http://127.0.0.1:8081
//! ```
//!
//! | setting | flag | environment | default |
//! |---|---|---|---|
//! | Stripe's signing secret(s): `POST /webhooks/stripe` | (none: a flag would show it in `ps`) | `WEBHOOK_SECRET` | unset: no route (404) |
//! | Standard Webhooks secret(s), `whsec_<base64>`: `POST /webhooks/standard` | (none) | `STANDARD_WEBHOOK_SECRET` | unset: no route (404) |
//! | GitHub's webhook secret(s): `POST /webhooks/github` | (none) | `GITHUB_WEBHOOK_SECRET` | unset: no route (404) |
//! | Shopify's app client secret(s): `POST /webhooks/shopify` | (none) | `SHOPIFY_WEBHOOK_SECRET` | unset: no route (404) |
//! | where to listen | `--addr` | `IDEM_ADDR` | `127.0.0.1:8081` |
//! | the SQLite file | `--database` | `DATABASE_URL` | `webhooks.db` |
//! | how long the audit trail is kept | `--audit-retention-days` | `IDEM_AUDIT_RETENTION_DAYS` | 30 |
//! | the inbox's lease | `--lease-ms` | `IDEM_LEASE_MS` | 30000 |
//! | how long a sender may take to send a request's head (and an idle connection stays open) | `--header-timeout-ms` | `IDEM_HEADER_TIMEOUT_MS` | 10000 |
//! | how long a sender may take to send a body (then 408) | `--body-timeout-ms` | `IDEM_BODY_TIMEOUT_MS` | 30000 |
//! | connections open at once (more wait to be accepted) | `--max-connections` | `IDEM_MAX_CONNECTIONS` | 1024 |
//! | request-body bytes held at once, all requests together (beyond: 503) | `--max-buffered-body-bytes` | `IDEM_MAX_BUFFERED_BODY_BYTES` | 16777216 |
//!
//! At least one secret must be set: without any, the receiver refuses to start. A sender whose
//! secret is not set has no route, so nothing of it is ever processed unverified.
//!
//! It prints one line on stdout, `listening on http://ADDR` (scripts and tests read it), and
//! logs on stderr (`RUST_LOG`, default `info,idem=warn`). Ctrl-C or SIGTERM stops accepting
//! deliveries, lets the running ones commit and answer (`idem.drain()`), then exits.
//!
//! **Secret rotation.** When you roll the endpoint's secret in Stripe's Dashboard, Stripe signs
//! with both the old and the new secret for a while (several `v1=` entries); set both,
//! `WEBHOOK_SECRET=whsec_new,whsec_old`, restart, and drop the old one once it has expired.
//!
//! **The shop.** The file holds, beside the inbox's records and its audit trail, the tables
//! `products(sku, name, unit_amount, seeded_stock, stock)`, `orders(id, sku, quantity,
//! amount, currency)` and `invoices(id, order_id UNIQUE, event_id, payment_intent, amount,
//! currency, created)`, seeded at start (kept across restarts): four products with 10,000
//! units each, and orders `ord_1` to `ord_1000` (see `shop.rs`). A checkout sets the order id
//! in the payment intent's metadata, `metadata.order_id`.
//!
//! # Send it an event
//!
//! With the Stripe CLI, which prints the `whsec_...` secret of its session:
//!
//! ```sh
//! stripe listen --forward-to localhost:8081/webhooks/stripe   # prints: Ready! ... (whsec_...)
//! WEBHOOK_SECRET=whsec_... cargo run -p webhook-receiver       # in another terminal
//! stripe trigger payment_intent.succeeded --add payment_intent:metadata.order_id=ord_7
//! ```
//!
//! The receiver logs `outcome="processed" effect="invoiced"` for `ord_7`. A plain
//! `stripe trigger payment_intent.succeeded` has no `metadata.order_id`: acknowledged and
//! recorded, `effect="no_order_id"`; the other events the trigger causes
//! (`payment_intent.created`, `charge.succeeded`, ...) are acknowledged with `effect="ignored"`.
//!
//! With curl, signing as Stripe does (`t=<unix seconds>,v1=<hex HMAC-SHA256 of "<t>.<body>">`):
//!
//! ```sh
//! secret=whsec_test_123
//! body='{"id":"evt_test_1","object":"event","type":"payment_intent.succeeded","data":{"object":{"id":"pi_test_1","object":"payment_intent","amount":850,"amount_received":850,"currency":"eur","metadata":{"order_id":"ord_1"}}}}'
//! t=$(date +%s)
//! v1=$(printf '%s.%s' "$t" "$body" | openssl dgst -sha256 -hmac "$secret" -r | cut -d' ' -f1)
//! curl -si localhost:8081/webhooks/stripe -H "Stripe-Signature: t=$t,v1=$v1" \
//!      -H 'Content-Type: application/json' --data-raw "$body"
//! # HTTP/1.1 200 OK ... {"received":true}; again: 200 with Idempotent-Replayed: true
//! curl -s 'localhost:8081/audit?source=stripe&limit=10'
//! ```
//!
//! # What each answer means to Stripe
//!
//! | answer | when | what Stripe does |
//! |---|---|---|
//! | 200 `{"received":true}` | the event was processed now: for `payment_intent.succeeded` of a known order, the invoice, the stock and the acknowledgement committed in one transaction | stops delivering it |
//! | 200, the same body, `Idempotent-Replayed: true` | a duplicate: processed before (also after a crash between the commit and the answer) | stops delivering it |
//! | 200 | another event type, an unknown order, a payment intent without `metadata.order_id`: recorded, nothing to do | stops delivering it. An unknown order is *acknowledged*: a 4xx would make Stripe deliver it again for three days and then disable the endpoint, while no delivery can make the order exist; the audit trail and the log keep it for a person |
//! | 409, `Retry-After` | the first delivery of the event is still being processed | delivers again later |
//! | 422 problem `event-id-reused` | this event id arrived before with another payload (a sender bug or an attack): not processed, logged, counted in the audit (`conflicts`) | delivers again until it gives up; a person looks |
//! | 400 problem `signature-missing`, `-malformed`, `-mismatch`, `-stale`, `-future` | the origin is not proven (wrong secret, altered body, `t` more than 5 minutes away from now): nothing recorded | delivers again (re-signed) and shows the failure in the Dashboard |
//! | 400 problem `event-invalid` | authentic, but not JSON or without a string `id` | as above |
//! | 500 problem `event-failed` | the handler failed: its transaction rolled back, nothing recorded | delivers again later, and the next delivery runs it |
//! | 503 problem `store-unavailable` | the database is down: never process unprotected | delivers again later |
//!
//! # Endpoints
//!
//! - `POST /webhooks/stripe`: the deliveries (raw body, `Stripe-Signature`).
//! - `POST /webhooks/standard` (`webhook-id`, `webhook-timestamp`, `webhook-signature`, or
//!   Svix's `svix-*` names; both sets at once is 400 `headers-mixed`),
//!   `POST /webhooks/github` (`X-Hub-Signature-256`, `X-GitHub-Event`, `X-GitHub-Delivery`),
//!   `POST /webhooks/shopify` (`X-Shopify-Hmac-Sha256`, `X-Shopify-Topic`): each when its
//!   secret is set; the same answers as Stripe's route, and 400 `header-missing` when the id,
//!   event name, topic or timestamp header is absent. GitHub's and Shopify's events are keyed
//!   on the event name (topic) and the body's digest, not on their unsigned delivery ids
//!   (docs/inbox.md).
//! - `GET /audit?source=stripe&from=<unix ms>&to=<unix ms>&limit=N`: the audit trail, for
//!   operators (support, reconciliation): each event's id, deliveries, conflicts, outcome,
//!   first and last delivery and processing times; first received in `[from, to)`, oldest
//!   first, `limit` 1..=1000 (default 100). Serve it on an internal network only.
//! - With `IDEM_TEST_HOOKS=1` (never in production; logged loudly at start):
//!   `GET /test/invoices/count` (`{"count": N, "units_sold": U}`),
//!   `GET /test/events/count?source=github` (`{"count": rows, "distinct": ids}` of
//!   `received_events`), `GET /test/paid-charges` (the charges a Standard Webhooks
//!   `charge.succeeded` marked paid, each with how many times it was processed: the
//!   effect a second processing would show), `GET /test/audit?source=stripe`
//!   (the whole trail), the request header `X-Test-Crash-After-Commit: 1`, which aborts the
//!   process right after an invoice's transaction committed and before the answer, and
//!   `X-Test-Delay-Ms: N`, which makes the handler sleep before processing.
//!
//! # Retention
//!
//! - Processed events are remembered for [`EVENT_RETENTION`] (7 days), longer than Stripe's
//!   three days of automatic redeliveries; a manual resend older than that is still caught by
//!   the order's unique invoice.
//! - The audit trail is purged hourly of entries first received longer ago than
//!   `--audit-retention-days`; expired inbox records every ten minutes (`idem::ops::purge_every`).

mod app;
mod charges;
mod events;
mod request_log;
mod senders;
mod settings;
mod shop;
mod stripe;

use app::App;
use idem::inbox::Inbox;
use idem::sqlite::SqliteStore;
use idem::{Idempotency, Policy};
use serving::Tasks;
use settings::Settings;
use std::io::{IsTerminal, Write};
use std::process::ExitCode;
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::watch;
use tokio::task::JoinHandle;

/// How long a processed event is remembered, so that a redelivery is acknowledged as a
/// duplicate without running anything. It must outlast Stripe's redelivery window: Stripe
/// delivers an unacknowledged event again for up to **three days**; after the retention the
/// same event id is new again. A week leaves a margin for an outage and for manual resends.
pub const EVENT_RETENTION: Duration = Duration::from_secs(7 * 24 * 3600);

/// How often expired inbox records are purged.
const RECORD_PURGE_PERIOD: Duration = Duration::from_secs(600);

/// How often the audit trail is purged of entries older than its retention.
const AUDIT_PURGE_PERIOD: Duration = Duration::from_secs(3600);

/// Audit entries deleted per batch.
const AUDIT_PURGE_BATCH: usize = 1000;

#[tokio::main]
async fn main() -> ExitCode {
    tracing_subscriber::fmt()
        .with_writer(std::io::stderr)
        .with_ansi(std::io::stderr().is_terminal())
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env()
                .unwrap_or_else(|_| "info,idem=warn".into()),
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
            tracing::error!(%error, "webhook-receiver stopped");
            ExitCode::FAILURE
        }
    }
}

type BoxError = Box<dyn std::error::Error + Send + Sync>;

async fn serve(settings: Settings) -> Result<(), BoxError> {
    if settings.test_hooks {
        tracing::warn!(
            "IDEM_TEST_HOOKS=1: TEST HOOKS ARE ON (GET /test/invoices/count, GET /test/paid-charges, GET /test/audit, \
             X-Test-Delay-Ms, X-Test-Crash-After-Commit ABORTS THE PROCESS). Never in production."
        );
    }
    tracing::info!(
        database = settings.database,
        secrets = settings.secrets,
        stripe = settings.scheme.is_some(),
        standard_webhooks = settings.standard.is_some(),
        github = settings.github.is_some(),
        shopify = settings.shopify.is_some(),
        lease_ms = settings.lease.as_millis() as u64,
        event_retention_days = EVENT_RETENTION.as_secs() / 86_400,
        audit_retention_days = settings.audit_retention.as_secs() / 86_400,
        header_timeout_ms = settings.limits.header_timeout.as_millis() as u64,
        body_timeout_ms = settings.limits.body_timeout.as_millis() as u64,
        max_connections = settings.limits.max_connections,
        max_buffered_body_bytes = settings.limits.max_buffered_body_bytes,
        "opening"
    );
    let store = SqliteStore::open(&settings.database).await?;
    shop::open(&store).await?;
    events::open(&store).await?;
    charges::open(&store).await?;
    let audit = shop::open_audit(&store).await?;
    // The inbox's policy: a 30 s lease by default (a delivery whose process died blocks its
    // event for that long, then a redelivery runs it; the engine renews it while a handler
    // runs), and processed events remembered longer than Stripe redelivers.
    let policy = Policy::default()
        .lease(settings.lease)
        .retention(EVENT_RETENTION);
    let idem = Idempotency::with_policy(store, policy)?;
    let inbox = Inbox::new(idem.clone()).with_audit(Arc::clone(&audit));

    let record_purger = idem::ops::purge_every(&idem, RECORD_PURGE_PERIOD);
    let audit_purger = AuditPurger::start(inbox.clone(), settings.audit_retention);

    let listener = tokio::net::TcpListener::bind(settings.addr).await?;
    let addr = listener.local_addr()?;
    // The one line on stdout: where to reach the server (scripts and tests read it).
    println!("listening on http://{addr}");
    std::io::stdout().flush()?;
    tracing::info!(%addr, "listening");

    let app = Arc::new(App {
        inbox: inbox.clone(),
        scheme: settings.scheme,
        standard: settings.standard,
        github: settings.github,
        shopify: settings.shopify,
        audit,
        test_hooks: settings.test_hooks,
    });
    let gate = idem.clone();
    let (tasks, drained) = Tasks::new();
    let router = app::router(app, &settings.limits, tasks);
    serving::serve(listener, router, &settings.limits, async move {
        serving::shutdown_signal().await;
        // Deliveries still arriving on open connections start nothing: 503, Retry-After.
        gate.close();
    })
    .await;
    // Deliveries whose sender hung up finish, commit, record their acknowledgement and log
    // their lines.
    drained.wait().await;
    // And their audit writes that went on past the answers.
    inbox.drain_audit().await;
    idem.shutdown().await;
    record_purger.stop().await;
    audit_purger.stop().await;
    tracing::info!("stopped");
    Ok(())
}

/// Purges the audit trail of entries older than the retention, every hour, in batches.
struct AuditPurger {
    stop: watch::Sender<bool>,
    task: JoinHandle<()>,
}

impl AuditPurger {
    fn start(inbox: Inbox<SqliteStore>, retention: Duration) -> Self {
        let (stop, mut stopped) = watch::channel(false);
        let task = tokio::spawn(async move {
            loop {
                loop {
                    match inbox.purge_audit(retention, AUDIT_PURGE_BATCH).await {
                        Ok(n) if n >= AUDIT_PURGE_BATCH && !*stopped.borrow() => continue,
                        Ok(n) => {
                            if n > 0 {
                                tracing::info!(deleted = n, "purged the audit trail");
                            }
                            break;
                        }
                        Err(error) => {
                            tracing::warn!(%error, "purging the audit trail failed; next hour again");
                            break;
                        }
                    }
                }
                tokio::select! {
                    _ = tokio::time::sleep(AUDIT_PURGE_PERIOD) => {}
                    _ = stopped.changed() => return,
                }
            }
        });
        Self { stop, task }
    }

    async fn stop(self) {
        let _ = self.stop.send(true);
        let _ = self.task.await;
    }
}
