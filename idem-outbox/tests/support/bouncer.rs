//! A PgBouncer of the test's own, in transaction mode, in front of one database of the
//! PostgreSQL server: what it carries (prepared statements, `LISTEN`) stays on its own server
//! connections, never on those of the shared `IDEM_PGBOUNCER_URL`. A missing `pgbouncer`
//! binary is a failure, never a skip.

use std::process::Stdio;
use std::time::{Duration, Instant};

use tokio::process::{Child, Command};

/// A running PgBouncer; dropping it stops it.
pub struct PrivateBouncer {
    _child: Child,
    dir: std::path::PathBuf,
    url: String,
}

impl PrivateBouncer {
    /// A PgBouncer in transaction mode with at most `server_connections`, in front of the
    /// database of `database_url`.
    pub async fn start(database_url: &str, server_connections: u32) -> PrivateBouncer {
        let (head, database) = database_url
            .rsplit_once('/')
            .expect("a database in the URL");
        let (user, server) = head.rsplit_once('@').expect("a server in the URL");
        let user = user.rsplit_once("://").map_or(user, |(_, user)| user);
        let (host, port) = server.rsplit_once(':').unwrap_or((server, "5432"));
        let listen_port = std::net::TcpListener::bind("127.0.0.1:0")
            .and_then(|l| l.local_addr())
            .expect("a free port")
            .port();
        let dir = std::env::temp_dir().join(format!(
            "idem-outbox-bouncer-{}",
            idem_outbox::MessageId::generate()
        ));
        std::fs::create_dir_all(&dir).expect("a directory");
        let users = dir.join("users.txt");
        std::fs::write(&users, format!("\"{user}\" \"\"\n")).expect("the user list");
        let ini = dir.join("pgbouncer.ini");
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
        .expect("the configuration");
        let mut command = Command::new("pgbouncer");
        // PgBouncer refuses to run as root.
        let id = Command::new("id").arg("-u").output().await.expect("id -u");
        if String::from_utf8_lossy(&id.stdout).trim() == "0" {
            command.args(["-u", "nobody"]);
        }
        let child = command
            .arg(&ini)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .kill_on_drop(true)
            .spawn()
            .expect("pgbouncer (scripts/services.sh installs it)");
        let until = Instant::now() + Duration::from_secs(10);
        while tokio::net::TcpStream::connect(("127.0.0.1", listen_port))
            .await
            .is_err()
        {
            assert!(Instant::now() < until, "pgbouncer did not start listening");
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        PrivateBouncer {
            _child: child,
            dir,
            url: format!("postgres://{user}@127.0.0.1:{listen_port}/{database}"),
        }
    }

    /// Where clients connect.
    pub fn url(&self) -> &str {
        &self.url
    }
}

impl Drop for PrivateBouncer {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}
