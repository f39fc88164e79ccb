//! The conformance suite against `RedisStore` with `read_first(true)` (`conformance.rs` runs
//! the default).

mod common;

use common::Redis;
use idem_core::testing::Harness;
use idem_core::{FencingToken, RecordId};
use idem_redis::RedisStore;

struct ReadFirstRedis;

#[idem_core::store::async_trait]
impl Harness for ReadFirstRedis {
    type Store = RedisStore;

    async fn store(&self) -> RedisStore {
        Redis { cluster: false }
            .connect(
                RedisStore::builder()
                    .prefix(&format!("t{}", FencingToken::generate()))
                    .read_first(true),
            )
            .await
    }

    async fn corrupt_response(&self, store: &RedisStore, id: &RecordId) {
        Redis { cluster: false }.corrupt_response(store, id).await;
    }

    async fn corrupt_in_progress(&self, store: &RedisStore, id: &RecordId) -> bool {
        Redis { cluster: false }
            .corrupt_in_progress(store, id)
            .await
    }
}

idem_core::conformance_tests!(ReadFirstRedis);
