//! What the integration tests share: a scripted HTTP server on a local listener. The client's
//! tests against the project's payments server run as that server's own tests
//! (examples/payments-server/tests/client.rs), where cargo builds its binary; the middleware
//! example's end-to-end test (middleware_example.rs) runs the binary the workspace built.

#![allow(dead_code)]

pub(crate) mod scripted;
