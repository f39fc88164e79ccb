//! The store's connections live on threads of their own: they end with the last handle on the
//! store. Alone in its test binary, so that no other test's store comes or goes meanwhile.

use idem_sqlite::SqliteStore;
use std::time::{Duration, Instant};

/// The store's threads end with the last handle on it, and their connections close: a program
/// that opens and drops stores does not leak threads.
#[cfg(target_os = "linux")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_connections_threads_end_with_the_store() {
    fn store_threads() -> usize {
        std::fs::read_dir("/proc/self/task")
            .expect("tasks")
            .filter_map(|task| std::fs::read_to_string(task.ok()?.path().join("comm")).ok())
            .filter(|name| name.starts_with("idem-sqlite"))
            .count()
    }
    let dir = tempfile::tempdir().expect("dir");
    let before = store_threads();
    let store = SqliteStore::builder(dir.path().join("threads.db"))
        .readers(3)
        .open()
        .await
        .expect("open");
    let clone = store.clone();
    // A thread names itself once it runs: wait for the four to be there.
    let deadline = Instant::now() + Duration::from_secs(5);
    while store_threads() < before + 4 && Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    assert_eq!(store_threads(), before + 4, "a writer and 3 readers");
    drop(store);
    clone.call(|_| ()).await.expect("a clone keeps them");
    drop(clone);
    let deadline = Instant::now() + Duration::from_secs(5);
    while store_threads() > before && Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    assert_eq!(store_threads(), before, "the store's threads outlived it");
}
