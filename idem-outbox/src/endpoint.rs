//! Endpoints: where a message is delivered, registered by name.

use std::time::Duration;

use idem_signature::StandardWebhooks;
use url::Url;

use crate::address::AddressPolicy;
use crate::{OutboxError, Schedule};

/// How long one attempt may take by default: 15 s, Svix's.
pub const DEFAULT_TIMEOUT: Duration = Duration::from_secs(15);

/// The longest endpoint name, in bytes.
pub const MAX_NAME_LEN: usize = 64;

/// A receiver of messages, registered by name ([`SqliteOutbox::register`](
/// crate::SqliteOutbox::register), [`PgOutbox::register`](crate::PgOutbox::register)): its
/// URL, its Standard Webhooks secrets (several during a rotation: each attempt carries one
/// signature per secret), how long an attempt may take, its retry schedule, and whether it is
/// enabled. `Debug` never shows a secret.
///
/// ```
/// use idem_outbox::{Endpoint, OutboxError, Schedule};
/// use std::time::Duration;
/// let endpoint = Endpoint::new("merchant", "https://merchant.example/webhooks", ["whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw"])?
///     .timeout(Duration::from_secs(10))?
///     .schedule(Schedule::default());
/// assert_eq!(endpoint.name(), "merchant");
/// assert!(!format!("{endpoint:?}").contains("MfKQ"));
/// assert!(matches!(
///     Endpoint::new("merchant", "/webhooks", ["whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw"]),
///     Err(OutboxError::InvalidUrl { .. })
/// ));
/// assert!(matches!(Endpoint::new("merchant", "https://m.example/", ["secret"]), Err(OutboxError::InvalidSecret(_))));
/// # Ok::<(), OutboxError>(())
/// ```
#[derive(Clone)]
pub struct Endpoint {
    pub(crate) name: String,
    pub(crate) url: Url,
    pub(crate) secrets: Vec<String>,
    pub(crate) signer: StandardWebhooks,
    pub(crate) timeout: Duration,
    pub(crate) schedule: Schedule,
    pub(crate) enabled: bool,
}

impl std::fmt::Debug for Endpoint {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Endpoint")
            .field("name", &self.name)
            .field("url", &self.url.as_str())
            .field("secrets", &self.secrets.len())
            .field("timeout", &self.timeout)
            .field("schedule", &self.schedule)
            .field("enabled", &self.enabled)
            .finish()
    }
}

impl Endpoint {
    /// An enabled endpoint `name` at `url` (absolute, `http` or `https`, with a host; no
    /// user name or password in it) signing with `secrets` (each `whsec_` and the base64 of
    /// 16 to 64 bytes, the first signing first), with [`DEFAULT_TIMEOUT`] and Svix's
    /// [`Schedule`]. An address literal in the URL that is loopback, private or link-local is
    /// refused when the dispatcher delivers (unless it allows it), as are host names that
    /// resolve only to such addresses.
    pub fn new<S: AsRef<str>>(
        name: &str,
        url: &str,
        secrets: impl IntoIterator<Item = S>,
    ) -> Result<Self, OutboxError> {
        check_name(name)?;
        let url = parse_url(url)?;
        let secrets: Vec<String> = secrets
            .into_iter()
            .map(|s| s.as_ref().trim().to_owned())
            .collect();
        if secrets.is_empty() {
            return Err(OutboxError::InvalidSecret(
                "at least one secret is required".into(),
            ));
        }
        if secrets
            .iter()
            .any(|s| !s.starts_with("whsec_") || s.contains(','))
        {
            return Err(OutboxError::InvalidSecret(
                "a secret is written whsec_<base64>".into(),
            ));
        }
        let signer = StandardWebhooks::new(&secrets)
            .map_err(|e| OutboxError::InvalidSecret(e.to_string()))?;
        Ok(Self {
            name: name.to_owned(),
            url,
            secrets,
            signer,
            timeout: DEFAULT_TIMEOUT,
            schedule: Schedule::default(),
            enabled: true,
        })
    }

    /// How long one attempt may take (connect, send, the response's head and its first
    /// bytes), 1 ms to 5 min. The dispatcher also ends an attempt before its claim runs out.
    pub fn timeout(mut self, timeout: Duration) -> Result<Self, OutboxError> {
        if timeout.is_zero() || timeout > Duration::from_secs(300) {
            return Err(OutboxError::InvalidSetting(
                "an endpoint's timeout is 1 ms to 5 min",
            ));
        }
        self.timeout = timeout;
        Ok(self)
    }

    /// The retry schedule.
    #[must_use]
    pub fn schedule(mut self, schedule: Schedule) -> Self {
        self.schedule = schedule;
        self
    }

    /// Enabled or not: the deliveries of a disabled endpoint wait (they are neither attempted
    /// nor dropped) until it is enabled again.
    #[must_use]
    pub fn enabled(mut self, enabled: bool) -> Self {
        self.enabled = enabled;
        self
    }

    /// The endpoint's name.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// The endpoint's URL.
    pub fn url(&self) -> &str {
        self.url.as_str()
    }

    /// Whether it is enabled.
    pub fn is_enabled(&self) -> bool {
        self.enabled
    }

    /// The timeout of one attempt.
    pub fn attempt_timeout(&self) -> Duration {
        self.timeout
    }

    /// The retry schedule.
    pub fn retry_schedule(&self) -> &Schedule {
        &self.schedule
    }

    /// The endpoint as stored: its secrets comma separated.
    pub(crate) fn stored_secrets(&self) -> String {
        self.secrets.join(",")
    }

    /// An endpoint read back from its row.
    pub(crate) fn from_stored(
        name: String,
        url: &str,
        secrets: &str,
        timeout_ms: i64,
        schedule: &str,
        enabled: bool,
    ) -> Result<Self, OutboxError> {
        let corrupt = |what: &str| OutboxError::Corrupt(format!("endpoint {name:?}: {what}"));
        let endpoint =
            Endpoint::new(&name, url, secrets.split(',')).map_err(|e| corrupt(&e.to_string()))?;
        let timeout_ms = u64::try_from(timeout_ms).map_err(|_| corrupt("negative timeout"))?;
        Ok(endpoint
            .timeout(Duration::from_millis(timeout_ms))
            .map_err(|_| corrupt("timeout out of range"))?
            .schedule(Schedule::from_stored(schedule)?)
            .enabled(enabled))
    }
}

/// An endpoint name: 1 to [`MAX_NAME_LEN`] bytes of visible ASCII.
pub(crate) fn check_name(name: &str) -> Result<(), OutboxError> {
    let ok = !name.is_empty()
        && name.len() <= MAX_NAME_LEN
        && name.bytes().all(|b| (0x21..=0x7e).contains(&b));
    if ok {
        Ok(())
    } else {
        Err(OutboxError::InvalidEndpointName(name.to_owned()))
    }
}

/// An absolute `http` or `https` URL with a host and no credentials.
fn parse_url(text: &str) -> Result<Url, OutboxError> {
    let invalid = |reason| OutboxError::InvalidUrl {
        url: text.to_owned(),
        reason,
    };
    let url = Url::parse(text).map_err(|_| invalid("not an absolute URL"))?;
    if !matches!(url.scheme(), "http" | "https") {
        return Err(invalid("the scheme is neither http nor https"));
    }
    if url.host().is_none() {
        return Err(invalid("no host"));
    }
    if !url.username().is_empty() || url.password().is_some() {
        return Err(invalid("credentials in the URL"));
    }
    if url.fragment().is_some() {
        return Err(invalid("a fragment"));
    }
    // An unspecified or broadcast address is never a receiver, whatever the policy.
    if let Some(ip) = crate::address::literal_ip(&url) {
        if AddressPolicy::never_allowed(ip) {
            return Err(invalid("an unspecified or broadcast address"));
        }
    }
    Ok(url)
}

#[cfg(test)]
mod tests {
    use super::*;

    const SECRET: &str = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw";

    #[test]
    fn c17_bad_urls_names_and_secrets_are_typed_errors() {
        for url in [
            "merchant.example/hook",
            "/hook",
            "ftp://merchant.example/hook",
            "file:///etc/passwd",
            "https://user:pw@merchant.example/",
            "https://merchant.example/#x",
            "http://0.0.0.0/",
            "http://255.255.255.255/",
            "http://[::]/",
            "",
        ] {
            assert!(
                matches!(
                    Endpoint::new("m", url, [SECRET]),
                    Err(OutboxError::InvalidUrl { .. })
                ),
                "{url}"
            );
        }
        for name in ["", "a b", &"n".repeat(65), "caf\u{e9}"] {
            assert!(matches!(
                Endpoint::new(name, "https://m.example/", [SECRET]),
                Err(OutboxError::InvalidEndpointName(_))
            ));
        }
        for secrets in [
            vec![],
            vec!["MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw"],
            vec!["whsec_"],
            vec!["whsec_c2VjcmV0"],
            vec!["whsec_not base64!"],
            vec![SECRET, "whsec_a,b"],
        ] {
            assert!(matches!(
                Endpoint::new("m", "https://m.example/", secrets),
                Err(OutboxError::InvalidSecret(_))
            ));
        }
        assert!(Endpoint::new("m", "http://127.0.0.1:8080/hook", [SECRET]).is_ok());
        assert!(matches!(
            Endpoint::new("m", "https://m.example/", [SECRET])
                .and_then(|e| e.timeout(Duration::ZERO)),
            Err(OutboxError::InvalidSetting(_))
        ));
    }
}
