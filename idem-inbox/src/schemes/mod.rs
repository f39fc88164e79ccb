//! The senders' schemes, one file each (docs/inbox.md has a section per sender).

pub mod github;
pub mod shopify;
/// The Standard Webhooks scheme, shared with idem-outbox (idem-signature).
pub use idem_signature::standard_webhooks;
pub mod stripe;
