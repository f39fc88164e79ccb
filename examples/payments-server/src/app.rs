//! The HTTP API: routes, the idempotency layer in front of them, one log line per request.

use crate::account::{account, Account};
use crate::charge::{Charge, NewCharge};
use crate::db::Backend;
use crate::errors::{render_problem, ApiError};
use axum::body::Bytes;
use axum::extract::{Path, Query, Request, State};
use axum::http::HeaderMap;
use axum::middleware::{self, Next};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Json, Router};
use idem::tower::{Completed, Handled, IdempotencyLayer, Reservation};
use serde::Deserialize;
use std::sync::Arc;
use std::time::{Duration, Instant};

/// The longest delay the test hook accepts.
const MAX_TEST_DELAY: Duration = Duration::from_secs(120);

/// What the handlers share.
pub struct App<B> {
    pub backend: B,
    pub test_hooks: bool,
}

/// The API over `backend`: `POST /v1/charges` behind the idempotency layer, the reads beside
/// it, and with `test_hooks` the test endpoints.
pub fn router<B: Backend>(backend: B, test_hooks: bool) -> Router {
    let layer =
        IdempotencyLayer::new(backend.idem().clone(), account).render_problems(render_problem);
    let app = Arc::new(App {
        backend,
        test_hooks,
    });
    let mut router = Router::new()
        .route(
            "/v1/charges",
            post(create_charge::<B>).get(list_charges::<B>),
        )
        .route("/v1/charges/{id}", get(get_charge::<B>));
    if test_hooks {
        router = router.route("/test/charges/count", get(count_charges::<B>));
    }
    router
        .route_layer(layer)
        .fallback(|| async { ApiError::missing("route", "unknown").into_response() })
        .with_state(app)
        .layer(middleware::from_fn(log_request))
}

/// `POST /v1/charges`: the charge row and the idempotency completion in one transaction. A
/// request that fails validation or whose transaction rolls back releases its key (nothing
/// happened), as Stripe does; the layer stores and replays everything else.
async fn create_charge<B: Backend>(
    State(app): State<Arc<App<B>>>,
    Account(account): Account,
    reservation: Reservation<B::Store>,
    headers: HeaderMap,
    body: Bytes,
) -> Response {
    let new = match NewCharge::parse(&headers, &body) {
        Ok(new) => new,
        Err(error) => return error.nothing_happened(),
    };
    let delay = app.test_hooks.then(|| test_delay(&headers)).flatten();
    let charge = Charge::create(new);
    match app
        .backend
        .create(&reservation, &account, &charge, delay)
        .await
    {
        Ok(completion) => Completed(completion).into_response(),
        Err(error) if crate::db::is_unavailable(&error) => {
            tracing::warn!(%error, "the database is unavailable; the charge rolled back");
            ApiError::unavailable().nothing_happened()
        }
        Err(error) => {
            tracing::error!(%error, "the charge transaction failed and rolled back");
            ApiError::internal().nothing_happened()
        }
    }
}

/// `X-Test-Delay-Ms` (test hooks only).
fn test_delay(headers: &HeaderMap) -> Option<Duration> {
    let ms: u64 = headers
        .get("x-test-delay-ms")?
        .to_str()
        .ok()?
        .trim()
        .parse()
        .ok()?;
    Some(Duration::from_millis(ms).min(MAX_TEST_DELAY))
}

/// `GET /v1/charges/{id}`.
async fn get_charge<B: Backend>(
    State(app): State<Arc<App<B>>>,
    Account(account): Account,
    Path(id): Path<String>,
) -> Response {
    match app.backend.get(&account, &id).await {
        Ok(Some(charge)) => Json(charge).into_response(),
        Ok(None) => ApiError::missing("charge", &id).into_response(),
        Err(error) => {
            tracing::error!(%error, "reading a charge failed");
            ApiError::internal().into_response()
        }
    }
}

#[derive(Debug, Deserialize)]
struct ListParams {
    limit: Option<String>,
}

/// `GET /v1/charges?limit=N` (1..=100, default 10), newest first.
async fn list_charges<B: Backend>(
    State(app): State<Arc<App<B>>>,
    Account(account): Account,
    Query(params): Query<ListParams>,
) -> Response {
    let limit = match params.limit.as_deref().map(str::parse::<u32>) {
        None => 10,
        Some(Ok(n)) if (1..=100).contains(&n) => n,
        Some(_) => {
            return ApiError::invalid(
                "parameter_invalid_integer",
                Some("limit"),
                "limit must be an integer between 1 and 100.",
            )
            .into_response()
        }
    };
    match app.backend.list(&account, limit).await {
        Ok((charges, has_more)) => Json(serde_json::json!({
            "object": "list",
            "data": charges,
            "has_more": has_more,
            "url": "/v1/charges",
        }))
        .into_response(),
        Err(error) => {
            tracing::error!(%error, "listing charges failed");
            ApiError::internal().into_response()
        }
    }
}

/// `GET /test/charges/count` (test hooks only): committed charge rows.
async fn count_charges<B: Backend>(State(app): State<Arc<App<B>>>) -> Response {
    match app.backend.count().await {
        Ok(count) => Json(serde_json::json!({ "count": count })).into_response(),
        Err(error) => {
            tracing::error!(%error, "counting charges failed");
            ApiError::internal().into_response()
        }
    }
}

/// One line per request: method, path, status, what idempotency did, the key's consumer (an
/// account id, never the API key), the latency. Never the idempotency key, a body or a
/// credential.
async fn log_request(request: Request, next: Next) -> Response {
    let started = Instant::now();
    let (method, path) = (request.method().clone(), request.uri().path().to_owned());
    let response = next.run(request).await;
    let handled = response.extensions().get::<Handled>();
    tracing::info!(
        %method,
        path,
        status = response.status().as_u16(),
        outcome = handled.map_or("-", |h| h.disposition.name()),
        consumer = handled.and_then(|h| h.consumer.as_deref()).unwrap_or("-"),
        latency_ms = format!("{:.1}", started.elapsed().as_secs_f64() * 1000.0),
        "request"
    );
    response
}
