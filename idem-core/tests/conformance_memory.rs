//! The conformance suite against the reference store.

use idem_core::{MemoryStore, RecordId};
use std::sync::Arc;

idem_core::conformance_tests! {
    store: async { MemoryStore::new() },
    corrupt: |store: Arc<MemoryStore>, id: RecordId| async move {
        assert!(store.overwrite_stored_response(&id, b"\x00garbage".to_vec()));
    },
}
