//! A server run as a real child process: started, waited for until it listens, stopped with
//! SIGTERM or SIGKILL, and always killed when dropped, even when the test panics.

use std::path::PathBuf;
use std::process::{ExitStatus, Stdio};
use std::time::{Duration, Instant};
use tokio::io::{AsyncBufReadExt, BufReader};
use tokio::process::{Child, Command};

/// How long a server may take to print its `listening on` line (migrations included).
const STARTUP_DEADLINE: Duration = Duration::from_secs(60);

/// A running server child process. Dropping it kills the process (SIGKILL) and reaps it; a
/// panicking test also gets the tail of the server's log printed.
#[derive(Debug)]
pub struct ServerProcess {
    name: String,
    child: Option<Child>,
    /// `http://127.0.0.1:PORT`.
    pub base_url: String,
    /// The child's pid.
    pub pid: u32,
    log: PathBuf,
}

impl ServerProcess {
    /// Spawns `command` with its stderr into the file `log` and its stdout piped, and waits
    /// for its `listening on http://ADDR` line; `name` and `context` (the database, say) go in
    /// failure messages.
    pub async fn start(name: &str, mut command: Command, log: PathBuf, context: &str) -> Self {
        let log_file = std::fs::File::create(&log)
            .unwrap_or_else(|e| panic!("cannot create the server log {}: {e}", log.display()));
        command
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::from(log_file))
            .kill_on_drop(true);
        let mut child = command
            .spawn()
            .unwrap_or_else(|e| panic!("cannot start {name}: {e}"));
        let pid = child.id().expect("a just-spawned child has a pid");
        let stdout = child.stdout.take().expect("the child's stdout is piped");
        let mut server = ServerProcess {
            name: name.to_owned(),
            child: Some(child),
            base_url: String::new(),
            pid,
            log,
        };
        let mut lines = BufReader::new(stdout).lines();
        let started = Instant::now();
        let mut other_lines = Vec::new();
        let addr = loop {
            let remaining = STARTUP_DEADLINE.saturating_sub(started.elapsed());
            match tokio::time::timeout(remaining, lines.next_line()).await {
                Err(_) => panic!(
                    "{name} did not print `listening on http://...` within {STARTUP_DEADLINE:?} \
                     ({context}); stdout so far: {other_lines:?}; its log:\n{}",
                    server.log_tail(80)
                ),
                Ok(Err(e)) => panic!("cannot read the stdout of {name}: {e}"),
                Ok(Ok(None)) => {
                    let status = server.wait_exit(Duration::from_secs(5)).await;
                    panic!(
                        "{name} exited ({status:?}) before listening ({context}); stdout: \
                         {other_lines:?}; its log:\n{}",
                        server.log_tail(80)
                    )
                }
                Ok(Ok(Some(line))) => match line.trim().strip_prefix("listening on http://") {
                    Some(addr) => break addr.trim_end_matches('/').to_owned(),
                    None => other_lines.push(line),
                },
            }
        };
        let port = addr
            .rsplit(':')
            .next()
            .and_then(|p| p.parse::<u16>().ok())
            .unwrap_or_else(|| panic!("no port in the listening line's address {addr:?}"));
        assert_ne!(port, 0, "{name} says it listens on port 0: {addr:?}");
        server.base_url = format!("http://{addr}");
        // Keep the pipe drained so the server never blocks writing to stdout.
        tokio::spawn(async move { while let Ok(Some(_)) = lines.next_line().await {} });
        server
    }

    /// `127.0.0.1:PORT`: where the server listens.
    pub fn addr(&self) -> &str {
        self.base_url.trim_start_matches("http://")
    }

    /// `base_url` + `path`.
    pub fn url(&self, path: &str) -> String {
        format!("{}{path}", self.base_url)
    }

    /// Kills the process with SIGKILL and reaps it.
    pub async fn kill(&mut self) {
        if let Some(mut child) = self.child.take() {
            child
                .kill()
                .await
                .unwrap_or_else(|e| panic!("cannot SIGKILL {} (pid {}): {e}", self.name, self.pid));
        }
    }

    /// Waits up to `within` for the process to exit by itself; its exit status.
    pub async fn wait_for_exit(&mut self, within: Duration) -> ExitStatus {
        match self.wait_exit(within).await {
            Some(status) => {
                self.child = None;
                status
            }
            None => panic!(
                "{} (pid {}) did not exit within {within:?}; its log:\n{}",
                self.name,
                self.pid,
                self.log_tail(80)
            ),
        }
    }

    /// Sends SIGTERM and waits up to `within` for the process to exit; its exit status.
    pub async fn terminate(&mut self, within: Duration) -> ExitStatus {
        let status = std::process::Command::new("kill")
            .arg("-TERM")
            .arg(self.pid.to_string())
            .status()
            .expect("cannot run `kill -TERM`");
        assert!(
            status.success(),
            "`kill -TERM {}` failed: {status}",
            self.pid
        );
        self.wait_for_exit(within).await
    }

    async fn wait_exit(&mut self, within: Duration) -> Option<ExitStatus> {
        let child = self.child.as_mut()?;
        match tokio::time::timeout(within, child.wait()).await {
            Ok(Ok(status)) => Some(status),
            _ => None,
        }
    }

    /// The server's stderr log.
    pub fn log(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_else(|e| format!("<no log: {e}>"))
    }

    /// The lines of the server's stderr log that contain every one of `parts`.
    pub fn log_lines(&self, parts: &[&str]) -> Vec<String> {
        self.log()
            .lines()
            .filter(|line| parts.iter().all(|part| line.contains(part)))
            .map(str::to_owned)
            .collect()
    }

    /// The last `lines` lines of the server's stderr log.
    pub fn log_tail(&self, lines: usize) -> String {
        let text = self.log();
        let all: Vec<&str> = text.lines().collect();
        all[all.len().saturating_sub(lines)..].join("\n")
    }
}

impl Drop for ServerProcess {
    fn drop(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.start_kill();
            // Reap it (briefly blocking) so that no zombie outlives the test.
            for _ in 0..200 {
                if !matches!(child.try_wait(), Ok(None)) {
                    break;
                }
                std::thread::sleep(Duration::from_millis(5));
            }
        }
        if std::thread::panicking() {
            eprintln!(
                "---- {} {} (pid {}) log tail ----\n{}\n---- end of log ----",
                self.name,
                self.base_url,
                self.pid,
                self.log_tail(60)
            );
        }
    }
}
