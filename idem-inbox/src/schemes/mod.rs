//! The senders' schemes, one file each (docs/inbox.md has a section per sender).

pub mod github;
pub mod shopify;
pub mod standard_webhooks;
pub mod stripe;
