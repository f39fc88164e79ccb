//! What the layer protects and how it answers: everything an application may configure.

use crate::canonical::JsonForm;
use crate::render::Problem;
use http::header::HeaderName;
use http::request::Parts;
use http::Method;
use idem_core::StoredResponse;
use std::fmt;
use std::sync::Arc;
use std::time::Duration;

/// What happens to a 5xx response that the handler did not mark (C8).
///
/// A handler says what its answer means with [`NothingHappened`](crate::NothingHappened): a
/// marked response releases the key, whatever its status. An unmarked 5xx is ambiguous (the
/// effect may have run before the error), so by default it is stored and replayed like any
/// response: the safe choice, it cannot run an effect twice.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
#[non_exhaustive]
pub enum ServerErrors {
    /// Store an unmarked 5xx and replay it (the default).
    #[default]
    Store,
    /// Release the key on every 5xx, marked or not, so a retry runs again: only for handlers
    /// whose every 5xx means their effect rolled back (one database transaction, nothing
    /// outside it).
    Release,
}

pub(crate) type Render = dyn Fn(&Problem) -> StoredResponse + Send + Sync;
pub(crate) type StatusLocation = dyn Fn(&Parts, &str) -> Option<String> + Send + Sync;

/// The layer's settings (built through [`IdempotencyLayer`](crate::IdempotencyLayer)'s methods).
#[derive(Clone)]
pub(crate) struct Config {
    pub(crate) key_header: HeaderName,
    pub(crate) required: Vec<Method>,
    pub(crate) optional: Vec<Method>,
    pub(crate) fingerprint_headers: Vec<HeaderName>,
    pub(crate) json: JsonForm,
    /// The parts of a JSON body its canonical form leaves out (JSON Pointers).
    pub(crate) json_exclude: Vec<String>,
    pub(crate) canonical_form: bool,
    pub(crate) max_response_bytes: usize,
    pub(crate) server_errors: ServerErrors,
    pub(crate) render: Arc<Render>,
    /// `Some` on an asynchronous endpoint: an in-flight duplicate gets a 202 with the
    /// `Location` this returns instead of a 409.
    pub(crate) accept_in_flight: Option<Arc<StatusLocation>>,
    pub(crate) max_retry_after: Duration,
}

/// The largest response the layer stores by default: 4 MiB.
pub const DEFAULT_MAX_RESPONSE_BYTES: usize = 4 * 1024 * 1024;

impl Default for Config {
    fn default() -> Self {
        Self {
            key_header: HeaderName::from_static("idempotency-key"),
            required: vec![Method::POST, Method::PATCH],
            optional: vec![Method::PUT, Method::DELETE],
            fingerprint_headers: Vec::new(),
            json: JsonForm::Canonical,
            json_exclude: Vec::new(),
            canonical_form: true,
            max_response_bytes: DEFAULT_MAX_RESPONSE_BYTES,
            server_errors: ServerErrors::Store,
            render: Arc::new(|problem: &Problem| problem.to_response()),
            accept_in_flight: None,
            max_retry_after: DEFAULT_MAX_RETRY_AFTER,
        }
    }
}

/// The longest `Retry-After` sent with a 409 by default: 1 s. The time left on the lease is the
/// worst case (a first attempt that crashed); most first attempts finish much sooner, and a
/// duplicate costs one read.
pub const DEFAULT_MAX_RETRY_AFTER: Duration = Duration::from_secs(1);

/// How the layer treats a request, decided from its method and whether it carries a key.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Protection {
    /// Not idempotency-keyed: the inner service answers, untouched.
    PassThrough,
    /// Reserve, run once, replay.
    Protect,
}

impl Config {
    /// Required methods are protected (a missing key is then a 400); optional ones only when
    /// they carry a key; any other method passes through.
    /// Methods compare without regard to case: `post` is not `POST` to HTTP, but a handler
    /// routed with `any()` may treat it so, and it must not bypass the key.
    pub(crate) fn protection(&self, method: &Method, has_key: bool) -> Protection {
        let listed = |methods: &[Method]| {
            methods
                .iter()
                .any(|m| m.as_str().eq_ignore_ascii_case(method.as_str()))
        };
        if listed(&self.required) || (has_key && listed(&self.optional)) {
            Protection::Protect
        } else {
            Protection::PassThrough
        }
    }

    /// A problem in the application's shape, always with `Cache-Control: no-store` and with
    /// `Retry-After` when the problem has one, whatever the renderer did.
    pub(crate) fn render(&self, problem: &Problem) -> StoredResponse {
        let mut problem = problem.clone();
        if problem.status == 409 {
            problem.retry_after = problem
                .retry_after
                .map(|after| after.min(self.max_retry_after));
        }
        let problem = &problem;
        let mut response = (self.render)(problem);
        // The status is the problem's: a renderer cannot turn "nothing ran" into a success.
        response.status = problem.status;
        response.headers.retain(|(name, _)| {
            !name.eq_ignore_ascii_case("cache-control") && !name.eq_ignore_ascii_case("retry-after")
        });
        let response = response.with_header("cache-control", "no-store");
        match problem.retry_after {
            Some(after) => response.with_header(
                "retry-after",
                crate::render::retry_after_secs(after).to_string(),
            ),
            None => response,
        }
    }
}

impl fmt::Debug for Config {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Config")
            .field("key_header", &self.key_header)
            .field("required", &self.required)
            .field("optional", &self.optional)
            .field("fingerprint_headers", &self.fingerprint_headers)
            .field("json", &self.json)
            .field("json_exclude", &self.json_exclude)
            .field("canonical_form", &self.canonical_form)
            .field("max_response_bytes", &self.max_response_bytes)
            .field("server_errors", &self.server_errors)
            .field("max_retry_after", &self.max_retry_after)
            .field("accept_in_flight", &self.accept_in_flight.is_some())
            .finish_non_exhaustive()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn post_and_patch_require_a_key_put_and_delete_use_one_when_sent() {
        let config = Config::default();
        for (method, has_key, expected) in [
            (Method::POST, false, Protection::Protect),
            (Method::PATCH, false, Protection::Protect),
            (Method::PUT, false, Protection::PassThrough),
            (Method::PUT, true, Protection::Protect),
            (Method::DELETE, true, Protection::Protect),
            (Method::GET, true, Protection::PassThrough),
            (Method::HEAD, true, Protection::PassThrough),
            (
                Method::from_bytes(b"post").expect("a method"),
                false,
                Protection::Protect,
            ),
            (
                Method::from_bytes(b"Put").expect("a method"),
                true,
                Protection::Protect,
            ),
        ] {
            assert_eq!(
                config.protection(&method, has_key),
                expected,
                "{method} {has_key}"
            );
        }
    }

    #[test]
    fn a_custom_rendering_keeps_no_store_and_retry_after() {
        let config = Config {
            render: Arc::new(|p: &Problem| {
                StoredResponse::new(200, format!("{{\"error\":\"{}\"}}", p.kind))
                    .with_header("cache-control", "max-age=60")
            }),
            ..Config::default()
        };
        let busy = Problem::new(409, "request-in-progress", "busy", true)
            .with_retry_after(Duration::from_millis(2500));
        let http = config.render(&busy);
        assert_eq!(http.body, br#"{"error":"request-in-progress"}"#);
        assert_eq!(http.status, 409);
        assert_eq!(http.header("cache-control"), Some(&b"no-store"[..]));
        assert_eq!(
            http.header("retry-after"),
            Some(&b"1"[..]),
            "capped at 1 s by default"
        );
        let patient = Config {
            max_retry_after: Duration::from_secs(30),
            ..config
        };
        assert_eq!(patient.render(&busy).header("retry-after"), Some(&b"3"[..]));
    }
}
