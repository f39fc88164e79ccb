//! How a store's change feed is configured: the channel, the listener's own connection, and
//! how a silent listener is found (see [`crate::feed`]).

use crate::config::validate_identifier;
use idem_core::{Error, Field};
use sqlx::postgres::PgConnectOptions;
use std::time::Duration;

/// The channel announcements travel on by default.
pub(crate) const DEFAULT_CHANNEL: &str = "idem_changes";

/// The longest channel name: a feed also listens on `<channel>_<16 hex digits>` (its pings),
/// and PostgreSQL's channel names have at most 63 bytes.
const MAX_CHANNEL: usize = 63 - 17;

/// The `application_name` of the listener's session when its options name none, so that
/// operators see it in `pg_stat_activity`.
pub(crate) const LISTENER_APPLICATION: &str = "idem_changes_feed";

/// Where the listener connects.
#[derive(Clone)]
pub(crate) enum ListenerTarget {
    /// The store's own connect options.
    Store,
    /// A URL, parsed when the store connects.
    Url(String),
    /// Options given as they are.
    Options(Box<PgConnectOptions>),
}

/// Never the URL itself: it may carry a password.
impl std::fmt::Debug for ListenerTarget {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            ListenerTarget::Store => "Store",
            ListenerTarget::Url(_) => "Url(..)",
            ListenerTarget::Options(_) => "Options(..)",
        })
    }
}

/// The listener's connect options, shown without their password.
#[derive(Clone)]
pub(crate) struct ListenerOptions(pub(crate) PgConnectOptions);

impl std::fmt::Debug for ListenerOptions {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ListenerOptions")
            .field("host", &self.0.get_host())
            .field("port", &self.0.get_port())
            .field("database", &self.0.get_database())
            .field("application_name", &self.0.get_application_name())
            .finish_non_exhaustive()
    }
}

/// The settings of a store's change feed.
#[derive(Debug, Clone)]
pub(crate) struct FeedSettings {
    /// Whether the store has a feed at all.
    pub(crate) enabled: bool,
    pub(crate) channel: String,
    pub(crate) listener: ListenerTarget,
    /// How often the feed checks that announcements still reach its listener.
    pub(crate) ping_every: Duration,
    /// How long a ping the store sent may take to reach the listener before the listener is
    /// judged dead and replaced.
    pub(crate) ping_within: Duration,
}

impl Default for FeedSettings {
    fn default() -> Self {
        Self {
            enabled: true,
            channel: DEFAULT_CHANNEL.to_owned(),
            listener: ListenerTarget::Store,
            ping_every: Duration::from_secs(5),
            ping_within: Duration::from_secs(2),
        }
    }
}

impl FeedSettings {
    /// Checks the channel name and the ping's durations.
    pub(crate) fn validate(&self) -> Result<(), Error> {
        validate_identifier(&self.channel)?;
        if self.channel.len() > MAX_CHANNEL {
            return Err(Error::invalid(
                Field::Config,
                format!("the change feed's channel has at most {MAX_CHANNEL} bytes"),
            ));
        }
        if self.ping_every.is_zero() || self.ping_within.is_zero() {
            return Err(Error::invalid(
                Field::Config,
                "the change feed's ping interval and deadline must be more than zero",
            ));
        }
        Ok(())
    }

    /// The listener's connect options: the store's unless others were given, named
    /// [`LISTENER_APPLICATION`] unless they name themselves.
    pub(crate) fn listener_options(
        &self,
        store: &PgConnectOptions,
    ) -> Result<ListenerOptions, Error> {
        let options = match &self.listener {
            ListenerTarget::Store => store.clone(),
            ListenerTarget::Url(url) => url.parse().map_err(|e: sqlx::Error| {
                Error::invalid(
                    Field::Config,
                    format!("the change feed's listener URL does not parse: {e}"),
                )
            })?,
            ListenerTarget::Options(options) => (**options).clone(),
        };
        Ok(ListenerOptions(match options.get_application_name() {
            Some(_) => options,
            None => options.application_name(LISTENER_APPLICATION),
        }))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn c05_the_channel_leaves_room_for_the_ping_channel() {
        let mut settings = FeedSettings::default();
        assert!(settings.validate().is_ok());
        settings.channel = "c".repeat(MAX_CHANNEL);
        assert!(settings.validate().is_ok());
        settings.channel = "c".repeat(MAX_CHANNEL + 1);
        assert!(settings.validate().is_err());
        settings.channel = "Changes; DROP".to_owned();
        assert!(settings.validate().is_err());
        settings.channel = DEFAULT_CHANNEL.to_owned();
        settings.ping_within = Duration::ZERO;
        assert!(settings.validate().is_err());
    }

    #[test]
    fn c05_the_listener_is_named_unless_it_names_itself() {
        let store = PgConnectOptions::new().host("db").database("app");
        let settings = FeedSettings::default();
        let options = settings
            .listener_options(&store)
            .expect("the store's options")
            .0;
        assert_eq!(options.get_application_name(), Some(LISTENER_APPLICATION));
        assert_eq!(options.get_host(), "db");
        let own = FeedSettings {
            listener: ListenerTarget::Url(
                "postgres://u:secret@direct:5433/app?application_name=mine".to_owned(),
            ),
            ..FeedSettings::default()
        };
        let options = own.listener_options(&store).expect("a URL");
        assert!(!format!("{options:?}").contains("secret"), "{options:?}");
        let options = options.0;
        assert_eq!(options.get_application_name(), Some("mine"));
        assert_eq!(options.get_port(), 5433);
        assert!(
            !format!("{own:?}").contains("secret"),
            "no URL in debug output"
        );
        let bad = FeedSettings {
            listener: ListenerTarget::Url("postgres://u@h:notaport/db".to_owned()),
            ..FeedSettings::default()
        };
        assert!(bad.listener_options(&store).is_err());
    }
}
