//! The HTTP API: routes, the idempotency layer in front of them, bodies read within their
//! deadline and budget, one log line per request. A charge is authorised at the card network
//! first, then recorded in one transaction with its idempotency completion.

use crate::account::{account, Account};
use crate::charge::{Charge, NewCharge};
use crate::db::{is_unavailable, Backend, DbError};
use crate::errors::{render_problem, render_refusal, ApiError};
use crate::network::{CallError, Fault, Network};
use crate::reconcile::{report_json, Reconciler};
use crate::request_log::log_request;
use axum::body::Bytes;
use axum::extract::{Path, Query, State};
use axum::http::HeaderMap;
use axum::middleware;
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Json, Router};
use idem::tower::{Completed, IdempotencyLayer, Reservation};
use idem::RunError;
use serde::Deserialize;
use serving::{buffer_body, test_delay, BodyGate, Limits, Tasks};
use std::sync::Arc;

/// What the handlers share.
pub(crate) struct App<B> {
    pub backend: Arc<B>,
    pub network: Arc<Network>,
    pub test_hooks: bool,
}

/// The API over `backend` and `network`: `POST /v1/charges` behind the idempotency layer, the
/// reads beside it, and with `test_hooks` the test endpoints. Every request runs on a task of
/// `tasks`, its body read first within `limits`.
pub(crate) fn router<B: Backend>(
    backend: Arc<B>,
    network: Arc<Network>,
    test_hooks: bool,
    limits: &Limits,
    tasks: Tasks,
) -> Router {
    let gate = BodyGate::new(
        backend.idem().policy().max_body_bytes,
        limits.body_timeout,
        limits.max_buffered_body_bytes,
        render_refusal,
    );
    let layer =
        IdempotencyLayer::new(backend.idem().clone(), account).render_problems(render_problem);
    let app = Arc::new(App {
        backend,
        network,
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
    router = router
        .method_not_allowed_fallback(|| async { ApiError::method_not_allowed().into_response() })
        .route_layer(layer);
    if test_hooks {
        // Outside the idempotency layer: test hooks, not charges.
        router = router
            .route(
                "/test/network/authorizations/count",
                get(count_authorizations::<B>),
            )
            .route("/test/reconcile", post(reconcile_now::<B>));
    }
    router
        .fallback(|| async { ApiError::missing("route", "unknown").into_response() })
        .with_state(app)
        .layer(middleware::from_fn_with_state(gate, buffer_body))
        .layer(middleware::from_fn_with_state(tasks, log_request))
}

/// The answer to a failed read: 503 with `Retry-After` when the database is unavailable, else
/// 500.
fn read_failed(error: &DbError, what: &str) -> Response {
    if is_unavailable(error) {
        tracing::warn!(%error, "{what}: the database is unavailable");
        ApiError::unavailable().into_response()
    } else {
        tracing::error!(%error, "{what} failed");
        ApiError::internal().into_response()
    }
}

/// `POST /v1/charges`: the authorization at the card network under the request's downstream
/// key, then the charge row and the idempotency completion in one transaction. A request that
/// fails validation or whose transaction rolls back releases its key (nothing happened), as
/// Stripe does: the network's authorization stays, and the retry gets the same one under the
/// same key. A network that does not answer leaves the charge in doubt: a 502 stored marked
/// in doubt and replayed until the reconciler settles it. The layer stores and replays
/// everything else.
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
    let fault = app
        .test_hooks
        .then(|| Fault::from_headers(&headers))
        .flatten();
    // The card network's idempotency key: the same on every retry and takeover of this
    // request, scoped by account, route and key.
    let downstream_key = reservation.downstream_key();
    let authorization = match app.network.authorize(&downstream_key, &new, fault).await {
        Ok(authorization) => authorization,
        Err(CallError::NoAnswer) => {
            tracing::warn!(%downstream_key, "the card network did not answer; the charge is in doubt");
            return ApiError::network_no_answer().outcome_unknown(downstream_key);
        }
        Err(CallError::KeyReused) => return ApiError::network_key_reused().nothing_happened(),
    };
    let charge = Charge::authorized(&authorization);
    tracing::debug!(charge = %charge.id, authorization = %authorization.id, %downstream_key, "authorised");
    match app
        .backend
        .create(&reservation, &account, &charge, delay)
        .await
    {
        Ok(completion) => Completed(completion).into_response(),
        Err(RunError::Released(error)) if is_unavailable(&error) => {
            tracing::warn!(%error, "the database is unavailable; the charge rolled back");
            ApiError::unavailable().nothing_happened()
        }
        Err(RunError::Idem(error)) if error.is_retryable() => {
            tracing::warn!(%error, "the database is unavailable; the charge rolled back");
            ApiError::unavailable().nothing_happened()
        }
        Err(error @ (RunError::Released(_) | RunError::Idem(_))) => {
            tracing::error!(%error, "the charge transaction failed and rolled back");
            ApiError::internal().nothing_happened()
        }
        // It may have happened: the key keeps the answer in doubt (C8), never given back.
        Err(error) => {
            tracing::error!(%error, "the charge's transaction may have committed");
            ApiError::internal().into_response()
        }
    }
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
        Err(error) => read_failed(&error, "reading a charge"),
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
        Err(error) => read_failed(&error, "listing charges"),
    }
}

/// `GET /test/network/authorizations/count` (test hooks only): the card network's
/// authorizations.
async fn count_authorizations<B: Backend>(State(app): State<Arc<App<B>>>) -> Response {
    Json(serde_json::json!({ "count": app.network.count() })).into_response()
}

/// `POST /test/reconcile` (test hooks only): one reconciliation pass now; its report.
async fn reconcile_now<B: Backend>(State(app): State<Arc<App<B>>>) -> Response {
    let reconciler = Reconciler::new(app.backend.clone(), app.network.clone());
    match idem::ops::reconcile_now(app.backend.idem(), &reconciler).await {
        Ok(report) => Json(report_json(&report)).into_response(),
        Err(error) => read_failed(&(Box::new(error) as DbError), "reconciling"),
    }
}

/// `GET /test/charges/count` (test hooks only): committed charge rows.
async fn count_charges<B: Backend>(State(app): State<Arc<App<B>>>) -> Response {
    match app.backend.count().await {
        Ok(count) => Json(serde_json::json!({ "count": count })).into_response(),
        Err(error) => read_failed(&error, "counting charges"),
    }
}
