//! `payments-grpc`: serves `payments.v1.Charges` on SQLite or PostgreSQL (`--database`).
//! Prints `listening on http://ADDR` on stdout once it listens (`--addr 127.0.0.1:0` picks a
//! free port).

use clap::Parser;
use idem::Policy;
use payments_grpc::db::{Backend, Postgres, Sqlite};
use std::io::{IsTerminal, Write};
use std::net::SocketAddr;
use std::process::ExitCode;
use std::time::Duration;

/// A gRPC charges service made idempotent by idem.
#[derive(Debug, Parser)]
#[command(name = "payments-grpc", version)]
struct Settings {
    /// Where to listen (port 0: a free one).
    #[arg(long, env = "PAYMENTS_GRPC_ADDR", default_value = "127.0.0.1:50051")]
    addr: SocketAddr,
    /// Where charges and idempotency records live: a SQLite file, or a `postgres://` URL.
    #[arg(
        long,
        env = "PAYMENTS_GRPC_DATABASE",
        default_value = "payments-grpc.db"
    )]
    database: String,
    /// How long a reservation holds before another attempt may take it over, in milliseconds.
    #[arg(long, env = "PAYMENTS_GRPC_LEASE_MS", default_value_t = 60_000)]
    lease_ms: u64,
    /// Honour the `x-test-delay-ms` metadata entry (a slow handler). Never in production.
    #[arg(long, env = "IDEM_TEST_HOOKS")]
    test_hooks: bool,
}

type BoxError = Box<dyn std::error::Error + Send + Sync>;

#[tokio::main]
async fn main() -> ExitCode {
    tracing_subscriber::fmt()
        .with_writer(std::io::stderr)
        .with_ansi(std::io::stderr().is_terminal())
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env()
                .unwrap_or_else(|_| "info,idem=warn,idem_tower=warn".into()),
        )
        .init();
    let settings = Settings::parse();
    match run(settings).await {
        Ok(()) => ExitCode::SUCCESS,
        Err(error) => {
            tracing::error!(%error, "payments-grpc stopped");
            ExitCode::FAILURE
        }
    }
}

async fn run(settings: Settings) -> Result<(), BoxError> {
    if settings.test_hooks {
        tracing::warn!("TEST HOOKS ARE ON (x-test-delay-ms). Never in production.");
    }
    let policy = Policy::default().lease(Duration::from_millis(settings.lease_ms));
    let database = settings.database.clone();
    if database.starts_with("postgres://") || database.starts_with("postgresql://") {
        let backend = Postgres::connect(&database, policy).await?;
        serve(backend, &settings, "PostgreSQL").await
    } else {
        let backend = Sqlite::open(&database, policy).await?;
        serve(backend, &settings, "SQLite").await
    }
}

async fn serve<B: Backend>(backend: B, settings: &Settings, kind: &str) -> Result<(), BoxError> {
    let listener = tokio::net::TcpListener::bind(settings.addr).await?;
    let addr = listener.local_addr()?;
    // The one line on stdout: where to reach the server (scripts and tests read it).
    println!("listening on http://{addr}");
    std::io::stdout().flush()?;
    tracing::info!(%addr, database = kind, "listening");
    payments_grpc::app::serve(backend, listener, settings.test_hooks, async {
        let _ = tokio::signal::ctrl_c().await;
    })
    .await?;
    tracing::info!("stopped");
    Ok(())
}
