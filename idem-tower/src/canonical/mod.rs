//! Canonical bodies (C3): what a body means, as one byte string, by its media type. A retry
//! that re-encodes its JSON (another key order, other whitespace or escaping) or sends its form
//! fields in another order is the same request, because the fingerprint hashes the canonical
//! bytes, not the bytes as sent.
//!
//! - [`canonical_json`]: a strict RFC 8259 body, keys sorted, whitespace dropped, one escaping,
//!   the volatile fields the caller names removed;
//! - [`canonical_form`]: an `application/x-www-form-urlencoded` body, distinct plain names
//!   (letters, digits, `_`, `-`) sorted, any other form kept in its order, one
//!   percent-encoding.
//!
//! The layer calls them for both media types by default ([`IdempotencyLayer::raw_json`](crate::IdempotencyLayer::raw_json),
//! [`IdempotencyLayer::canonical_form`](crate::IdempotencyLayer::canonical_form) opt out); code that builds
//! its requests itself gives their output to the engine's request builder, and the body as
//! received for the size limit:
//!
//! ```
//! use idem_core::{Idempotency, MemoryStore};
//! use idem_tower::canonical::canonical_json;
//! let idem = Idempotency::new(MemoryStore::new());
//! let build = |body: &[u8]| -> Result<_, idem_core::Error> {
//!     let canonical = canonical_json(body, &["/client_sent_at"])?;
//!     idem.request("acct_42", "POST", "/v1/charges")
//!         .key(Some("k-1"))
//!         .body(body)
//!         .canonical_json(&canonical)
//!         .build()
//! };
//! let sent = build(br#"{"amount": 100, "client_sent_at": "10:00"}"#)?;
//! let resent = build(br#"{"client_sent_at":"10:01","amount":100}"#)?;
//! assert_eq!(sent.fingerprint(), resent.fingerprint());
//! # Ok::<(), idem_core::Error>(())
//! ```
//!
//! The canonical bytes are pinned by golden tests: stored fingerprints must keep matching
//! their retries, so no output of these functions may ever change.

mod form;
mod json;

use idem_core::{Error, Request, RequestBuilder};

pub use form::canonical_form;
pub use json::canonical_json;

/// How the layer fingerprints JSON bodies.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum JsonForm {
    /// Canonical, and a record under the raw form is the request's too (the default).
    Canonical,
    /// Byte for byte, nothing else accepted.
    Raw,
    /// Records written raw, and a record under the canonical form is the request's too.
    RawFirst,
}

/// A body made canonical, and which kind it is.
pub(crate) enum Canonical {
    Json(Vec<u8>),
    Form(Vec<u8>),
}

/// The canonical body of `body` sent as `media` (a normalised media type), if the layer's
/// settings canonicalise that media type and the body canonicalises: JSON (`application/json`,
/// `+json`) when `json` names its volatile fields, a form when `form` is on.
pub(crate) fn by_media_type(
    media: &str,
    body: &[u8],
    json: Option<&[&str]>,
    form: bool,
) -> Option<Canonical> {
    if let Some(exclude) = json.filter(|_| is_json(media)) {
        return canonical_json(body, exclude).ok().map(Canonical::Json);
    }
    if form && media == "application/x-www-form-urlencoded" {
        return canonical_form(body).ok().map(Canonical::Form);
    }
    None
}

/// The request `builder` makes (its body as received already given) for the `canonical` form
/// of its body: a form's canonical fingerprint; a JSON body's raw and canonical fingerprints,
/// one written, the other accepted in a stored record (C3), as `json` says.
pub(crate) fn request(
    builder: RequestBuilder<'_>,
    canonical: Option<&Canonical>,
    json: JsonForm,
) -> Result<Request, Error> {
    match canonical {
        None => builder.build(),
        Some(Canonical::Form(bytes)) => builder.canonical_form(bytes).build(),
        Some(Canonical::Json(bytes)) => {
            let raw = builder.clone().build()?;
            let canonical = builder.canonical_json(bytes).build()?;
            Ok(match json {
                JsonForm::RawFirst => raw.with_alternative_fingerprint(*canonical.fingerprint()),
                JsonForm::Canonical | JsonForm::Raw => {
                    canonical.with_alternative_fingerprint(*raw.fingerprint())
                }
            })
        }
    }
}

/// `application/json` and the structured syntax suffix `+json` (RFC 6839).
fn is_json(media: &str) -> bool {
    media == "application/json" || media.ends_with("+json")
}
