//! The routes of the senders that name their event in a header: `POST /webhooks/standard`
//! (Standard Webhooks, Svix), `POST /webhooks/github`, `POST /webhooks/shopify`. Each verifies
//! with its own [`WebhookScheme`], keys the inbox on the id the scheme derived from what the
//! signature covers (`webhook-id`, signed; for GitHub and Shopify, which sign the body only,
//! `<X-GitHub-Event> <blake3 hex of the body>` and `<X-Shopify-Topic> <blake3 hex of the
//! body>`, so that a captured delivery replayed under fresh id headers is a duplicate), and
//! processes the event once: one row in `received_events` and the acknowledgement in one
//! transaction. The sender's unsigned delivery id (`X-GitHub-Delivery`, `X-Shopify-Event-Id`)
//! is logged, never keyed on.

use crate::app::{bad_signature, outcome, problem, App};
use crate::charges::PaidCharge;
use crate::events::{self, Received};
use crate::shop::BoxError;
use axum::body::Bytes;
use axum::extract::State;
use axum::http::HeaderMap;
use axum::response::{IntoResponse, Response};
use idem::inbox::{now_unix, Ack, Delivery, EventContext, Receipt, WebhookScheme};
use idem::sqlite::SqliteStore;
use idem::tower::Http;
use serving::test_delay;
use std::sync::Arc;
use std::time::{Duration, Instant};

/// The Standard Webhooks scheme's inbox source.
const STANDARD_WEBHOOKS: &str = "standard-webhooks";

/// `POST /webhooks/standard`.
pub(crate) async fn standard_webhook(
    State(app): State<Arc<App>>,
    headers: HeaderMap,
    body: Bytes,
) -> Response {
    let Some(scheme) = app.standard.clone() else {
        return problem(404, "not-found", "No such route.");
    };
    receive(&app, &scheme, "webhook-signature", headers, body).await
}

/// `POST /webhooks/github`.
pub(crate) async fn github_webhook(
    State(app): State<Arc<App>>,
    headers: HeaderMap,
    body: Bytes,
) -> Response {
    let Some(scheme) = app.github.clone() else {
        return problem(404, "not-found", "No such route.");
    };
    receive(&app, &scheme, "X-Hub-Signature-256", headers, body).await
}

/// `POST /webhooks/shopify`.
pub(crate) async fn shopify_webhook(
    State(app): State<Arc<App>>,
    headers: HeaderMap,
    body: Bytes,
) -> Response {
    let Some(scheme) = app.shopify.clone() else {
        return problem(404, "not-found", "No such route.");
    };
    receive(&app, &scheme, "X-Shopify-Hmac-Sha256", headers, body).await
}

/// Verify, key, process once, answer what the receipt says.
async fn receive(
    app: &App,
    scheme: &dyn WebhookScheme,
    signature_header: &str,
    headers: HeaderMap,
    body: Bytes,
) -> Response {
    let started = Instant::now();
    let source = scheme.name();

    // 1. Origin first, over the raw bytes: nothing is recorded before this passes.
    let (delivery, verified) =
        match Delivery::verify_with(scheme, source, &headers, &body, now_unix()) {
            Ok(verified) => verified,
            Err(error) => return bad_signature(error, source, signature_header, started),
        };
    // These schemes always give a key (the scheme refuses a delivery it cannot key), so
    // there is always one here.
    let Some(id) = verified.event_id().map(str::to_owned) else {
        return problem(400, "event-invalid", "The delivery names no event.");
    };
    // The body is verified: a Standard Webhooks `charge.succeeded` marks its charge paid.
    let paid = (source == STANDARD_WEBHOOKS)
        .then(|| PaidCharge::from_body(&body))
        .flatten();
    let received = Received {
        source,
        event_id: id,
        event_type: verified.event_type().map(str::to_owned),
        paid,
    };
    let delivery_id = verified.delivery_id().unwrap_or("-").to_owned();
    let log = |outcome: &str, status: u16| {
        log_delivery(&received, &delivery_id, outcome, status, started);
    };

    // 2. The fingerprint is the payload's meaning (canonical JSON; raw bytes if not JSON):
    //    a redelivery of the event is a duplicate, another payload under its id a conflict.
    let recorded = match app
        .inbox
        .event_json(&delivery, received.event_id.as_bytes(), &[])
    {
        Ok(recorded) => recorded,
        Err(error) => {
            log("rejected", idem::tower::render::status_for(&error));
            return Http(error).into_response();
        }
    };

    // 3. Once: the first delivery runs `handle`; the others are answered without running.
    let delay = app.test_hooks.then(|| test_delay(&headers)).flatten();
    let handler = {
        let received = received.clone();
        move |ctx| handle(ctx, received, delay)
    };
    match app.inbox.receive(&recorded, handler).await {
        Ok(receipt) => {
            let http = receipt.to_http();
            if let Receipt::Failed(reason) = &receipt {
                tracing::warn!(source, event = received.event_id, %reason, "the handler failed and rolled back; the sender will deliver again");
            }
            log(outcome(&receipt), http.status);
            Http(http).into_response()
        }
        Err(error) => {
            // The store is down: never process unprotected. 503, the sender delivers again.
            tracing::error!(source, event = received.event_id, %error, "the inbox's store failed");
            let http = idem::tower::render::error(&error);
            log("unavailable", http.status);
            Http(http).into_response()
        }
    }
}

/// The handler the inbox runs once per event: the event's row and the acknowledgement in one
/// transaction.
async fn handle(
    ctx: EventContext<SqliteStore>,
    received: Received,
    delay: Option<Duration>,
) -> Result<Ack, BoxError> {
    if let Some(delay) = delay {
        tokio::time::sleep(delay).await;
    }
    let completion = ctx.completion();
    events::record(ctx.idem().store(), completion.clone(), received).await?;
    Ok(Ack::Written(completion))
}

/// One line per delivery: source, event id (the inbox's key) and type, the sender's delivery
/// id, outcome, status, latency. Never the payload, a secret or another header.
fn log_delivery(event: &Received, delivery_id: &str, outcome: &str, status: u16, started: Instant) {
    tracing::info!(
        source = event.source,
        event = event.event_id,
        delivery = delivery_id,
        r#type = event.event_type.as_deref().unwrap_or("-"),
        outcome,
        status,
        latency_ms = format!("{:.1}", started.elapsed().as_secs_f64() * 1000.0),
        "delivery"
    );
}
