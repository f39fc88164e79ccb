//! How a store's change feed is configured beyond the core's
//! [`FeedSettings`](idem_ops::feed::FeedSettings): the channel's name and the ping channel's
//! (see [`crate::feed`]).

use idem_core::{Error, Field};

pub(crate) use idem_ops::feed::FeedSettings;

/// The channel announcements travel on by default.
pub(crate) const DEFAULT_CHANNEL: &str = "idem:changes";

/// The longest channel name accepted.
const MAX_CHANNEL: usize = 64;

/// The settings of a store's change feed: the core's, on [`DEFAULT_CHANNEL`].
pub(crate) fn default_settings() -> FeedSettings {
    FeedSettings::new(DEFAULT_CHANNEL)
}

/// Checks the channel (1..=64 bytes of visible ASCII) and the ping's durations.
pub(crate) fn validate(settings: &FeedSettings) -> Result<(), Error> {
    let channel = &settings.channel;
    let ok = !channel.is_empty()
        && channel.len() <= MAX_CHANNEL
        && channel.bytes().all(|b| (0x21..=0x7e).contains(&b));
    if !ok {
        return Err(Error::invalid(
            Field::Config,
            "the change feed's channel must be 1..=64 bytes of visible ASCII",
        ));
    }
    settings.validate()
}

/// What the channel of one feed's own pings starts with, before the feed's nonce:
/// `<channel>:ping:`.
pub(crate) fn ping_prefix(settings: &FeedSettings) -> String {
    format!("{}:ping:", settings.channel)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[test]
    fn c05_a_channel_is_visible_ascii_and_pings_are_positive() {
        let mut settings = default_settings();
        assert!(validate(&settings).is_ok());
        for bad in ["", "with space", &"c".repeat(MAX_CHANNEL + 1)] {
            settings.channel = bad.to_owned();
            assert!(validate(&settings).is_err(), "{bad:?}");
        }
        settings.channel = "billing:changes".to_owned();
        assert!(validate(&settings).is_ok());
        assert_eq!(ping_prefix(&settings), "billing:changes:ping:");
        settings.ping_every = Duration::ZERO;
        assert!(validate(&settings).is_err());
    }
}
