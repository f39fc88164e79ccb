//! A PostgreSQL primary and its synchronous standby of the test's own (C13): a commit the
//! primary acknowledged is on the standby, so a promotion loses none. Both on free loopback
//! ports, their files in a private temporary directory; dropping the pair stops both servers
//! (`pg_ctl stop -m immediate`) and removes the directory, a failing test's too. A missing
//! PostgreSQL installation is a failure, never a skip.

use idem_postgres::sqlx;
use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::time::{Duration, Instant};

/// A primary and a synchronous standby streaming from it.
pub(crate) struct PgPair {
    dir: PathBuf,
    bin: PathBuf,
    /// Whether commands run as the `postgres` user (we are root: initdb and postgres refuse it).
    as_postgres: bool,
    pub(crate) primary_port: u16,
    pub(crate) standby_port: u16,
}

impl PgPair {
    /// Starts the pair and waits until the standby is synchronous.
    pub(crate) async fn start() -> Self {
        tokio::task::spawn_blocking(|| Self::start_blocking(true))
            .await
            .expect("start the pair")
    }

    /// A primary and a standby streaming from it asynchronously (a commit returns before the
    /// standby has it); waits until it streams.
    pub(crate) async fn start_async() -> Self {
        tokio::task::spawn_blocking(|| Self::start_blocking(false))
            .await
            .expect("start the pair")
    }

    fn start_blocking(synchronous: bool) -> Self {
        let as_postgres = run_plain("id", &["-u"]).trim() == "0";
        let dir = std::env::temp_dir().join(format!(
            "idem-pg-pair-{}",
            idem_core::FencingToken::generate()
        ));
        std::fs::create_dir_all(&dir).expect("a directory");
        let pair = Self {
            dir,
            bin: pg_bin_dir(),
            as_postgres,
            primary_port: free_port(),
            standby_port: free_port(),
        };
        if as_postgres {
            run_plain("chmod", &["755", &pair.dir.display().to_string()]);
            run_plain("chown", &["postgres", &pair.dir.display().to_string()]);
        }
        let (primary, standby) = (pair.data("primary"), pair.data("standby"));
        pair.pg(
            "initdb",
            &[
                "-D",
                &primary,
                "-U",
                "idem",
                "--auth=trust",
                "-E",
                "UTF8",
                "--no-sync",
            ],
        );
        // Synchronous replication: a commit returns once the standby has it.
        let primary_settings = format!(
            "-p {} -k {} -c listen_addresses=127.0.0.1 -c max_connections=200 \
             -c wal_level=replica -c max_wal_senders=4 -c synchronous_commit=on \
             -c synchronous_standby_names='{}' -c fsync=off",
            pair.primary_port,
            pair.dir.display(),
            if synchronous { "*" } else { "" }
        );
        pair.pg_ctl_start(&primary, &primary_settings);
        pair.pg(
            "pg_basebackup",
            &[
                "-h",
                "127.0.0.1",
                "-p",
                &pair.primary_port.to_string(),
                "-U",
                "idem",
                "-D",
                &standby,
                "-R",
                "-X",
                "stream",
                "-c",
                "fast",
            ],
        );
        let standby_settings = format!(
            "-p {} -k {} -c listen_addresses=127.0.0.1 -c max_connections=200 \
             -c hot_standby=on -c fsync=off",
            pair.standby_port,
            pair.dir.display()
        );
        pair.pg_ctl_start(&standby, &standby_settings);
        pair.wait_synchronous(synchronous);
        pair
    }

    /// The URL of one server.
    pub(crate) fn url(port: u16) -> String {
        format!("postgres://idem@127.0.0.1:{port}/postgres")
    }

    /// The store's URL: both hosts, `first` then the other, writes asked for.
    pub(crate) fn hosts_url(first: u16, second: u16) -> String {
        format!(
            "postgres://idem@127.0.0.1:{first},127.0.0.1:{second}/postgres?target_session_attrs=read-write"
        )
    }

    /// Kills the primary (`pg_ctl stop -m immediate`: no shutdown checkpoint, every session cut).
    pub(crate) async fn kill_primary(&self) {
        let data = self.data("primary");
        self.pg_async(
            "pg_ctl",
            vec![
                "-D".into(),
                data,
                "-m".into(),
                "immediate".into(),
                "stop".into(),
            ],
        )
        .await;
    }

    /// Promotes the standby and waits until it accepts writes.
    pub(crate) async fn promote_standby(&self) {
        let data = self.data("standby");
        self.pg_async(
            "pg_ctl",
            vec!["-D".into(), data, "-w".into(), "promote".into()],
        )
        .await;
    }

    /// Stops the standby's WAL receiver (SIGSTOP): the primary's link to its synchronous
    /// standby goes silent (a network partition between them), and commits wait for it.
    /// Returns the receiver's pid, for [`thaw`](Self::thaw).
    pub(crate) async fn freeze_wal_receiver(&self) -> i32 {
        use sqlx::Connection;
        let mut conn = sqlx::PgConnection::connect(&Self::url(self.standby_port))
            .await
            .expect("connect to the standby");
        let (pid,): (i32,) = sqlx::query_as("SELECT pid FROM pg_stat_wal_receiver")
            .fetch_one(&mut conn)
            .await
            .expect("the standby's WAL receiver");
        let _ = conn.close().await;
        signal(pid, "STOP");
        pid
    }

    /// Lets a process stopped by [`freeze_wal_receiver`](Self::freeze_wal_receiver) run again.
    pub(crate) fn thaw(pid: i32) {
        signal(pid, "CONT");
    }

    /// Stops every process of the primary (SIGSTOP: the postmaster and its children): a
    /// server gone silent, its sockets open. Returns the pids, for [`thaw`](Self::thaw) or
    /// [`kill_frozen`](Self::kill_frozen).
    pub(crate) fn freeze_primary(&self) -> Vec<i32> {
        let pid_file =
            std::fs::read_to_string(Path::new(&self.data("primary")).join("postmaster.pid"))
                .expect("the primary's postmaster.pid");
        let postmaster: i32 = pid_file
            .lines()
            .next()
            .and_then(|l| l.trim().parse().ok())
            .expect("a pid");
        let mut pids = vec![postmaster];
        for entry in std::fs::read_dir("/proc")
            .expect("/proc")
            .filter_map(Result::ok)
        {
            let Ok(pid) = entry.file_name().to_string_lossy().parse::<i32>() else {
                continue;
            };
            let Ok(stat) = std::fs::read_to_string(entry.path().join("stat")) else {
                continue;
            };
            let after = stat.rsplit_once(')').map(|(_, rest)| rest).unwrap_or("");
            let ppid: i32 = after
                .split_whitespace()
                .nth(1)
                .and_then(|p| p.parse().ok())
                .unwrap_or(0);
            if ppid == postmaster {
                pids.push(pid);
            }
        }
        signal(postmaster, "STOP");
        for pid in &pids[1..] {
            signal(*pid, "STOP");
        }
        pids
    }

    /// Lets processes stopped by [`freeze_primary`](Self::freeze_primary) run again.
    pub(crate) fn thaw_all(pids: &[i32]) {
        for pid in pids {
            signal(*pid, "CONT");
        }
    }

    /// SIGKILLs processes stopped by [`freeze_primary`](Self::freeze_primary).
    pub(crate) fn kill_frozen(pids: &[i32]) {
        for pid in pids {
            let _ = Command::new("kill")
                .args(["-KILL", &pid.to_string()])
                .status();
        }
    }

    /// Stops the standby (`pg_ctl stop -m fast`): what the primary commits from now on is not
    /// replicated (with asynchronous replication, the commits a promotion then loses).
    pub(crate) async fn stop_standby(&self) {
        let standby = self.data("standby");
        self.pg_async(
            "pg_ctl",
            vec![
                "-D".into(),
                standby,
                "-m".into(),
                "fast".into(),
                "-w".into(),
                "stop".into(),
            ],
        )
        .await;
    }

    /// Restarts the standby on the primary's address (the primary must be gone) and promotes
    /// it: what a failover behind a fixed address (a virtual IP, a pooler's `host`) looks
    /// like to a client.
    pub(crate) async fn promote_standby_at_the_primary_s_address(&self) {
        let standby = self.data("standby");
        if Path::new(&standby).join("postmaster.pid").exists() {
            self.stop_standby().await;
        }
        let settings = format!(
            "-p {} -k {} -c listen_addresses=127.0.0.1 -c max_connections=200 \
             -c hot_standby=on -c fsync=off",
            self.primary_port,
            self.dir.display()
        );
        self.pg_ctl_start(&standby, &settings);
        self.promote_standby().await;
    }

    fn data(&self, name: &str) -> String {
        self.dir.join(name).display().to_string()
    }

    fn pg_ctl_start(&self, data: &str, settings: &str) {
        let log = format!("{data}.log");
        let output = self.pg_output(
            "pg_ctl",
            &[
                "-D", data, "-l", &log, "-w", "-t", "60", "-o", settings, "start",
            ],
        );
        assert!(
            output.status.success(),
            "pg_ctl start {data}: {}",
            std::fs::read_to_string(&log).unwrap_or_default()
        );
    }

    fn wait_synchronous(&self, synchronous: bool) {
        let state = if synchronous {
            "sync_state = 'sync'"
        } else {
            "state = 'streaming'"
        };
        let until = Instant::now() + Duration::from_secs(60);
        loop {
            let output = self.pg_output(
                "psql",
                &[
                    "-h",
                    "127.0.0.1",
                    "-p",
                    &self.primary_port.to_string(),
                    "-U",
                    "idem",
                    "-d",
                    "postgres",
                    "-Atc",
                    &format!("SELECT count(*) FROM pg_stat_replication WHERE {state}"),
                ],
            );
            if String::from_utf8_lossy(&output.stdout).trim() == "1" {
                return;
            }
            assert!(
                Instant::now() < until,
                "the standby never became synchronous"
            );
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    fn command(&self, program: &str) -> Command {
        let program = self.bin.join(program);
        if self.as_postgres {
            let mut command = Command::new("runuser");
            command.args(["-u", "postgres", "--"]).arg(program);
            command
        } else {
            Command::new(program)
        }
    }

    fn pg_output(&self, program: &str, args: &[&str]) -> Output {
        self.command(program)
            .args(args)
            .current_dir(&self.dir)
            .output()
            .unwrap_or_else(|e| panic!("run {program} (PostgreSQL must be installed): {e}"))
    }

    fn pg(&self, program: &str, args: &[&str]) {
        let output = self.pg_output(program, args);
        assert!(
            output.status.success(),
            "{program} failed: {}{}",
            String::from_utf8_lossy(&output.stdout),
            String::from_utf8_lossy(&output.stderr)
        );
    }

    async fn pg_async(&self, program: &str, args: Vec<String>) {
        let mut command = tokio::process::Command::from(self.command(program));
        let output = command
            .args(&args)
            .current_dir(&self.dir)
            .output()
            .await
            .unwrap_or_else(|e| panic!("run {program}: {e}"));
        assert!(
            output.status.success(),
            "{program} {args:?} failed: {}",
            String::from_utf8_lossy(&output.stderr)
        );
    }
}

impl Drop for PgPair {
    fn drop(&mut self) {
        for name in ["primary", "standby"] {
            let data = self.data(name);
            if Path::new(&data).join("postmaster.pid").exists() {
                let _ = self
                    .command("pg_ctl")
                    .args(["-D", &data, "-m", "immediate", "stop"])
                    .output();
            }
        }
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// The directory of initdb, pg_ctl and pg_basebackup: on PATH, or Debian's newest
/// /usr/lib/postgresql/<version>/bin.
fn pg_bin_dir() -> PathBuf {
    // initdb on PATH may be a link into the installation's directory, which has the others.
    let on_path = run_plain("sh", &["-c", "command -v initdb || true"]);
    let real = std::fs::canonicalize(on_path.trim()).ok();
    if let Some(dir) = real.as_deref().and_then(Path::parent) {
        if dir.join("pg_basebackup").exists() {
            return dir.to_path_buf();
        }
    }
    let mut versions: Vec<(u32, PathBuf)> = std::fs::read_dir("/usr/lib/postgresql")
        .expect("PostgreSQL's binaries: on PATH or under /usr/lib/postgresql")
        .filter_map(Result::ok)
        .filter_map(|entry| {
            let version = entry.file_name().to_string_lossy().parse::<u32>().ok()?;
            Some((version, entry.path().join("bin")))
        })
        .filter(|(_, bin)| bin.join("initdb").exists())
        .collect();
    versions.sort();
    versions
        .pop()
        .map(|(_, bin)| bin)
        .expect("a PostgreSQL installation with initdb")
}

fn run_plain(program: &str, args: &[&str]) -> String {
    let output = Command::new(program)
        .args(args)
        .output()
        .unwrap_or_else(|e| panic!("run {program}: {e}"));
    String::from_utf8_lossy(&output.stdout).into_owned()
}

fn signal(pid: i32, name: &str) {
    let status = Command::new("kill")
        .args([&format!("-{name}"), &pid.to_string()])
        .status()
        .expect("run kill");
    assert!(status.success(), "kill -{name} {pid}");
}

fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .and_then(|listener| listener.local_addr())
        .expect("a free port")
        .port()
}

/// How a test fails the primary before the standby is promoted ([`PgPair::fail_primary`]).
#[derive(Clone, Copy, Debug)]
pub(crate) enum PrimaryFault {
    /// SIGKILL: the connections end.
    Killed,
    /// SIGSTOP: a server gone silent, its sockets open.
    Frozen,
}

/// A frozen primary's processes, killed when this is dropped (however the test ends).
pub(crate) struct FrozenPrimary(Vec<i32>);

impl Drop for FrozenPrimary {
    fn drop(&mut self) {
        PgPair::kill_frozen(&self.0);
    }
}

impl PgPair {
    /// Fails the primary as `fault` says; a frozen one stays frozen while the returned guard
    /// lives.
    pub(crate) async fn fail_primary(&self, fault: PrimaryFault) -> Option<FrozenPrimary> {
        match fault {
            PrimaryFault::Killed => {
                self.kill_primary().await;
                None
            }
            PrimaryFault::Frozen => Some(FrozenPrimary(self.freeze_primary())),
        }
    }
}
