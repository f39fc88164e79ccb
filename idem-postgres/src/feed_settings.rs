//! How a store's change feed is configured beyond the core's
//! [`FeedSettings`](idem_ops::feed::FeedSettings): the channel's name, and the listener's own
//! connection (see `store/feed.rs`).

use crate::config::validate_identifier;
use crate::hosts::Hosts;
use crate::hosts_url;
use idem_core::{Error, Field};
use idem_ops::feed::FeedSettings;
use sqlx::postgres::PgConnectOptions;
use std::sync::Arc;
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

/// The listener's connect options, shown without their password: fixed ones, or the current
/// host of a list (`crate::hosts`: the store's, or the listener URL's own), so that the
/// listener follows a failover.
#[derive(Clone)]
pub(crate) enum ListenerOptions {
    Fixed(Box<PgConnectOptions>),
    Hosts(Arc<Hosts>),
}

impl ListenerOptions {
    /// Where the listener connects now.
    pub(crate) fn current(&self) -> PgConnectOptions {
        match self {
            ListenerOptions::Fixed(options) => (**options).clone(),
            ListenerOptions::Hosts(hosts) => named(hosts.current_options()),
        }
    }

    /// Where the listener connects, the hosts searched first if there are several (or one
    /// checked for writes): a `LISTEN` must reach the primary, where notifications are sent.
    pub(crate) async fn find(&self, within: Duration) -> PgConnectOptions {
        if let ListenerOptions::Hosts(hosts) = self {
            if hosts.follows() {
                hosts.search(within).await;
            }
        }
        self.current()
    }
}

impl std::fmt::Debug for ListenerOptions {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let options = self.current();
        f.debug_struct("ListenerOptions")
            .field("host", &options.get_host())
            .field("port", &options.get_port())
            .field("database", &options.get_database())
            .field("application_name", &options.get_application_name())
            .finish_non_exhaustive()
    }
}

/// `options`, named [`LISTENER_APPLICATION`] unless they name themselves.
fn named(options: PgConnectOptions) -> PgConnectOptions {
    match options.get_application_name() {
        Some(_) => options,
        None => options.application_name(LISTENER_APPLICATION),
    }
}

/// The settings of a store's change feed: the core's, on [`DEFAULT_CHANNEL`].
pub(crate) fn default_settings() -> FeedSettings {
    FeedSettings::new(DEFAULT_CHANNEL)
}

/// Checks the channel name (an identifier that leaves room for the ping channel) and the
/// ping's durations.
pub(crate) fn validate(settings: &FeedSettings) -> Result<(), Error> {
    validate_identifier(&settings.channel)?;
    if settings.channel.len() > MAX_CHANNEL {
        return Err(Error::invalid(
            Field::Config,
            format!("the change feed's channel has at most {MAX_CHANNEL} bytes"),
        ));
    }
    settings.validate()
}

impl ListenerTarget {
    /// The listener's connect options: the store's current host's unless others were given (a
    /// URL may name several hosts, as the store's may), named [`LISTENER_APPLICATION`] unless
    /// they name themselves.
    pub(crate) fn options(&self, store: &Arc<Hosts>) -> Result<ListenerOptions, Error> {
        let options = match self {
            ListenerTarget::Store => return Ok(ListenerOptions::Hosts(Arc::clone(store))),
            ListenerTarget::Url(url) => {
                let target = hosts_url::parse(url).map_err(|e| {
                    Error::invalid(
                        Field::Config,
                        format!("the change feed's listener URL does not parse: {e}"),
                    )
                })?;
                let hosts = Hosts::new(target);
                if hosts.follows() {
                    return Ok(ListenerOptions::Hosts(Arc::new(hosts)));
                }
                hosts.current_options()
            }
            ListenerTarget::Options(options) => (**options).clone(),
        };
        Ok(ListenerOptions::Fixed(Box::new(named(options))))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[test]
    fn c05_the_channel_leaves_room_for_the_ping_channel() {
        let (longest, too_long) = ("c".repeat(MAX_CHANNEL), "c".repeat(MAX_CHANNEL + 1));
        for (channel, valid) in [
            (DEFAULT_CHANNEL, true),
            (longest.as_str(), true),
            (too_long.as_str(), false),
            ("Changes; DROP", false),
        ] {
            let settings = FeedSettings::new(channel);
            assert_eq!(validate(&settings).is_ok(), valid, "{channel:?}");
        }
        let mut pings = default_settings();
        pings.ping_within = Duration::ZERO;
        assert!(validate(&pings).is_err(), "the core's checks too");
    }

    #[test]
    fn c05_the_listener_is_named_unless_it_names_itself() {
        let store = Arc::new(Hosts::single(
            PgConnectOptions::new().host("db").database("app"),
        ));
        let options = ListenerTarget::Store
            .options(&store)
            .expect("the store's options")
            .current();
        assert_eq!(options.get_application_name(), Some(LISTENER_APPLICATION));
        assert_eq!(options.get_host(), "db");
        let own = ListenerTarget::Url(
            "postgres://u:secret@direct:5433/app?application_name=mine".to_owned(),
        );
        let options = own.options(&store).expect("a URL");
        assert!(!format!("{options:?}").contains("secret"), "{options:?}");
        let options = options.current();
        assert_eq!(options.get_application_name(), Some("mine"));
        assert_eq!(options.get_port(), 5433);
        assert!(
            !format!("{own:?}").contains("secret"),
            "no URL in debug output"
        );
        let bad = ListenerTarget::Url("postgres://u@h:notaport/db".to_owned());
        assert!(bad.options(&store).is_err());
        let hosts = ListenerTarget::Url(
            "postgres://u@direct1,direct2:5433/app?target_session_attrs=read-write".to_owned(),
        );
        let options = hosts.options(&store).expect("a multi-host URL");
        assert!(matches!(options, ListenerOptions::Hosts(_)), "{options:?}");
        let options = options.current();
        assert_eq!((options.get_host(), options.get_port()), ("direct1", 5432));
        assert_eq!(options.get_application_name(), Some(LISTENER_APPLICATION));
    }
}
