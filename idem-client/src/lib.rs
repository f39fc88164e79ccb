//! The calling side of idempotency: one key per logical operation, kept across its retries,
//! and retries the way Stripe's client libraries make them.
//!
//! Every team that calls an idempotent API writes the same loop by hand. Generic retry
//! middleware knows nothing of keys, and retrying a `POST` without one is how a card is charged
//! twice. This crate is that loop, once, in two forms over the same rules:
//!
//! - [`IdempotencyMiddleware`], a [`reqwest_middleware::Middleware`]: one `send` is one
//!   operation;
//! - [`Client`], a client of its own over `reqwest::Client`: one [`Client::send`] (or
//!   [`Operation`]) is one operation, its answer read whole, its failure a typed [`Error`].
//!
//! The crate re-exports the [`reqwest`] and [`reqwest_middleware`] it is built on: use them
//! (`idem_client::reqwest`) and the versions always match.
//!
//! ```no_run
//! use idem_client::{reqwest, reqwest_middleware, Client, IdempotencyMiddleware};
//!
//! # async fn demo() -> Result<(), Box<dyn std::error::Error>> {
//! // The middleware, in a reqwest-middleware chain.
//! let client = reqwest_middleware::ClientBuilder::new(reqwest::Client::new())
//!     .with(IdempotencyMiddleware::default())
//!     .build();
//! let response = client
//!     .post("http://127.0.0.1:8080/v1/charges")
//!     .basic_auth("sk_test_123", None::<&str>)
//!     .form(&[("amount", "4242"), ("currency", "usd")])
//!     .send()
//!     .await?;
//! println!("{}", response.status());
//!
//! // The crate's own client.
//! let client = Client::new(reqwest::Client::new());
//! let response = client
//!     .send(
//!         client
//!             .post("http://127.0.0.1:8080/v1/charges")
//!             .basic_auth("sk_test_123", None::<&str>)
//!             .form(&[("amount", "4242"), ("currency", "usd")]),
//!     )
//!     .await?;
//! println!("{} after {} attempt(s)", response.status(), response.attempts());
//! # Ok(())
//! # }
//! ```
//!
//! # The rules
//!
//! - **A key per operation.** A fresh UUID v4 (or the caller's own [`IdempotencyKey`]) is
//!   made once per operation and sent, unchanged, on every attempt of it, in the
//!   `Idempotency-Key` header (the name is configurable: [`Client::with_key_header`],
//!   [`IdempotencyMiddleware::with_key_header`]). It is never sent with another operation.
//!   Every method but the safe ones gets one (POST, PATCH, PUT, DELETE, extension methods:
//!   [`is_safe_method`]); GET, HEAD, OPTIONS and TRACE are sent and retried without one unless
//!   the caller gives one. The header value is the key bare when it is made of token
//!   characters, else an RFC 8941 sf-string ([`IdempotencyKey::to_header`]), exactly as `idem`
//!   servers read it.
//! - **What is retried** ([`is_retryable_status`]): connection errors, attempts that time out
//!   (a per-attempt timeout), 409 (the same key is being processed: retried after its
//!   `Retry-After`), 429 (after `Retry-After` when present), 500, 502, 503 and 504. Never
//!   400, 401, 403, 404, 422 nor any other 4xx (the same request would get the same answer),
//!   nor 501, 505 and the other 5xx that describe the server's configuration, nor any answer
//!   marked `Idempotent-Replayed: true` (the stored answer: a retry would get it again).
//! - **When.** Exponential backoff with full jitter ([`Backoff`]; 0.5 s doubling to 5 s, the
//!   bounds of Stripe's libraries), never shorter than the answer's `Retry-After` (seconds or
//!   an HTTP-date, [`parse_retry_after`]), capped. At most `max_attempts`, and never past the
//!   total deadline: when the next pause would reach past it, the loop stops at once and
//!   returns the last answer or error ([`RetryPolicy`]).
//! - **Replayable bodies only.** Bytes, JSON and form bodies are buffered and resent as they
//!   are. A streaming body cannot be sent twice: the client refuses it before anything is sent
//!   ([`Error::StreamingBody`]); the middleware sends it once and does not retry it.
//! - **What the caller learns.** Whether the server replayed a stored answer
//!   (`Idempotent-Replayed: true`: [`Response::replayed`], [`is_replayed`]), how many attempts
//!   were made and which key was used ([`Response`]; for the middleware, [`Attempts`] and the
//!   [`IdempotencyKey`] in the answer's extensions). A failure keeps the last answer or error
//!   and says whether the outcome is [`Outcome::InDoubt`] (an attempt may have run: retry the
//!   *same* operation later, or look it up) or [`Outcome::NotExecuted`] (refused before
//!   sending, every attempt failed to connect, or a 4xx that says nothing ran).
//! - **Tracing.** One `idem_client.operation` span per operation (method, URL without its
//!   query, attempts, final status, outcome) and one `idem_client.attempt` span per attempt
//!   (attempt number, timeout, status or error, the pause chosen). The key's value is logged
//!   only at debug level.
//!
//! # The middleware or the client
//!
//! Both run the same loop (one function decides every attempt's fate). They differ in what
//! they hand back:
//!
//! | | [`IdempotencyMiddleware`] | [`Client`] |
//! |---|---|---|
//! | fits | any `reqwest_middleware` chain (tracing, auth, ...) | code that takes a `reqwest::RequestBuilder` |
//! | the answer | a `reqwest::Response`, any status, its body streamed to the caller | a [`Response`] below 400, its body read whole |
//! | the attempt timeout covers | sending and the answer's head | sending and the whole answer, up to `max_response_bytes` |
//! | a connection cut mid-body | an error when the caller reads the body, not retried | retried like any transport failure |
//! | a streaming body | sent once, not retried | refused, nothing sent |
//! | the caller's key | `with_extension(key)` or the key header | [`Operation::key`] or the key header |
//! | a failure | a non-2xx answer with [`Attempts`], or `reqwest_middleware::Error::Middleware` wrapping an [`Error`] ([`Error::in_middleware`]) | an [`Error`] |
//!
//! The loop follows Stripe's libraries (stripe-node's `RequestSender._shouldRetry` retries
//! connection errors, 409 and 5xx; its key is generated once, before the first attempt, for
//! every POST), with a few deliberate differences: 429 is retried (after its `Retry-After`),
//! 501 and the other configuration 5xx are not, `Stripe-Should-Retry` is not read, the jitter
//! is full rather than "half to full" and the pause has no 0.5 s floor, PUT and DELETE are
//! keyed too, and there is a total deadline.
#![cfg_attr(docsrs, feature(doc_cfg))]

mod backoff;
mod client;
mod decision;
mod error;
mod key;
mod middleware;
mod operation;
mod policy;
mod response;
mod retry;
mod retry_after;

pub use reqwest;
pub use reqwest_middleware;

pub use backoff::Backoff;
pub use client::{Client, DEFAULT_KEY_HEADER};
pub use decision::{is_retryable_status, is_safe_method};
pub use error::{AttemptError, Error, Outcome, StatusFailure, Stop, TransportFailure};
pub use key::{IdempotencyKey, InvalidKey, MAX_KEY_LEN};
pub use middleware::{Attempts, IdempotencyMiddleware};
pub use operation::Operation;
pub use policy::{RetryPolicy, DEFAULT_MAX_RESPONSE_BYTES};
pub use response::{is_replayed, Response, REPLAYED_HEADER};
pub use retry_after::parse_retry_after;

/// The repository's docs/client.md, its Rust examples compiled as doctests so they cannot rot.
#[cfg(doctest)]
#[doc = include_str!("../../docs/client.md")]
pub struct ClientGuide;
