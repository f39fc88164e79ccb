//! Property test of the state machine: random interleavings of begin, complete, release,
//! renew, purge and clock advances on `MemoryStore`, checked step by step against a simple
//! model written independently of `idem_core::decide`.

use idem_core::store::Deadline;
use idem_core::store::Reservation;
use idem_core::EventKind;
use idem_core::{
    Answer, Begin, Error, Fingerprint, Idempotency, IdempotencyKey, Lease, ManualClock,
    MemoryStore, Policy, RecordId, Request, Scope, Store, StoredResponse, Timestamp,
};
use proptest::prelude::*;
use std::collections::HashMap;
use std::time::Duration;

const LEASE: u64 = 500;
const RETENTION: u64 = 2_000;
const KEYS: usize = 3;

#[derive(Debug, Clone)]
enum Op {
    Begin { key: usize, body: u8 },
    Complete { handle: usize },
    Release { handle: usize },
    Renew { handle: usize },
    Advance { ms: u64 },
    PurgeAll,
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        4 => (0..KEYS, 0..2u8).prop_map(|(key, body)| Op::Begin { key, body }),
        3 => any::<usize>().prop_map(|handle| Op::Complete { handle }),
        1 => any::<usize>().prop_map(|handle| Op::Release { handle }),
        1 => any::<usize>().prop_map(|handle| Op::Renew { handle }),
        3 => prop_oneof![0..1_200u64, Just(1), Just(LEASE - 1), Just(LEASE), Just(RETENTION - LEASE), Just(RETENTION)]
            .prop_map(|ms| Op::Advance { ms }),
        1 => Just(Op::PurgeAll),
    ]
}

/// The model's view of one key.
#[derive(Debug, Clone, PartialEq)]
enum Slot {
    Running {
        body: u8,
        holder: usize,
        until: u64,
    },
    Done {
        body: u8,
        response: StoredResponse,
        until: u64,
    },
}

impl Slot {
    fn until(&self) -> u64 {
        match self {
            Slot::Running { until, .. } | Slot::Done { until, .. } => *until,
        }
    }
}

fn request(key: usize, body: u8) -> Request {
    let id = RecordId::new(
        Scope::new("prop", "POST /x").expect("scope"),
        IdempotencyKey::new(&format!("key-{key}")).expect("key"),
    );
    Request::from_parts(id, Fingerprint::builder().body(&[body]).finish(), 1)
}

fn run(ops: Vec<Op>) -> Result<(), TestCaseError> {
    let rt = tokio::runtime::Builder::new_current_thread()
        .build()
        .expect("runtime");
    rt.block_on(async move {
        let clock = ManualClock::new(Timestamp::from_millis(1_000_000));
        let idem = Idempotency::with_policy(
            MemoryStore::with_clock(clock.clone()),
            Policy::default()
                .lease(Duration::from_millis(LEASE))
                .retention(Duration::from_millis(RETENTION)),
        )
        .expect("policy");
        let store = idem.store();
        let mut now = 1_000_000u64;
        let mut model: HashMap<usize, Slot> = HashMap::new();
        // Every lease ever handed out, with its key; index = holder id.
        let mut handles: Vec<(usize, Lease)> = Vec::new();
        let mut effects: HashMap<usize, u32> = HashMap::new();
        let lease = Duration::from_millis(LEASE);

        for op in ops {
            match op {
                Op::Begin { key, body } => {
                    let req = request(key, body);
                    let got = Reservation::new(&req, lease)
                        .run(&mut (&store, Deadline::default()))
                        .await
                        .expect("reserve");
                    let live = model.get(&key).filter(|slot| now < slot.until()).cloned();
                    match (live, got) {
                        (None, Begin::Acquired(l)) => {
                            let expected_kind = match model.get(&key) {
                                None => "fresh",
                                Some(Slot::Running { .. }) => "takeover",
                                Some(Slot::Done { .. }) => "startover",
                            };
                            let kind = match l.acquired().kind() {
                                EventKind::TakenOver => "takeover",
                                EventKind::StartedOver => "startover",
                                _ => "fresh",
                            };
                            prop_assert_eq!(kind, expected_kind);
                            prop_assert_eq!(l.lease_until().as_millis(), now + LEASE);
                            model.insert(
                                key,
                                Slot::Running {
                                    body,
                                    holder: handles.len(),
                                    until: now + LEASE,
                                },
                            );
                            handles.push((key, l));
                        }
                        (Some(slot), got) => {
                            let slot_body = match &slot {
                                Slot::Running { body, .. } | Slot::Done { body, .. } => *body,
                            };
                            let expected = if slot_body != body {
                                Answer::Mismatch
                            } else {
                                match slot {
                                    Slot::Running { until, .. } => Answer::InFlight {
                                        retry_after: Duration::from_millis(until - now),
                                    },
                                    Slot::Done { response, .. } => Answer::Replay(response),
                                }
                            };
                            prop_assert_eq!(got, Begin::Answered(expected));
                        }
                        (None, got) => prop_assert!(false, "expected to acquire, got {:?}", got),
                    }
                }
                Op::Complete { handle } | Op::Release { handle } | Op::Renew { handle }
                    if handles.is_empty() =>
                {
                    let _ = handle;
                }
                Op::Complete { handle } => {
                    let holder = handle % handles.len();
                    let (key, l) = handles[holder].clone();
                    let response = StoredResponse::new(200, format!("holder {holder}"));
                    let got = store
                        .complete(&idem.completion(&l, response.clone()), Deadline::default())
                        .await;
                    match model.get(&key) {
                        Some(Slot::Running {
                            holder: h, body, ..
                        }) if *h == holder => {
                            prop_assert!(got.is_ok(), "{:?}", got);
                            let body = *body;
                            model.insert(
                                key,
                                Slot::Done {
                                    body,
                                    response,
                                    until: now + RETENTION,
                                },
                            );
                            *effects.entry(holder).or_default() += 1;
                        }
                        _ => prop_assert!(matches!(got, Err(Error::LeaseLost)), "{:?}", got),
                    }
                }
                Op::Release { handle } => {
                    let holder = handle % handles.len();
                    let (key, l) = handles[holder].clone();
                    let got = store.release(&l, Deadline::default()).await;
                    match model.get(&key) {
                        Some(Slot::Running { holder: h, .. }) if *h == holder => {
                            prop_assert!(got.is_ok());
                            model.remove(&key);
                        }
                        _ => prop_assert!(matches!(got, Err(Error::LeaseLost))),
                    }
                }
                Op::Renew { handle } => {
                    let holder = handle % handles.len();
                    let (key, l) = handles[holder].clone();
                    let got = store.renew(&l, lease, Deadline::default()).await;
                    match model.get_mut(&key) {
                        Some(Slot::Running {
                            holder: h, until, ..
                        }) if *h == holder => {
                            prop_assert_eq!(got.expect("renew").as_millis(), now + LEASE);
                            *until = now + LEASE;
                        }
                        _ => prop_assert!(matches!(got, Err(Error::LeaseLost))),
                    }
                }
                Op::Advance { ms } => {
                    clock.advance(Duration::from_millis(ms));
                    now += ms;
                }
                Op::PurgeAll => {
                    let expired: Vec<usize> = model
                        .iter()
                        .filter(|(_, s)| s.until() <= now)
                        .map(|(k, _)| *k)
                        .collect();
                    let purged = store
                        .purge_expired(usize::MAX, Deadline::default())
                        .await
                        .expect("purge");
                    prop_assert_eq!(purged, expired.len());
                    for key in expired {
                        model.remove(&key);
                    }
                }
            }
            // At most one effect per lease epoch (holder), ever.
            prop_assert!(effects.values().all(|&n| n <= 1));
            prop_assert_eq!(store.len(), model.len());
        }
        Ok(())
    })
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(512))]
    #[test]
    fn state_machine_matches_the_model(ops in proptest::collection::vec(op(), 1..60)) {
        run(ops)?;
    }
}
