//! The calling side of idempotency: one key per logical operation, kept across its retries,
//! and retries the way Stripe's client libraries make them.
//!
//! Every team that calls an idempotent API writes the same loop by hand. Generic retry
//! middleware knows nothing of keys, and retrying a `POST` without one is how a card is charged
//! twice. This crate is that loop, once:
//!
//! - **A key per operation.** A fresh UUID v4 (or the caller's own [`IdempotencyKey`]) is
//!   made once per [`Operation`] and sent, unchanged, on every attempt of it, in the
//!   `Idempotency-Key` header (the name is configurable: [`Client::with_key_header`]). It is
//!   never sent with another operation. Every method but the safe ones gets one (POST, PATCH,
//!   PUT, DELETE, extension methods: [`is_safe_method`]); GET, HEAD, OPTIONS and TRACE are
//!   sent and retried without one unless the caller gives one. The header value is the key
//!   bare when it is made of token characters, else an RFC 8941 sf-string
//!   ([`IdempotencyKey::to_header`]), exactly as `idem` servers read it.
//! - **What is retried** ([`is_retryable_status`]): connection errors, attempts that time out
//!   (a per-attempt timeout), 409 (the same key is being processed: retried after its
//!   `Retry-After`), 429 (after `Retry-After` when present), 500, 502, 503 and 504. Never
//!   400, 401, 403, 404, 422 nor any other 4xx (the same request would get the same answer),
//!   nor 501, 505 and the other 5xx that describe the server's configuration, nor any answer
//!   marked `Idempotent-Replayed: true` (the stored answer: a retry would get it again).
//! - **When.** Exponential backoff with full jitter ([`Backoff`]; 0.5 s doubling to 5 s, the
//!   bounds of Stripe's libraries), never shorter than the answer's `Retry-After` (seconds or
//!   an HTTP-date, [`parse_retry_after`]), capped. At most `max_attempts`, and never past the
//!   total deadline: when the next pause would reach past it, the client stops at once and
//!   returns the last answer or error ([`RetryPolicy`]).
//! - **Bounded answers.** An answer body is read up to the policy's `max_response_bytes`
//!   (16 MiB by default); a larger one ends the operation, in doubt.
//! - **Replayable bodies only.** Bytes, JSON and form bodies are buffered and resent as they
//!   are; a streaming body cannot be sent twice and is refused before anything is sent
//!   ([`Error::StreamingBody`]).
//! - **What the caller learns.** A [`Response`] says whether the server replayed a stored
//!   answer (`Idempotent-Replayed: true`), how many attempts were made and which key was used.
//!   An [`Error`] keeps the last answer or error and says whether the outcome is
//!   [`Outcome::InDoubt`] (an attempt may have run: retry the *same* operation later, or look
//!   it up) or [`Outcome::NotExecuted`] (refused before sending, every attempt failed to
//!   connect, or a 4xx that says nothing ran).
//! - **Tracing.** One `idem_client.operation` span per operation (method, URL without its
//!   query, attempts, final status, outcome) and one `idem_client.attempt` span per attempt
//!   (attempt number, timeout, status or error, the pause chosen). The key's value is logged
//!   only at debug level.
//!
//! # Example
//!
//! ```no_run
//! use idem_client::{Client, Outcome, RetryPolicy};
//! use std::time::Duration;
//!
//! # async fn demo() -> Result<(), Box<dyn std::error::Error>> {
//! let client = Client::new(reqwest::Client::new()).with_policy(
//!     RetryPolicy::default()
//!         .attempt_timeout(Duration::from_secs(5))
//!         .deadline(Duration::from_secs(30)),
//! );
//! let charge = client.post("http://127.0.0.1:8080/v1/charges")
//!     .bearer_auth("sk_test_123")
//!     .form(&[("amount", "4242"), ("currency", "usd")]);
//! match client.send(charge).await {
//!     Ok(response) => println!(
//!         "{} (replayed: {}) after {} attempt(s)",
//!         response.status(),
//!         response.replayed(),
//!         response.attempts()
//!     ),
//!     Err(error) if error.outcome() == Outcome::InDoubt => {
//!         // Keep error.key(): retry the same operation with it later, never a new one.
//!         eprintln!("{error}: retry later with the same key");
//!     }
//!     Err(error) => eprintln!("{error}: nothing was charged"),
//! }
//! # Ok(())
//! # }
//! ```
//!
//! # Why a wrapper over `reqwest::Client`, not `reqwest-middleware`
//!
//! `reqwest-middleware` 0.5 does support reqwest 0.13, and a middleware could run this loop.
//! It was not chosen, on these grounds:
//!
//! - **The operation, not the request, is the unit.** The key must live as long as the
//!   logical operation and the caller must be able to give its own (an order id) or read the
//!   one used afterwards; a middleware sees one `Request` at a time and would pass keys and
//!   attempt counts through untyped extensions.
//! - **Buffering is honest.** A retry needs the body again; the wrapper checks it once,
//!   before sending anything, and refuses a stream with a typed error. It also reads every
//!   answer whole within the attempt's timeout, so a connection cut mid-body is retried like
//!   any other transport failure instead of surfacing later, outside the loop, from
//!   `Response::bytes`.
//! - **A precise error.** `reqwest_middleware::Error` wraps middleware failures in
//!   `anyhow::Error`; here the caller gets [`Error`], which keeps the last answer and says
//!   whether the outcome is in doubt.
//! - **Fewer dependencies**: no `anyhow` nor `reqwest-middleware`; the client
//!   keeps every `reqwest::RequestBuilder` method, because it takes the builder as it is.
//!
//! The loop itself follows Stripe's libraries (stripe-node's `RequestSender._shouldRetry`
//! retries connection errors, 409 and 5xx; its key is generated once, before the first
//! attempt, for every POST), with a few deliberate differences: 429 is retried (after its
//! `Retry-After`), 501 and the other configuration 5xx are not, `Stripe-Should-Retry` is not
//! read, the jitter is full rather than "half to full" and the pause has no 0.5 s floor, PUT
//! and DELETE are keyed too, and there is a total deadline.
#![cfg_attr(docsrs, feature(doc_cfg))]

mod backoff;
mod client;
mod decision;
mod error;
mod key;
mod operation;
mod policy;
mod response;
mod retry_after;

pub use backoff::Backoff;
pub use client::{Client, DEFAULT_KEY_HEADER};
pub use decision::{is_retryable_status, is_safe_method};
pub use error::{AttemptError, Error, Outcome, StatusFailure, Stop, TransportFailure};
pub use key::{IdempotencyKey, InvalidKey, MAX_KEY_LEN};
pub use operation::Operation;
pub use policy::{RetryPolicy, DEFAULT_MAX_RESPONSE_BYTES};
pub use response::{Response, REPLAYED_HEADER};
pub use retry_after::parse_retry_after;

/// The repository's docs/client.md, its Rust example compiled as a doctest so it cannot rot.
#[cfg(doctest)]
#[doc = include_str!("../../docs/client.md")]
pub struct ClientGuide;
