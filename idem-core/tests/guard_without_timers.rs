//! The guard style on a Tokio runtime without its time driver (C13): store calls then run
//! without the engine's deadline, and never panic.

use idem_core::{Begin, Idempotency, MemoryStore, StoredResponse};
use std::panic::{catch_unwind, AssertUnwindSafe};

#[test]
fn c13_guard_style_on_a_runtime_without_timers_answers_and_never_panics() {
    let rt = tokio::runtime::Builder::new_current_thread()
        .build()
        .expect("a runtime without the time driver");
    let idem = Idempotency::new(MemoryStore::new());
    let request = idem
        .request("acct", "POST", "/charges")
        .key(Some("guard"))
        .body(b"{}")
        .build()
        .expect("valid");
    let outcome = catch_unwind(AssertUnwindSafe(|| {
        rt.block_on(async {
            let Begin::Acquired(lease) = idem.begin(&request).await? else {
                panic!("a fresh key is acquired");
            };
            idem.complete(lease, StoredResponse::new(201, "charged"))
                .await
                .map(|_| ())
        })
    }));
    eprintln!(
        "guard style without timers: {:?}",
        outcome.as_ref().map_err(|p| p
            .downcast_ref::<String>()
            .cloned()
            .or_else(|| p.downcast_ref::<&str>().map(|s| (*s).to_owned())))
    );
    assert!(
        outcome.is_ok(),
        "begin/complete panicked on a runtime without the time driver (they worked before)"
    );
}

#[test]
fn c05_a_waiting_policy_on_a_runtime_without_timers_answers_in_flight_at_once() {
    use idem_core::{Answer, Policy};
    use std::time::Duration;
    let rt = tokio::runtime::Builder::new_current_thread()
        .build()
        .expect("a runtime without the time driver");
    let policy = Policy::default().wait_in_flight(Duration::from_millis(200));
    let idem = Idempotency::with_policy(MemoryStore::new(), policy).expect("policy");
    let request = idem
        .request("acct", "POST", "/charges")
        .key(Some("guard-wait"))
        .body(b"{}")
        .build()
        .expect("valid");
    let duplicate = catch_unwind(AssertUnwindSafe(|| {
        rt.block_on(async {
            let Begin::Acquired(_lease) = idem.begin(&request).await? else {
                panic!("a fresh key is acquired");
            };
            idem.begin(&request).await
        })
    }));
    let Ok(answer) = duplicate else {
        panic!("a waiting duplicate panicked on a runtime without the time driver");
    };
    assert!(
        matches!(answer, Ok(Begin::Answered(Answer::InFlight { .. }))),
        "{answer:?}"
    );
}
