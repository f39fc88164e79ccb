//! `idem`: inspect and maintain idem's idempotency records from a shell.
//!
//! ```text
//! idem --url sqlite://idem.db migrate
//! idem --url postgres://app@db/app inspect acct_42 "POST /v1/charges" 5f1c…
//! idem --url redis://127.0.0.1:6379 pending --older-than 5m --json
//! idem --url postgres://app@db/app purge --all
//! idem --url sqlite://idem.db stats --watch 5
//! idem --url sqlite://idem.db inspect 5f1c…
//! idem --url postgres://app@db/app doubt list --due
//! idem --url postgres://app@db/app doubt show acct_42 "POST /v1/charges" 5f1c…
//! idem --url postgres://app@db/app doubt settle acct_42 "POST /v1/charges" 5f1c… \
//!     --status 201 --body-file charge.json --header 'Content-Type: application/json' \
//!     --reason "captured as ch_1 in the provider's dashboard"
//! idem --url postgres://app@db/app doubt release acct_42 "POST /v1/charges" 5f1c… \
//!     --reason "no authorization under this key in the provider's dashboard"
//! ```
//!
//! Exit status: 0 done (a watch stopped by Ctrl-C too), 1 the store failed or refused, 2 a
//! mistake on the command line, 3 `inspect` found no record (`doubt show`: neither record nor
//! audit trail; `doubt settle`, `doubt release`: no record in doubt), 4 `doubt settle` or
//! `doubt release` found the record changed since it read it (someone else decided first;
//! nothing written).
//!
//! Every command only reads (a SQLite file is neither created nor migrated except by
//! `migrate`), except `migrate` (the schema), `purge` (expired records) and `doubt settle` and
//! `doubt release`, the only commands that change a live record: each decides one record in
//! doubt through the library's one fenced path (`idem_ops::reconcile::resolve`), which writes the
//! decision and its audit entry together, or nothing if the record changed meanwhile. A stored
//! body is printed only with `inspect --body`. docs/operations.md shows the commands at work.

mod alive;
mod cli;
mod commands;
mod doubt;
mod failure;
mod io;
mod outbox;
mod render;
mod route;
mod store_call;
mod target;

use clap::Parser;
use failure::Failure;
use io::Io;
use std::error::Error as _;
use std::io::IsTerminal;
use std::process::ExitCode;

/// An error with its causes, each said once.
pub fn describe(error: &idem_core::Error) -> String {
    let mut message = error.to_string();
    let mut source = error.source();
    while let Some(cause) = source {
        // Backends often repeat their cause in their own message: say it once.
        let cause_text = cause.to_string();
        if !message.contains(&cause_text) {
            message.push_str(&format!(": {cause_text}"));
        }
        source = cause.source();
    }
    message
}

fn main() -> ExitCode {
    let cli = cli::Cli::parse();
    let json = cli.json;
    let runtime = match tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
    {
        Ok(runtime) => runtime,
        Err(error) => {
            eprintln!("idem: cannot start: {error}");
            return ExitCode::FAILURE;
        }
    };
    let terminal = std::io::stdout().is_terminal();
    let (mut out, mut err) = (std::io::stdout().lock(), std::io::stderr());
    let mut io = Io {
        out: &mut out,
        err: &mut err,
        json,
        terminal,
    };
    match runtime.block_on(commands::run(cli, &mut io)) {
        Ok(()) => ExitCode::SUCCESS,
        Err(Failure::NotFound) => ExitCode::from(3),
        Err(Failure::Contested) => ExitCode::from(4),
        Err(Failure::Usage(why)) => {
            eprintln!("idem: {why}");
            ExitCode::from(2)
        }
        Err(Failure::Idem(error)) => {
            eprintln!("idem: {}", describe(&error));
            ExitCode::FAILURE
        }
        Err(Failure::Output(error)) => {
            // A reader that went away (`| head`) needs no message.
            if error.kind() != std::io::ErrorKind::BrokenPipe {
                eprintln!("idem: cannot write the output: {error}");
            }
            ExitCode::FAILURE
        }
    }
}
