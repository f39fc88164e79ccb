//! Test support shared by the tests that break the network between the store and PostgreSQL.
// Each test binary uses a part of it.
#![allow(dead_code, unused_imports)]

pub(crate) mod bench;
pub(crate) mod pg_pair;
pub(crate) mod pg_url;
pub(crate) mod private_bouncer;
pub(crate) mod short_budgets;

use fault_proxy::FaultProxy;

/// A proxy in front of the server of the PostgreSQL `url`, and the same URL through it.
pub(crate) async fn proxied(url: &str) -> (FaultProxy, String) {
    let proxy = FaultProxy::start(pg_url::authority(url))
        .await
        .expect("start the fault proxy");
    let through = pg_url::with_authority(url, &proxy.addr().to_string());
    (proxy, through)
}
