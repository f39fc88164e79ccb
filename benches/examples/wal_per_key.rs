//! WAL flushes and commits per fresh key on PostgreSQL, counted by the server (`pg_stat_wal`,
//! `pg_stat_database`): the hand-written two-commit floor, `run_in_transaction` (two commits)
//! and one-commit `run_in_transaction` (one, C15), `n` fresh keys each, one caller (docs/benchmarks.md,
//! "One commit per fresh key").
//!
//! ```text
//! # against a server with fsync on (IDEM_PG_DURABLE=1 bash -c '. scripts/services.sh; ...'),
//! # IDEM_PG_URL set, nothing else using it:
//! cargo run --release -p idem-benches --example wal_per_key -- 1000
//! ```
//!
//! Each side runs in a child process of its own, so that every statistic its connections hold
//! reaches the server when they close; the parent reads the counters before (once the child's
//! set-up is idle and flushed) and after. A count that a busy server shares with other work is
//! not one of this side: run it alone.

use idem::postgres::sqlx::{self, Connection, PgConnection};
use idem_benches::harness::Path;
use idem_benches::stores::{self, server_url};
use std::io::{BufRead, BufReader, Write};
use std::process::{Command, ExitCode, Stdio};
use std::time::{Duration, Instant};

/// Long enough for an idle backend to flush its pending statistics (PostgreSQL does so within
/// 10 s of going idle).
const SETTLE: Duration = Duration::from_secs(11);

const SIDES: [&str; 3] = ["floor", "two_commits", "one_commit"];

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
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
    match args.as_slice() {
        [child, side, n] if child == "--child" => match n.parse() {
            Ok(n) => runtime.block_on(child_side(side, n)),
            Err(_) => usage(),
        },
        [n] => match n.parse() {
            Ok(n) => runtime.block_on(parent(n)),
            Err(_) => usage(),
        },
        _ => usage(),
    }
}

fn usage() -> ExitCode {
    eprintln!("usage: wal_per_key <n>");
    ExitCode::FAILURE
}

/// The server's counters: WAL syncs, WAL writes, WAL records, committed transactions.
#[derive(Debug, Clone, Copy)]
struct Counters {
    wal_sync: i64,
    wal_write: i64,
    wal_records: i64,
    commits: i64,
}

async fn counters() -> Result<Counters, sqlx::Error> {
    let mut conn = PgConnection::connect(&server_url("IDEM_PG_URL")).await?;
    let (wal_sync, wal_write, wal_records): (i64, i64, i64) =
        sqlx::query_as("SELECT wal_sync, wal_write, wal_records FROM pg_stat_wal")
            .fetch_one(&mut conn)
            .await?;
    let (commits,): (i64,) = sqlx::query_as(
        "SELECT xact_commit FROM pg_stat_database WHERE datname = current_database()",
    )
    .fetch_one(&mut conn)
    .await?;
    conn.close().await?;
    Ok(Counters {
        wal_sync,
        wal_write,
        wal_records,
        commits,
    })
}

async fn parent(n: u32) -> ExitCode {
    let Ok(exe) = std::env::current_exe() else {
        eprintln!("no executable path");
        return ExitCode::FAILURE;
    };
    println!("| side | fresh keys | WAL syncs / key | WAL writes / key | WAL records / key | commits / key | µs / key |");
    println!("|---|---|---|---|---|---|---|");
    for side in SIDES {
        let spawned = Command::new(&exe)
            .args(["--child", side, &n.to_string()])
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .spawn();
        let Ok(mut child) = spawned else {
            eprintln!("cannot start the {side} side");
            return ExitCode::FAILURE;
        };
        let (Some(mut stdin), Some(stdout)) = (child.stdin.take(), child.stdout.take()) else {
            eprintln!("no pipes to the {side} side");
            return ExitCode::FAILURE;
        };
        let mut lines = BufReader::new(stdout).lines();
        let ready = lines.next().and_then(Result::ok);
        if ready.as_deref() != Some("READY") {
            eprintln!("the {side} side did not set up: {ready:?}");
            return ExitCode::FAILURE;
        }
        tokio::time::sleep(SETTLE).await;
        let Ok(before) = counters().await else {
            eprintln!("cannot read the server's counters");
            return ExitCode::FAILURE;
        };
        let _ = writeln!(stdin, "GO");
        let took: Option<f64> = lines
            .next()
            .and_then(Result::ok)
            .and_then(|line| line.parse().ok());
        let exited = child.wait();
        if !exited.is_ok_and(|status| status.success()) {
            eprintln!("the {side} side failed");
            return ExitCode::FAILURE;
        }
        // Its connections are closed: what they counted is flushed.
        tokio::time::sleep(Duration::from_secs(1)).await;
        let Ok(after) = counters().await else {
            eprintln!("cannot read the server's counters");
            return ExitCode::FAILURE;
        };
        let per = |a: i64, b: i64| (a - b) as f64 / f64::from(n);
        println!(
            "| {side} | {n} | {:.2} | {:.2} | {:.2} | {:.2} | {:.0} |",
            per(after.wal_sync, before.wal_sync),
            per(after.wal_write, before.wal_write),
            per(after.wal_records, before.wal_records),
            per(after.commits, before.commits),
            took.unwrap_or(f64::NAN) / f64::from(n),
        );
    }
    ExitCode::SUCCESS
}

/// One side: set up, say READY, wait for GO, run `n` fresh keys one after the other, print the
/// microseconds they took, exit (closing the connections).
async fn child_side(side: &str, n: u32) -> ExitCode {
    let subject = stores::postgres().await;
    let op = match side {
        "floor" => subject.sides[2].op(Path::Fresh, 100).await,
        "two_commits" => match &subject.in_transaction {
            Some(transacting) => transacting.op(Path::Fresh, 100).await,
            None => return ExitCode::FAILURE,
        },
        "one_commit" => match &subject.one_commit {
            Some(transacting) => transacting.op(Path::Fresh, 100).await,
            None => return ExitCode::FAILURE,
        },
        other => {
            eprintln!("no side {other:?}");
            return ExitCode::FAILURE;
        }
    };
    println!("READY");
    let mut go = String::new();
    if std::io::stdin().read_line(&mut go).is_err() {
        return ExitCode::FAILURE;
    }
    let started = Instant::now();
    for _ in 0..n {
        op().await;
    }
    println!("{}", started.elapsed().as_micros());
    drop(op);
    drop(subject);
    // Closed connections: their statistics go to the server now.
    tokio::time::sleep(Duration::from_millis(300)).await;
    ExitCode::SUCCESS
}
