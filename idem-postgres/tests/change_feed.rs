//! The change feed (C5, C13) on PostgreSQL: the shared change-feed scenarios
//! (`idem_core::testing`, two stores, two pools, two engines on one table: two processes), the
//! waiter woken by the original's announcement (`pg_notify`) through its listener; and behind
//! PgBouncer in transaction mode (the announcement through the pooler, the listener connected
//! directly). The listener's session is terminated by `pg_terminate_backend`, and vanishes
//! silently through a fault proxy that only the listener goes through (the store's statements
//! go straight).

mod common;
mod support;

use common::{bouncer_url, pg_url, SCHEMA};
use fault_proxy::{Fault, FaultProxy};
use idem_core::testing::{waiting_engine, ChangeFeedHarness, FeedFault, Rounds};
use idem_core::FencingToken;
use idem_postgres::sqlx::{self, AssertSqlSafe};
use idem_postgres::{PgStore, PgStoreBuilder, StatementMode};
use std::time::Duration;

/// A new table's name in [`SCHEMA`].
fn new_table() -> String {
    format!("t_{}", FencingToken::generate())
}

/// A store on `table` (migrated) with `builder`'s settings, on `url`.
async fn store(builder: PgStoreBuilder, table: &str, url: &str) -> PgStore {
    let store = builder
        .schema(SCHEMA)
        .table(table)
        .max_connections(4)
        .connect(url)
        .await
        .expect("connect");
    store.migrate().await.expect("migrate");
    store
}

/// `url` with `application_name` set to `name`.
fn named(url: &str, name: &str) -> String {
    let glue = if url.contains('?') { '&' } else { '?' };
    format!("{url}{glue}application_name={name}")
}

/// Two processes' stores on one table of the shared server.
struct PgFeeds;

/// One scenario's table, and what its fault acts through.
struct Site {
    table: String,
    url: String,
    fault: FeedFault,
    /// The name of the waiter's listener session, which no other test uses.
    name: String,
    /// The original's store, also for the queries about the listener.
    original: PgStore,
    /// The proxy the waiter's listener goes through, and the URL through it.
    proxy: Option<(FaultProxy, String)>,
}

impl Site {
    fn proxy(&self) -> &FaultProxy {
        &self.proxy.as_ref().expect("a site with a proxy").0
    }

    /// The backends of the sessions named after the waiter's listener.
    async fn backends(&self) -> Vec<i32> {
        let query = format!(
            "SELECT pid FROM pg_stat_activity WHERE application_name = '{}'",
            self.name.replace('\'', "''")
        );
        let rows = sqlx::raw_sql(AssertSqlSafe(query))
            .fetch_all(self.original.pool())
            .await
            .expect("pg_stat_activity");
        rows.iter()
            .map(|row| sqlx::Row::try_get(row, 0).expect("a pid"))
            .collect()
    }
}

#[idem_core::store::async_trait]
impl ChangeFeedHarness for PgFeeds {
    type Store = PgStore;
    type Site = Site;

    async fn site(&self, fault: FeedFault) -> Site {
        let (table, url) = (new_table(), pg_url());
        let proxy = match fault {
            FeedFault::Silenced { .. } | FeedFault::Lost => Some(support::proxied(&url).await),
            _ => None,
        };
        Site {
            original: store(PgStore::builder(), &table, &url).await,
            name: format!("feed_{}", &FencingToken::generate().to_string()[..12]),
            table,
            url,
            fault,
            proxy,
        }
    }

    async fn original(&self, site: &Site) -> PgStore {
        site.original.clone()
    }

    async fn waiter(&self, site: &Site) -> PgStore {
        let proxied = |every, within| {
            let (_, through) = site.proxy.as_ref().expect("a site with a proxy");
            PgStore::builder()
                .listener_url(&named(through, &site.name))
                .feed_ping(every, within)
                .acquire_timeout(Duration::from_secs(1))
        };
        let builder = match site.fault {
            FeedFault::Killed => PgStore::builder().listener_url(&named(&site.url, &site.name)),
            FeedFault::Silenced { every, within } => proxied(every, within),
            FeedFault::Lost => proxied(Duration::from_millis(100), Duration::from_millis(150)),
            _ => PgStore::builder(),
        };
        store(builder, &site.table, &site.url).await
    }

    async fn listeners(&self, site: &Site) -> usize {
        site.backends().await.len()
    }

    async fn listener_connections(&self, site: &Site) -> Vec<String> {
        let backends = site.backends().await;
        backends.iter().map(i32::to_string).collect()
    }

    async fn kill_listener(&self, site: &Site) {
        for pid in site.backends().await {
            sqlx::raw_sql(AssertSqlSafe(format!("SELECT pg_terminate_backend({pid})")))
                .execute(site.original.pool())
                .await
                .expect("pg_terminate_backend");
        }
    }

    async fn cut(&self, site: &Site) {
        site.proxy().set(Fault::ServerGone);
    }

    async fn mend(&self, site: &Site) {
        site.proxy().set(Fault::PassThrough);
    }

    /// Only the listener goes through the proxy: found by its ping alone.
    const REPLACED_WITHIN: Duration = Duration::from_secs(2);

    /// The listener's session ends without the client hearing of it.
    async fn lose_listener(&self, site: &Site) {
        self.cut(site).await;
        self.until_listeners(site, 0, Duration::from_secs(2)).await;
    }
}

idem_core::change_feed_tests!(PgFeeds);

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn c05_behind_pgbouncer_the_announcement_passes_and_the_listener_connects_directly() {
    let table = new_table();
    let (bouncer, direct) = (bouncer_url(), pg_url());
    let through_bouncer = || {
        PgStore::builder()
            .statements(StatementMode::Simple)
            .listener_url(&direct)
    };
    let there = waiting_engine(store(through_bouncer(), &table, &bouncer).await);
    let here = waiting_engine(store(through_bouncer(), &table, &bouncer).await);
    Rounds::new(&there, &[&here])
        .prompt(3, "behind PgBouncer")
        .await;
}
