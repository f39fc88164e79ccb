//! The command line: what `idem` accepts, as clap reads it.

use clap::{Args, Parser, Subcommand};
use std::time::Duration;

/// Inspect and maintain idem's idempotency records in SQLite, PostgreSQL or Redis.
///
/// Every command only reads, except: `migrate` (the schema), `purge` (expired records),
/// `doubt settle` and `doubt release`, the only ones that change a live record (a record in
/// doubt, through the library's fenced path, leaving an audit entry), and `outbox retry`,
/// `outbox replay` and `outbox purge` (the outbox's deliveries; no command creates the
/// outbox's tables: a database without them is a usage error). A stored body is printed only with
/// `inspect --body`.
#[derive(Debug, Parser)]
#[command(name = "idem", version, about, long_about = None)]
pub(crate) struct Cli {
    /// Where the records are: sqlite://PATH (sqlite:///abs/path), postgres://…, redis://… or
    /// redis+cluster://host:port,host:port
    #[arg(long, env = "IDEM_URL", global = true, hide_env_values = true)]
    pub url: Option<String>,

    /// The records table (SQLite, PostgreSQL; default idem_records).
    #[arg(long, global = true)]
    pub table: Option<String>,

    /// The PostgreSQL schema of the table (default public).
    #[arg(long, global = true)]
    pub schema: Option<String>,

    /// The Redis key prefix (default idem).
    #[arg(long, global = true)]
    pub prefix: Option<String>,

    /// One JSON document on stdout instead of a table, for scripts.
    #[arg(long, global = true)]
    pub json: bool,

    /// The most seconds each call to the store may take (opening it included) before the
    /// command reports the store as not answering; a watch prints that and tries again.
    #[arg(long, global = true, default_value_t = 10, value_parser = clap::value_parser!(u64).range(1..=3600))]
    pub timeout: u64,

    /// The most seconds `inspect KEY` spends looking through a store that finds a key by
    /// scanning (Redis) before it shows what it found so far.
    #[arg(long, global = true, default_value_t = 30, value_parser = clap::value_parser!(u64).range(1..=3600))]
    pub scan_budget: u64,

    /// What to do.
    #[command(subcommand)]
    pub command: Command,
}

/// The commands.
#[derive(Debug, Subcommand)]
pub(crate) enum Command {
    /// Apply the schema (SQLite, PostgreSQL), or print it with --print.
    Migrate {
        /// Print the SQL instead of applying it; touches nothing.
        #[arg(long)]
        print: bool,
    },
    /// Show one record: state, deadline, when it was reserved and completed, who holds it,
    /// stored status and headers (the body with --body). With the key alone, every record of
    /// that key under any consumer and route (at most 50). Exits 3 when there is no record.
    Inspect {
        /// The consumer (the authenticated caller the key belongs to); or, given alone, the
        /// idempotency key.
        #[arg(value_name = "CONSUMER|KEY")]
        consumer_or_key: String,
        /// The route, as the application names it (the template, for example
        /// "POST /v1/customers/{id}/refunds").
        route: Option<String>,
        /// The idempotency key.
        #[arg(requires = "route")]
        key: Option<String>,
        /// Also print the stored body.
        #[arg(long)]
        body: bool,
    },
    /// List in-progress records reserved at least --older-than ago: orphans a crash left,
    /// handlers that hang.
    Pending {
        /// The least age listed (30s, 5m, 1h...).
        #[arg(long, default_value = "5m", value_parser = parse_duration)]
        older_than: Duration,
        #[command(flatten)]
        page: PageArgs,
        #[command(flatten)]
        watch: WatchArgs,
    },
    /// List a consumer's live completed records with their status.
    Completed {
        /// Whose records.
        consumer: String,
        /// Only this route.
        #[arg(long)]
        route: Option<String>,
        #[command(flatten)]
        page: PageArgs,
    },
    /// Delete expired records in bounded batches: one batch, or --all until none is left.
    Purge {
        /// Records deleted per batch.
        #[arg(long, default_value_t = 1000, value_parser = clap::value_parser!(u32).range(1..=100_000))]
        batch: u32,
        /// Repeat until a batch finds fewer than --batch expired records.
        #[arg(long)]
        all: bool,
    },
    /// Count the records by state, records in doubt among them (reads every record).
    Stats {
        #[command(flatten)]
        watch: WatchArgs,
    },
    /// Records in doubt: completed with an answer whose outcome is unknown (the provider timed
    /// out after the request was sent), replayed to every retry until someone finds out what
    /// happened. List and show them (reads), or settle or release one (writes: the only
    /// commands besides purge and migrate that change a record).
    Doubt {
        /// What to do with them.
        #[command(subcommand)]
        command: DoubtCommand,
    },
    /// The outbox's deliveries (SQLite, PostgreSQL): count, list, inspect a message's
    /// attempts (reads), retry a dead message or replay one, purge old ones (writes).
    Outbox {
        /// What to do.
        #[command(subcommand)]
        command: OutboxCommand,
    },
}

/// The `outbox` commands.
#[derive(Debug, Subcommand)]
pub(crate) enum OutboxCommand {
    /// Count pending (due now), delayed (due later or being attempted) and dead deliveries,
    /// and the age of the oldest pending one.
    Counts,
    /// List deliveries in one state, oldest first.
    List {
        /// pending, delivered or dead.
        #[arg(long, default_value = "dead")]
        state: String,
        /// The most listed.
        #[arg(long, default_value_t = 50)]
        limit: usize,
    },
    /// Show a message's deliveries and every recorded attempt. Exits 3 when there is none.
    Inspect {
        /// The message id (msg_...), its webhook-id.
        message_id: String,
    },
    /// Attempt a message's dead deliveries again, at once, with a fresh schedule and the same
    /// id. Exits 3 when none was dead.
    Retry {
        /// The message id (msg_...).
        message_id: String,
    },
    /// Attempt every delivery of a message again (delivered ones included) with the same id:
    /// receivers deduplicate on it. Exits 3 when none could be.
    Replay {
        /// The message id (msg_...).
        message_id: String,
    },
    /// Delete delivered deliveries older than --delivered-for and dead ones older than
    /// --dead-for, with their attempts, in batches until none is left.
    Purge {
        /// How long delivered ones are kept.
        #[arg(long, default_value = "7days", value_parser = parse_duration)]
        delivered_for: Duration,
        /// How long dead ones are kept.
        #[arg(long, default_value = "30days", value_parser = parse_duration)]
        dead_for: Duration,
        /// Deliveries deleted per batch.
        #[arg(long, default_value_t = 1000, value_parser = clap::value_parser!(u32).range(1..=100_000))]
        batch: u32,
    },
}

/// The `doubt` commands.
#[derive(Debug, Subcommand)]
pub(crate) enum DoubtCommand {
    /// List the live records in doubt, oldest first: the answer replayed meanwhile, why it is
    /// in doubt, how many checks found it still unknown, when it is next due and when it
    /// expires. Reads only.
    List {
        /// Only those whose next check time has come (what a reconciler works on).
        #[arg(long)]
        due: bool,
        #[command(flatten)]
        page: PageArgs,
    },
    /// Show one record in doubt (its answer, cause, note, attempts, next check, the key the
    /// handler sent downstream) and its whole audit trail. A record no longer in doubt (settled,
    /// released) still shows its trail. Reads only; exits 3 when there is neither record nor
    /// trail.
    Show {
        #[command(flatten)]
        record: RecordArgs,
    },
    /// The effect happened (you checked the provider): store its real answer in place of the
    /// one in doubt. Every retry replays it from now on, for --retention. Writes the record and
    /// an audit entry; exits 3 when the record is not in doubt, 4 when it changed since it was
    /// read (someone else decided first: nothing written).
    Settle {
        #[command(flatten)]
        record: RecordArgs,
        /// The real answer's status (100..=599).
        #[arg(long, value_parser = clap::value_parser!(u16).range(100..=599))]
        status: u16,
        /// The real answer's body, as text (default: empty).
        #[arg(long, conflicts_with = "body_file")]
        body: Option<String>,
        /// The real answer's body, read from a file (`-` reads stdin).
        #[arg(long, value_name = "PATH")]
        body_file: Option<std::path::PathBuf>,
        /// A header of the real answer, `Name: value`; repeat for more. A header that is never
        /// stored (Set-Cookie, rate limits...) is refused. Replays carry the headers that give
        /// the body its meaning (Content-Type, Content-Encoding, Location...) and those the
        /// application's policy stores (`Policy::stored_headers`); any other is kept but not
        /// replayed.
        #[arg(long = "header", value_name = "NAME: VALUE")]
        headers: Vec<String>,
        /// How long the settled answer is replayed, from now (the library's default
        /// retention is 24h); never less than the record had left.
        #[arg(long, default_value = "24h", value_parser = parse_duration)]
        retention: Duration,
        #[command(flatten)]
        decision: DecisionArgs,
    },
    /// The effect did not happen (you checked the provider): delete the record, so that the
    /// next retry with this key executes. Writes (and an audit entry); exits 3 when the record
    /// is not in doubt, 4 when it changed since it was read (nothing written).
    Release {
        #[command(flatten)]
        record: RecordArgs,
        #[command(flatten)]
        decision: DecisionArgs,
    },
}

/// One record, by its (consumer, route, key).
#[derive(Debug, Args)]
pub(crate) struct RecordArgs {
    /// The consumer (the authenticated caller the key belongs to).
    pub consumer: String,
    /// The route, as the application names it (the template).
    pub route: String,
    /// The idempotency key.
    pub key: String,
}

/// What goes into the audit trail with a decision.
#[derive(Debug, Args)]
pub(crate) struct DecisionArgs {
    /// Why: what you found (kept in the audit trail as the answer). Required.
    #[arg(long)]
    pub reason: String,
    /// What you asked or looked at (kept in the audit trail).
    #[arg(long, default_value = "operator check")]
    pub asked: String,
    /// Who decides, for the audit trail (default `operator $USER`).
    #[arg(long)]
    pub by: Option<String>,
    /// How long the audit entry is kept (the library's default is 90 days).
    #[arg(long, default_value = "90days", value_parser = parse_duration)]
    pub audit_retention: Duration,
}

/// Refreshing a command's answer.
#[derive(Debug, Args)]
pub(crate) struct WatchArgs {
    /// Run again every SECS seconds until Ctrl-C (the screen is cleared between runs only on a
    /// terminal; a store error is printed and the next run tries again).
    #[arg(long, value_name = "SECS", value_parser = clap::value_parser!(u64).range(1..=86_400))]
    pub watch: Option<u64>,
}

/// Paging of a listing.
#[derive(Debug, Args)]
pub(crate) struct PageArgs {
    /// Records per page (1..=1000).
    #[arg(long, default_value_t = 100, value_parser = clap::value_parser!(u16).range(1..=1000))]
    pub limit: u16,
    /// Resume after this cursor (printed by the previous page).
    #[arg(long)]
    pub after: Option<String>,
    /// Follow every page to the end.
    #[arg(long, conflicts_with = "after")]
    pub all: bool,
}

fn parse_duration(text: &str) -> Result<Duration, String> {
    humantime::parse_duration(text).map_err(|e| format!("{e} (write 30s, 5m, 1h, 250ms...)"))
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::CommandFactory;

    #[test]
    fn the_command_line_is_consistent() {
        Cli::command().debug_assert();
    }

    #[test]
    fn durations_read_as_people_write_them() {
        assert_eq!(parse_duration("5m"), Ok(Duration::from_secs(300)));
        assert_eq!(parse_duration("250ms"), Ok(Duration::from_millis(250)));
        assert_eq!(parse_duration("1h 30m"), Ok(Duration::from_secs(5400)));
        assert!(parse_duration("soon").is_err());
    }
}
