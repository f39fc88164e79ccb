//! A PgBouncer of the test's own, in transaction mode like the one of `IDEM_PGBOUNCER_URL`, in
//! front of a database of the test's own: database-level defaults (a SERIALIZABLE default
//! isolation) can then be set without touching anything other tests share. A missing
//! `pgbouncer` binary is a failure, never a skip.

use super::pg_url;
use std::net::TcpListener;
use std::process::Stdio;
use std::time::{Duration, Instant};
use tokio::process::{Child, Command};

/// A running PgBouncer; dropping it stops it.
pub(crate) struct PrivateBouncer {
    _child: Child,
    _dir: TempDir,
    url: String,
}

impl PrivateBouncer {
    /// A PgBouncer in transaction mode, `server_connections` server connections at most, in
    /// front of `database` on the server of the PostgreSQL `server_url`.
    pub(crate) async fn start(server_url: &str, database: &str, server_connections: u32) -> Self {
        let authority = pg_url::authority(server_url);
        let (host, port) = authority.rsplit_once(':').unwrap_or((authority, "5432"));
        let user = server_url
            .split_once("://")
            .map_or("", |(_, rest)| rest)
            .split_once('@')
            .map_or("postgres", |(user, _)| {
                user.split(':').next().unwrap_or(user)
            })
            .to_owned();
        let listen_port = TcpListener::bind("127.0.0.1:0")
            .and_then(|l| l.local_addr())
            .expect("a free port")
            .port();
        let dir = TempDir::new();
        let users = dir.path.join("users.txt");
        std::fs::write(&users, format!("\"{user}\" \"\"\n")).expect("write the user list");
        let ini = dir.path.join("pgbouncer.ini");
        std::fs::write(
            &ini,
            format!(
                "[databases]\n{database} = host={host} port={port} dbname={database} user={user}\n\n\
                 [pgbouncer]\nlisten_addr = 127.0.0.1\nlisten_port = {listen_port}\n\
                 unix_socket_dir =\nauth_type = trust\nauth_file = {}\npool_mode = transaction\n\
                 default_pool_size = {server_connections}\nmax_client_conn = 200\n\
                 ignore_startup_parameters = extra_float_digits\n",
                users.display()
            ),
        )
        .expect("write the configuration");
        let mut command = Command::new("pgbouncer");
        // PgBouncer refuses to run as root; it may switch to another user.
        if running_as_root().await {
            command.args(["-u", "nobody"]);
        }
        let child = command
            .arg(&ini)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .kill_on_drop(true)
            .spawn()
            .expect("start pgbouncer (it must be installed: scripts/services.sh installs it)");
        let until = Instant::now() + Duration::from_secs(10);
        while tokio::net::TcpStream::connect(("127.0.0.1", listen_port))
            .await
            .is_err()
        {
            assert!(Instant::now() < until, "pgbouncer did not start listening");
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        Self {
            _child: child,
            _dir: dir,
            url: format!("postgres://{user}@127.0.0.1:{listen_port}/{database}"),
        }
    }

    /// Where clients connect.
    pub(crate) fn url(&self) -> &str {
        &self.url
    }
}

async fn running_as_root() -> bool {
    let id = Command::new("id").arg("-u").output().await.expect("id -u");
    String::from_utf8_lossy(&id.stdout).trim() == "0"
}

/// A directory of the test's own, readable by the user PgBouncer runs as, removed on drop.
struct TempDir {
    path: std::path::PathBuf,
}

impl TempDir {
    fn new() -> Self {
        let path = std::env::temp_dir().join(format!(
            "idem-bouncer-{}",
            idem_core::FencingToken::generate()
        ));
        std::fs::create_dir_all(&path).expect("a directory");
        Self { path }
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.path);
    }
}
