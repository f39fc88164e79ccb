//! How a store's change feed is configured: the channel, and how a silent subscription is
//! found (see [`crate::feed`]).

use idem_core::{Error, Field};
use std::time::Duration;

/// The channel announcements travel on by default.
pub(crate) const DEFAULT_CHANNEL: &str = "idem:changes";

/// The longest channel name accepted.
const MAX_CHANNEL: usize = 64;

/// The settings of a store's change feed.
#[derive(Debug, Clone)]
pub(crate) struct FeedSettings {
    /// Whether the store has a feed at all.
    pub(crate) enabled: bool,
    pub(crate) channel: String,
    /// How often the feed checks that announcements still reach its subscription.
    pub(crate) ping_every: Duration,
    /// How long a ping the store published may take to arrive before the subscription is
    /// judged dead and replaced.
    pub(crate) ping_within: Duration,
}

impl Default for FeedSettings {
    fn default() -> Self {
        Self {
            enabled: true,
            channel: DEFAULT_CHANNEL.to_owned(),
            ping_every: Duration::from_secs(5),
            ping_within: Duration::from_secs(2),
        }
    }
}

impl FeedSettings {
    /// Checks the channel (1..=64 bytes of visible ASCII) and the ping's durations.
    pub(crate) fn validate(&self) -> Result<(), Error> {
        let ok = !self.channel.is_empty()
            && self.channel.len() <= MAX_CHANNEL
            && self.channel.bytes().all(|b| (0x21..=0x7e).contains(&b));
        if !ok {
            return Err(Error::invalid(
                Field::Config,
                "the change feed's channel must be 1..=64 bytes of visible ASCII",
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

    /// The channel of one feed's own pings: `<channel>:ping:<nonce>`.
    pub(crate) fn ping_channel(&self, nonce: &str) -> String {
        format!("{}:ping:{nonce}", self.channel)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn c05_a_channel_is_visible_ascii_and_pings_are_positive() {
        let mut settings = FeedSettings::default();
        assert!(settings.validate().is_ok());
        for bad in ["", "with space", &"c".repeat(MAX_CHANNEL + 1)] {
            settings.channel = bad.to_owned();
            assert!(settings.validate().is_err(), "{bad:?}");
        }
        settings.channel = "billing:changes".to_owned();
        assert!(settings.validate().is_ok());
        assert_eq!(settings.ping_channel("ab"), "billing:changes:ping:ab");
        settings.ping_every = Duration::ZERO;
        assert!(settings.validate().is_err());
    }
}
