//! C15: one commit is an option of the request, honoured only where it can be kept.

use idem_core::store::Deadline;
use idem_core::{Error, Failure, Idempotency, MemoryStore, Store, StoredResponse};

/// The guard and the plain closure commit the reservation before the effect: a request that
/// asks for one commit is refused before anything is written, never run in two.
#[tokio::test]
async fn c15_a_one_commit_request_is_refused_by_the_guard_and_the_plain_closure() {
    let idem = Idempotency::new(MemoryStore::new());
    let request = idem
        .request("acct_1", "POST", "/orders")
        .key(Some("k1"))
        .body(b"{}")
        .build()
        .expect("a request")
        .with_one_commit(true);

    let begun = idem.begin(&request).await;
    assert!(
        matches!(begun, Err(Error::InvalidInput { .. })),
        "{begun:?}"
    );
    let ran = idem
        .run(&request, |_ctx| async {
            Ok::<_, Failure<std::io::Error>>(StoredResponse::new(201, "made"))
        })
        .await;
    assert!(ran.is_err(), "{ran:?}");
    assert!(
        idem.store()
            .lookup(request.id(), Deadline::default())
            .await
            .expect("lookup")
            .is_none(),
        "nothing was written"
    );

    // The same request in two commits runs.
    let two = request.with_one_commit(false);
    let ran = idem
        .run(&two, |_ctx| async {
            Ok::<_, Failure<std::io::Error>>(StoredResponse::new(201, "made"))
        })
        .await;
    assert!(ran.is_ok(), "{ran:?}");
}
