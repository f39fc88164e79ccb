//! The shared conformance suite against `SqliteStore`, every scenario on one database file.

mod common;

use idem_core::RecordId;
use idem_sqlite::SqliteStore;

idem_core::conformance_tests! {
    store: common::store(),
    corrupt: |store: std::sync::Arc<SqliteStore>, id: RecordId| async move {
        let changed = store
            .call(move |db| {
                db.execute(
                    "UPDATE idem_records SET response = X'00FF00' WHERE consumer = ?1 AND route = ?2 AND key = ?3",
                    [id.consumer(), id.route(), id.key()],
                )
            })
            .await
            .expect("call")
            .expect("update");
        assert_eq!(changed, 1);
    },
}
