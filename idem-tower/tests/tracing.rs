//! Tracing that joins logs: the layer opens a span per request inside the caller's (its trace
//! id), the engine's decisions are events inside it even on the engine's own task, and the
//! outcome is recorded on it.
#![cfg(feature = "axum")]

mod support;

use axum::body::Body;
use axum::http::{Request, StatusCode};
use axum::routing::post;
use axum::Router;
use idem_core::{Idempotency, MemoryStore};
use idem_tower::IdempotencyLayer;
use std::io::Write;
use std::sync::{Arc, Mutex};
use support::fixed_account;
use tower::ServiceExt;
use tracing::Instrument;

/// Everything the subscriber writes, as text.
#[derive(Clone, Default)]
struct Captured(Arc<Mutex<Vec<u8>>>);

impl Write for Captured {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.0
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .extend_from_slice(buf);
        Ok(buf.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

impl Captured {
    fn text(&self) -> String {
        String::from_utf8_lossy(
            &self
                .0
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner),
        )
        .into_owned()
    }
}

#[test]
fn the_decisions_carry_the_callers_trace_and_the_span_records_the_outcome() {
    let captured = Captured::default();
    let writer = captured.clone();
    let subscriber = tracing_subscriber::fmt()
        .with_max_level(tracing::Level::DEBUG)
        .with_ansi(false)
        .with_writer(move || writer.clone())
        .finish();
    let _guard = tracing::subscriber::set_default(subscriber);
    // One thread: the engine's own task runs here too, under this subscriber.
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("a runtime");
    rt.block_on(async {
        let app = Router::new()
            .route(
                "/v1/charges",
                post(|| async { (StatusCode::CREATED, "charged") }),
            )
            .route_layer(IdempotencyLayer::new(
                Idempotency::new(MemoryStore::new()),
                fixed_account,
            ));
        let request = Request::post("/v1/charges")
            .header("idempotency-key", "k-1")
            .body(Body::from("{}"))
            .expect("a request");
        let caller = tracing::info_span!("request", trace_id = "4bf92f3577b34da6a3ce929d0e0e4736");
        let response = app
            .oneshot(request)
            .instrument(caller)
            .await
            .expect("infallible");
        assert_eq!(response.status(), StatusCode::CREATED);
    });
    let text = captured.text();
    let begin = text
        .lines()
        .find(|line| line.contains("idem.acquired"))
        .unwrap_or_else(|| panic!("the engine's decision is logged:\n{text}"));
    assert!(
        begin.contains("trace_id=\"4bf92f3577b34da6a3ce929d0e0e4736\""),
        "{begin}"
    );
    assert!(begin.contains("idem.http{"), "{begin}");
    let last = text
        .lines()
        .rev()
        .find(|line| line.contains("idem.http{") && line.contains("outcome="))
        .unwrap_or_else(|| panic!("the outcome is recorded on the span:\n{text}"));
    assert!(last.contains("outcome=\"executed\""), "{last}");
    assert!(last.contains("consumer=\"acct_1\""), "{last}");
    assert!(last.contains("route=\"/v1/charges\""), "{last}");
    assert!(!text.contains("k-1"), "the key is never logged:\n{text}");
}
