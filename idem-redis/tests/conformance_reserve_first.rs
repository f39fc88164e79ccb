//! The conformance suite against `RedisStore` with `read_first(false)`: every reservation
//! by its script (`conformance.rs` runs the default, reading first while answers dominate).

mod common;

use common::Redis;
use idem_core::testing::Harness;
use idem_core::{FencingToken, RecordId};
use idem_redis::RedisStore;

struct ReserveFirstRedis;

#[idem_core::store::async_trait]
impl Harness for ReserveFirstRedis {
    type Store = RedisStore;

    async fn store(&self) -> RedisStore {
        Redis { cluster: false }
            .connect(
                RedisStore::builder()
                    .prefix(&format!("t{}", FencingToken::generate()))
                    .read_first(false),
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

idem_core::conformance_tests!(ReserveFirstRedis);
