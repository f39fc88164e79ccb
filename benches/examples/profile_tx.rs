//! The money path called `n` times in a row, for counting instructions with callgrind: a count
//! that a shared, noisy machine does not change (docs/benchmarks.md, "Instructions per call").
//!
//! `profile_tx <side> <path> <n>`, the side one of `library`, `one_commit`, `guard`,
//! `reserve_first`, `raw`, `floor`, `floor_one_commit`, the path one of `replay`, `fresh`,
//! `in_flight`, `mismatch`; with `STORE=sqlite` (the default), `STORE=postgres` (then
//! `IDEM_PG_URL`, as `scripts/services.sh` sets it), `STORE=redis` (`IDEM_REDIS_URL`; its
//! `guard` is the engine's `begin` and `complete`) or `STORE=memory` (the engine's own cost:
//! `guard` only); `CALLERS=c` shares the calls among `c` tasks (one by default). `library` is
//! `run_in_transaction`, `one_commit` the same in one commit (C15), `guard` the guard style
//! (`begin`, the effect and `complete_in` in the caller's transaction), `reserve_first` the
//! guard style with the store's `read_first(false)`, `raw` the hand-written baseline of the
//! same path, `floor` the hand-written baseline of the fewest round trips, `floor_one_commit`
//! the floor's fresh key in one transaction (PostgreSQL). Instructions per
//! call are the difference of two runs (say `n` = 500 and 1500) divided by the difference of
//! their `n`, so that the set-up cancels out:
//!
//! ```text
//! cargo build --release -p idem-benches --example profile_tx
//! for n in 500 1500; do
//!   valgrind --tool=callgrind --callgrind-out-file=/dev/null \
//!     target/release/examples/profile_tx library replay $n 2>&1 | grep Collected
//! done
//! ```

use idem_benches::harness::Path;
use idem_benches::stores;
use std::process::ExitCode;

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let [side, path, n] = args.as_slice() else {
        eprintln!(
            "usage: profile_tx <library|one_commit|guard|reserve_first|raw|floor|floor_one_commit> \
             <replay|fresh|in_flight|mismatch> <n>"
        );
        return ExitCode::FAILURE;
    };
    let path = match path.as_str() {
        "replay" => Path::Replay,
        "fresh" => Path::Fresh,
        "in_flight" => Path::InFlight,
        "mismatch" => Path::Mismatch,
        other => {
            eprintln!("a path is `replay`, `fresh`, `in_flight` or `mismatch`, not {other:?}");
            return ExitCode::FAILURE;
        }
    };
    let Ok(n) = n.parse::<usize>() else {
        eprintln!("n is a number of calls, not {n:?}");
        return ExitCode::FAILURE;
    };
    let side = match side.as_str() {
        "library" => Side::Transaction,
        "guard" => Side::Guard,
        "reserve_first" => Side::ReserveFirst,
        "one_commit" => Side::OneCommit,
        "raw" => Side::Raw,
        "floor" => Side::Floor,
        "floor_one_commit" => Side::FloorOneCommit,
        other => {
            eprintln!(
                "a side is `library`, `one_commit`, `guard`, `reserve_first`, `raw`, `floor` or \
                 `floor_one_commit`, \
                 not {other:?}"
            );
            return ExitCode::FAILURE;
        }
    };
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
    {
        Ok(runtime) => runtime,
        Err(error) => {
            eprintln!("no runtime: {error}");
            return ExitCode::FAILURE;
        }
    };
    runtime.block_on(async {
        let subject = match std::env::var("STORE").as_deref() {
            Ok("postgres") => stores::postgres().await,
            Ok("redis") => stores::redis().await,
            Ok("memory") => stores::memory().await,
            _ => stores::sqlite().await,
        };
        let transacting = match side {
            Side::OneCommit => &subject.one_commit,
            _ => &subject.in_transaction,
        };
        let op = match (side, transacting, subject.sides.as_slice()) {
            (Side::Transaction | Side::OneCommit, Some(transacting), _) => {
                transacting.op(path, 100).await
            }
            (Side::Guard, _, [guard, ..]) => guard.op(path, 100).await,
            (Side::Raw, _, [_, raw, ..]) => raw.op(path, 100).await,
            (Side::Floor, _, [_, _, floor, ..]) => floor.op(path, 100).await,
            (Side::FloorOneCommit, _, _) => match &subject.one_commit_floor {
                Some(floor) => floor.op(path, 100).await,
                None => {
                    eprintln!("this store has no floor in one transaction");
                    return ExitCode::FAILURE;
                }
            },
            (Side::ReserveFirst, _, sides) => {
                match sides.iter().find(|s| s.name() == stores::RESERVE_FIRST) {
                    Some(side) => side.op(path, 100).await,
                    None => {
                        eprintln!("this store has no side that never reads first");
                        return ExitCode::FAILURE;
                    }
                }
            }
            _ => {
                eprintln!("this store has no such side");
                return ExitCode::FAILURE;
            }
        };
        // `CALLERS` concurrent tasks share the `n` calls: what a call costs under contention.
        let callers = std::env::var("CALLERS")
            .ok()
            .and_then(|c| c.parse::<usize>().ok())
            .unwrap_or(1)
            .max(1);
        if callers == 1 {
            for _ in 0..n {
                op().await;
            }
            return ExitCode::SUCCESS;
        }
        let tasks: Vec<_> = (0..callers)
            .map(|i| {
                let op = op.clone();
                let calls = n / callers + usize::from(i < n % callers);
                tokio::spawn(async move {
                    for _ in 0..calls {
                        op().await;
                    }
                })
            })
            .collect();
        for task in tasks {
            if task.await.is_err() {
                return ExitCode::FAILURE;
            }
        }
        ExitCode::SUCCESS
    })
}

/// Which code runs the path.
#[derive(Clone, Copy)]
enum Side {
    /// `run_in_transaction`.
    Transaction,
    /// One-commit `run_in_transaction` (C15).
    OneCommit,
    /// `begin`, then `complete_in` inside the caller's transaction.
    Guard,
    /// The guard style with the store's `read_first(false)`.
    ReserveFirst,
    /// The hand-written baseline.
    Raw,
    /// The hand-written baseline of the fewest round trips.
    Floor,
    /// That baseline's fresh key in one transaction.
    FloorOneCommit,
}
