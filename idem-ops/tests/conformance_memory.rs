//! The operator scenarios against the reference store.

use idem_core::testing::Harness;
use idem_core::{MemoryStore, RecordId};

/// Every scenario gets a new `MemoryStore`: a namespace of its own.
struct Memory;

#[idem_core::store::async_trait]
impl Harness for Memory {
    type Store = MemoryStore;

    async fn store(&self) -> MemoryStore {
        MemoryStore::new()
    }

    async fn corrupt_response(&self, store: &MemoryStore, id: &RecordId) {
        assert!(store.overwrite_stored_response(id, b"\x00garbage".to_vec()));
    }
    async fn corrupt_in_progress(&self, _: &MemoryStore, _: &RecordId) -> bool {
        false // an in-progress entry has no response field
    }
}

idem_ops::operator_tests!(Memory);
