//! What the integration tests share: a scripted HTTP server on a local listener. The tests
//! against the project's payments server run as that server's own tests
//! (examples/payments-server/tests/client.rs), where cargo builds its binary.

#![allow(dead_code)]

pub(crate) mod scripted;
