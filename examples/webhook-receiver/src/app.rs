//! The HTTP side: `POST /webhooks/stripe` (and the other senders' routes of `senders.rs`,
//! each mounted only when its secret is set), the operator's `GET /audit`, the test hooks,
//! bodies read within their deadline and budget, one log line per request and one per
//! delivery.

use crate::charges;
use crate::events;
use crate::request_log::log_request;
use crate::senders;
use crate::shop::{self, BoxError, Effect, PaidOrder};
use crate::stripe::{InvalidEvent, StripeEvent};
use axum::body::Bytes;
use axum::extract::{DefaultBodyLimit, Query, State};
use axum::http::HeaderMap;
use axum::middleware;
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Json, Router};
use idem::inbox::{
    now_unix, Ack, Audit, AuditEntry, Delivery, EventContext, GitHubScheme, Inbox, Receipt,
    ShopifyScheme, SignatureError, SignatureScheme, StandardWebhooks,
};
use idem::sqlite::SqliteStore;
use idem::store::Timestamp;
use idem::tower::{render::Problem, Http};
use serde::Deserialize;
use serde_json::{json, Value};
use serving::{buffer_body, test_delay, BodyGate, Limits, Refusal, Tasks};
use std::sync::{Arc, OnceLock};
use std::time::{Duration, Instant};

/// The inbox's source for Stripe's events.
pub(crate) const STRIPE: &str = "stripe";
/// Fields of Stripe's event object that change between deliveries of one event, left out of
/// its fingerprint.
const VOLATILE_FIELDS: &[&str] = &["pending_webhooks"];

/// The most audit entries `GET /audit` returns at once.
const MAX_AUDIT_LIMIT: usize = 1000;

/// What the handlers share.
pub(crate) struct App {
    /// The inbox over the SQLite store.
    pub inbox: Inbox<SqliteStore>,
    /// Stripe's signing secrets (`POST /webhooks/stripe` when set).
    pub scheme: Option<SignatureScheme>,
    /// The Standard Webhooks secrets (`POST /webhooks/standard` when set).
    pub standard: Option<StandardWebhooks>,
    /// GitHub's secrets (`POST /webhooks/github` when set).
    pub github: Option<GitHubScheme>,
    /// Shopify's secrets (`POST /webhooks/shopify` when set).
    pub shopify: Option<ShopifyScheme>,
    /// The audit trail the inbox writes (read by `GET /audit`).
    pub audit: Arc<dyn Audit>,
    /// `IDEM_TEST_HOOKS=1`.
    pub test_hooks: bool,
}

/// The routes. Every request runs on a task of `tasks`, its body read first within `limits`.
pub(crate) fn router(app: Arc<App>, limits: &Limits, tasks: Tasks) -> Router {
    let body_limit = app.inbox.idem().policy().max_body_bytes;
    let gate = BodyGate::new(
        body_limit,
        limits.body_timeout,
        limits.max_buffered_body_bytes,
        render_refusal,
    );
    // A sender whose secret is not set has no route: its path answers 404 like any other.
    let mut router = Router::new().route("/audit", get(audit));
    if app.scheme.is_some() {
        router = router.route("/webhooks/stripe", post(stripe_webhook));
    }
    if app.standard.is_some() {
        router = router.route("/webhooks/standard", post(senders::standard_webhook));
    }
    if app.github.is_some() {
        router = router.route("/webhooks/github", post(senders::github_webhook));
    }
    if app.shopify.is_some() {
        router = router.route("/webhooks/shopify", post(senders::shopify_webhook));
    }
    if app.test_hooks {
        router = router
            .route("/test/invoices/count", get(invoice_count))
            .route("/test/events/count", get(event_count))
            .route("/test/paid-charges", get(paid_charges))
            .route("/test/audit", get(test_audit));
    }
    router
        .method_not_allowed_fallback(|| async {
            problem(
                405,
                "method-not-allowed",
                "This method is not allowed on this path; the Allow header lists those that are.",
            )
        })
        .fallback(|| async { problem(404, "not-found", "No such route.") })
        .layer(DefaultBodyLimit::max(body_limit))
        .with_state(app)
        .layer(middleware::from_fn_with_state(gate, buffer_body))
        .layer(middleware::from_fn_with_state(tasks, log_request))
}

/// A body refused before routing, as a problem: 413 `body-too-large`, 408 `request-timeout`,
/// 503 `server-busy` (with `Retry-After`), 400 `body-incomplete`.
fn render_refusal(refusal: Refusal) -> Response {
    let (kind, detail, retryable) = match refusal {
        Refusal::TooLarge { limit } => (
            "body-too-large",
            format!("The body is over the limit of {limit} bytes."),
            false,
        ),
        Refusal::TimedOut { after } => (
            "request-timeout",
            format!("The body did not arrive within {} ms.", after.as_millis()),
            true,
        ),
        Refusal::Busy => (
            "server-busy",
            "The receiver is busy receiving other deliveries; deliver again later.".to_owned(),
            true,
        ),
        _ => (
            "body-incomplete",
            "The body could not be read to its end.".to_owned(),
            false,
        ),
    };
    let mut problem = Problem::new(refusal.status(), kind, &detail, retryable);
    if refusal == Refusal::Busy {
        problem = problem.with_retry_after(Duration::from_secs(1));
    }
    Http(problem).into_response()
}

/// `POST /webhooks/stripe`: verify, key, process once, answer what the receipt says.
async fn stripe_webhook(State(app): State<Arc<App>>, headers: HeaderMap, body: Bytes) -> Response {
    let started = Instant::now();

    // The route is mounted only with a scheme; without one, the path is unknown.
    let Some(scheme) = &app.scheme else {
        return problem(404, "not-found", "No such route.");
    };
    // 1. Origin first, over the raw bytes: nothing is parsed or recorded before this passes.
    //    Through the scheme's header reading, like the other senders' routes: a
    //    `Stripe-Signature` sent twice, too long or not visible ASCII is malformed.
    let delivery = match Delivery::verify_with(scheme, STRIPE, &headers, &body, now_unix()) {
        Ok((delivery, _)) => delivery,
        Err(error) => return bad_signature(error, STRIPE, "Stripe-Signature", started),
    };

    // 2. The event id is the body's `id`.
    let event = match StripeEvent::parse(&body) {
        Ok(event) => event,
        Err(invalid) => return invalid_event(invalid, started),
    };
    // The fingerprint is the payload's meaning: Stripe changes `pending_webhooks` from one
    // delivery of an event to the next, so it is left out (a redelivery is a duplicate; any
    // other change under the same id is a conflict, never processed).
    let recorded = match app
        .inbox
        .event_json(&delivery, event.id.as_bytes(), VOLATILE_FIELDS)
    {
        Ok(recorded) => recorded,
        Err(error) => {
            log_delivery(
                &event,
                "rejected",
                "-",
                idem::tower::render::status_for(&error),
                started,
            );
            return Http(error).into_response();
        }
    };

    // 3. Once: the first delivery runs `handle`; duplicates, deliveries while it runs and
    //    reused ids are answered without running anything.
    let hooks = TestHooks {
        crash_after_commit: app.test_hooks
            && headers
                .get("x-test-crash-after-commit")
                .is_some_and(|v| v.as_bytes() == b"1"),
        delay: app.test_hooks.then(|| test_delay(&headers)).flatten(),
    };
    let effect: Arc<OnceLock<Effect>> = Arc::default();
    let handler = {
        let (event, effect) = (event.clone(), Arc::clone(&effect));
        move |ctx| handle(ctx, event, effect, hooks)
    };
    match app.inbox.receive(&recorded, handler).await {
        Ok(receipt) => {
            let effect = effect.get().map_or("-", Effect::as_str);
            let http = receipt.to_http();
            if let Receipt::Failed(reason) = &receipt {
                tracing::warn!(source = STRIPE, event = event.id, %reason, "the handler failed and rolled back; Stripe will deliver again");
            }
            log_delivery(&event, outcome(&receipt), effect, http.status, started);
            Http(http).into_response()
        }
        Err(error) => {
            // The store is down: never process unprotected. 503, Stripe delivers again.
            tracing::error!(source = STRIPE, event = event.id, %error, "the inbox's store failed");
            let http = idem::tower::render::error(&error);
            log_delivery(&event, "unavailable", "-", http.status, started);
            Http(http).into_response()
        }
    }
}

/// What the test hooks ask of a delivery (`IDEM_TEST_HOOKS=1` only).
#[derive(Debug, Clone, Copy)]
struct TestHooks {
    /// `X-Test-Crash-After-Commit: 1`: abort right after the invoice's commit.
    crash_after_commit: bool,
    /// `X-Test-Delay-Ms`: sleep this long before processing.
    delay: Option<Duration>,
}

/// The handler the inbox runs once per event.
async fn handle(
    ctx: EventContext<SqliteStore>,
    event: StripeEvent,
    effect: Arc<OnceLock<Effect>>,
    hooks: TestHooks,
) -> Result<Ack, BoxError> {
    if let Some(delay) = hooks.delay {
        tokio::time::sleep(delay).await;
    }
    // Other event types: acknowledged and recorded (the audit trail), no effect.
    let Some(payment) = event.payment else {
        let _ = effect.set(Effect::Ignored);
        return Ok(Ack::Done);
    };
    let Some(order_id) = payment.order_id else {
        let _ = effect.set(Effect::NoOrderId);
        return Ok(Ack::Done);
    };
    // The invoice, the stock and the acknowledgement in one SQLite transaction.
    let completion = ctx.completion();
    let store = ctx.idem().store().clone();
    let paid = PaidOrder {
        event_id: event.id,
        payment_intent: payment.intent,
        order_id,
        amount: payment.amount,
        currency: payment.currency,
    };
    let done = shop::invoice(&store, completion.clone(), paid).await?;
    if hooks.crash_after_commit && matches!(done, Effect::Invoiced { .. }) {
        // Test hook: die between the committed effect and the HTTP answer.
        eprintln!("X-Test-Crash-After-Commit: aborting after the invoice's commit");
        std::process::abort();
    }
    let _ = effect.set(done);
    Ok(Ack::Written(completion))
}

pub(crate) fn outcome(receipt: &Receipt) -> &'static str {
    match receipt {
        Receipt::Processed(_) => "processed",
        Receipt::Duplicate(_) => "duplicate",
        Receipt::InProgress { .. } => "in_progress",
        Receipt::Conflict => "conflict",
        Receipt::Failed(_) => "failed",
        _ => "other",
    }
}

/// One line per delivery: source, event id and type, outcome, effect, status, latency. Never
/// the payload, a header or a secret.
fn log_delivery(event: &StripeEvent, outcome: &str, effect: &str, status: u16, started: Instant) {
    tracing::info!(
        source = STRIPE,
        event = event.id,
        r#type = event.kind,
        outcome,
        effect,
        status,
        latency_ms = format!("{:.1}", started.elapsed().as_secs_f64() * 1000.0),
        "delivery"
    );
}

/// 400 for a delivery of `source` whose origin is not proven (its signature in
/// `signature_header`); nothing was recorded.
pub(crate) fn bad_signature(
    error: SignatureError,
    source: &str,
    signature_header: &str,
    started: Instant,
) -> Response {
    let (kind, detail) = match &error {
        SignatureError::Missing => (
            "signature-missing",
            format!("The request has no {signature_header} header."),
        ),
        SignatureError::MissingHeader(name) => (
            "header-missing",
            format!("The request has no {name} header, which this sender always sends."),
        ),
        SignatureError::Malformed(why) => (
            "signature-malformed",
            format!("A signed header ({signature_header} or the headers it covers) is malformed: {why}."),
        ),
        SignatureError::Mismatch => (
            "signature-mismatch",
            format!("No signature in {signature_header} matches the body under the endpoint's signing secrets."),
        ),
        SignatureError::Stale { age_secs } => (
            "signature-stale",
            format!("The signature's timestamp is {age_secs} s old, over the tolerance."),
        ),
        SignatureError::Future { ahead_secs } => (
            "signature-future",
            format!(
                "The signature's timestamp is {ahead_secs} s in the future, over the tolerance."
            ),
        ),
        SignatureError::MixedHeaderSets(one, other) => (
            "headers-mixed",
            format!("The request carries both {one}* and {other}* headers; send one set only."),
        ),
        _ => ("signature-invalid", error.to_string()),
    };
    tracing::warn!(
        source,
        event = "-",
        outcome = "bad_signature",
        reason = kind,
        status = 400,
        latency_ms = format!("{:.1}", started.elapsed().as_secs_f64() * 1000.0),
        "delivery"
    );
    problem(400, kind, &detail)
}

/// 400 for a verified body that is not an event with an id; nothing was recorded.
fn invalid_event(invalid: InvalidEvent, started: Instant) -> Response {
    tracing::warn!(
        source = STRIPE,
        event = "-",
        outcome = "invalid_event",
        reason = invalid.detail(),
        status = 400,
        latency_ms = format!("{:.1}", started.elapsed().as_secs_f64() * 1000.0),
        "delivery"
    );
    problem(400, "event-invalid", invalid.detail())
}

pub(crate) fn problem(status: u16, kind: &'static str, detail: &str) -> Response {
    Http(Problem::new(status, kind, detail, false)).into_response()
}

/// `GET /audit` and `GET /test/audit` parameters.
#[derive(Debug, Deserialize)]
struct AuditParams {
    source: Option<String>,
    from: Option<String>,
    to: Option<String>,
    limit: Option<String>,
}

/// `GET /audit?source=stripe&from=<unix ms>&to=<unix ms>&limit=N`: the events of a source
/// first received in `[from, to)` (default: all), oldest first, at most `limit` (default 100,
/// at most 1000). An operator endpoint: keep it on an internal network or behind your admin
/// authentication.
async fn audit(State(app): State<Arc<App>>, Query(params): Query<AuditParams>) -> Response {
    audit_page(&app, params, 100, MAX_AUDIT_LIMIT).await
}

/// `GET /test/audit?source=stripe` (test hooks only): like `/audit`, every entry unless
/// `limit` says otherwise (no default, no cap), once the writes of the deliveries answered so
/// far have landed (`Inbox::drain_audit`).
async fn test_audit(State(app): State<Arc<App>>, Query(params): Query<AuditParams>) -> Response {
    app.inbox.drain_audit().await;
    audit_page(&app, params, u64::MAX, usize::MAX).await
}

async fn audit_page(
    app: &App,
    params: AuditParams,
    default_limit: u64,
    max_limit: usize,
) -> Response {
    let number = |name: &'static str, value: Option<&str>, default: u64| match value {
        None => Ok(default),
        Some(text) => text.trim().parse::<u64>().map_err(|_| name),
    };
    let parsed = number("from", params.from.as_deref(), 0).and_then(|from| {
        let to = number("to", params.to.as_deref(), u64::MAX)?;
        let limit = number("limit", params.limit.as_deref(), default_limit)?;
        Ok((from, to, limit))
    });
    let (from, to, limit) = match parsed {
        Ok(parsed) => parsed,
        Err(name) => {
            return problem(
                400,
                "invalid-parameter",
                &format!("`{name}` must be a non-negative integer."),
            )
        }
    };
    let limit = usize::try_from(limit).unwrap_or(usize::MAX);
    if limit == 0 || limit > max_limit {
        return problem(
            400,
            "invalid-parameter",
            &format!("`limit` must be between 1 and {max_limit}."),
        );
    }
    let source = params.source.unwrap_or_else(|| STRIPE.to_owned());
    match app
        .audit
        .query(
            &source,
            Timestamp::from_millis(from),
            Timestamp::from_millis(to),
            limit,
        )
        .await
    {
        Ok(entries) => Json(json!({
            "source": source,
            "count": entries.len(),
            "entries": entries.iter().map(entry_json).collect::<Vec<_>>(),
        }))
        .into_response(),
        Err(error) => {
            tracing::error!(%error, "reading the audit trail failed");
            Http(error).into_response()
        }
    }
}

fn entry_json(entry: &AuditEntry) -> Value {
    json!({
        "event_id": String::from_utf8_lossy(&entry.event_id),
        "deliveries": entry.deliveries,
        "conflicts": entry.conflicts,
        "outcome": entry.outcome.as_str(),
        "first_received": entry.first_received.as_millis(),
        "last_received": entry.last_received.as_millis(),
        "processed": entry.processed.map(Timestamp::as_millis),
    })
}

/// `GET /test/events/count?source=github` parameters.
#[derive(Debug, Deserialize)]
struct CountParams {
    source: Option<String>,
}

/// `GET /test/events/count?source=github` (test hooks only): `{"count": rows, "distinct":
/// event ids}` of `received_events` for the source: one row per execution of an event.
async fn event_count(State(app): State<Arc<App>>, Query(params): Query<CountParams>) -> Response {
    let source = params.source.unwrap_or_default();
    match events::counts(app.inbox.idem().store(), source).await {
        Ok((count, distinct)) => {
            Json(json!({ "count": count, "distinct": distinct })).into_response()
        }
        Err(error) => {
            tracing::error!(%error, "counting events failed");
            problem(500, "internal", "Counting events failed.")
        }
    }
}

/// `GET /test/paid-charges` (test hooks only): `{"count": charges, "charges": [{"charge_id",
/// "event_id", "event_type", "processed"}]}`, by charge id: the charges a Standard Webhooks
/// `charge.succeeded` marked paid, and how many times each was processed.
async fn paid_charges(State(app): State<Arc<App>>) -> Response {
    match charges::list(app.inbox.idem().store()).await {
        Ok(rows) => Json(json!({
            "count": rows.len(),
            "charges": rows
                .iter()
                .map(|(charge_id, event_id, event_type, processed)| json!({
                    "charge_id": charge_id,
                    "event_id": event_id,
                    "event_type": event_type,
                    "processed": processed,
                }))
                .collect::<Vec<_>>(),
        }))
        .into_response(),
        Err(error) => {
            tracing::error!(%error, "listing paid charges failed");
            problem(500, "internal", "Listing paid charges failed.")
        }
    }
}

/// `GET /test/invoices/count` (test hooks only): `{"count": invoices, "units_sold": units}`.
async fn invoice_count(State(app): State<Arc<App>>) -> Response {
    match shop::invoice_counts(app.inbox.idem().store()).await {
        Ok((count, units_sold)) => {
            Json(json!({ "count": count, "units_sold": units_sold })).into_response()
        }
        Err(error) => {
            tracing::error!(%error, "counting invoices failed");
            problem(500, "internal", "Counting invoices failed.")
        }
    }
}
