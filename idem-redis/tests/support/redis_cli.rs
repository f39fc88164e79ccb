//! Driving redis-server from a test: `redis-cli` (a missing one is a failure with the way out,
//! never a skip), waiting for a condition, and freezing a server with `DEBUG SLEEP`.

use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

/// Runs `redis-cli` with `args`, its output kept.
pub(crate) fn redis_cli(args: &[&str]) -> Output {
    Command::new("redis-cli")
        .args(args)
        .stdin(Stdio::null())
        .output()
        .expect("redis-cli is not installed: run `bash scripts/test`, which installs it")
}

/// `redis-cli -p port args…`, its standard output as text; a failure to run is a panic.
pub(crate) fn cli(port: u16, args: &[&str]) -> String {
    try_cli(port, args).unwrap_or_else(|error| panic!("{error}"))
}

/// `redis-cli -p port args…`, its standard output as text, or what it printed on failure: for
/// polls, where a server that closes its clients (a demotion does) is "not yet", not a panic.
pub(crate) fn try_cli(port: u16, args: &[&str]) -> Result<String, String> {
    let port = port.to_string();
    let mut all = vec!["-h", "127.0.0.1", "-p", &port];
    all.extend_from_slice(args);
    let out = redis_cli(&all);
    if !out.status.success() {
        return Err(format!(
            "redis-cli {all:?}: {}",
            String::from_utf8_lossy(&out.stderr)
        ));
    }
    Ok(String::from_utf8_lossy(&out.stdout).trim().to_owned())
}

/// Moves `count` slots from the node with id `from` to the node with id `to`, in the cluster of
/// the node on `seed_port`, with `redis-cli --cluster reshard` (keys migrated with them,
/// `pipeline` at a time); a failure is a panic with what the tool printed.
pub(crate) fn reshard_slots(seed_port: u16, from: &str, to: &str, count: usize, pipeline: usize) {
    let seed = format!("127.0.0.1:{seed_port}");
    let (count, pipeline) = (count.to_string(), pipeline.to_string());
    let out = redis_cli(&[
        "--cluster",
        "reshard",
        &seed,
        "--cluster-from",
        from,
        "--cluster-to",
        to,
        "--cluster-slots",
        &count,
        "--cluster-yes",
        "--cluster-pipeline",
        &pipeline,
    ]);
    assert!(
        out.status.success(),
        "redis-cli --cluster reshard: {}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
}

/// Waits until `ready` holds, at most `limit`; past it, a panic naming `what`.
pub(crate) fn wait_for(limit: Duration, what: &str, mut ready: impl FnMut() -> bool) {
    let started = Instant::now();
    while !ready() {
        assert!(started.elapsed() < limit, "waited {limit:?} for {what}");
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// `DEBUG SLEEP seconds` on the Redis at `port`, from a thread of its own; returns once the
/// server has stopped answering (a PING of its own times out).
pub(crate) fn freeze_port(port: u16, seconds: f64) -> std::thread::JoinHandle<()> {
    let sleeper = std::thread::spawn(move || {
        let _ = cli(port, &["debug", "sleep", &seconds.to_string()]);
    });
    wait_for(
        Duration::from_secs(2),
        "DEBUG SLEEP to freeze the node",
        || {
            let mut ping = Command::new("timeout")
                .args([
                    "0.2",
                    "redis-cli",
                    "-h",
                    "127.0.0.1",
                    "-p",
                    &port.to_string(),
                    "ping",
                ])
                .stdout(Stdio::null())
                .stderr(Stdio::null())
                .spawn()
                .expect("timeout(1) and redis-cli");
            !ping.wait().is_ok_and(|status| status.success())
        },
    );
    sleeper
}

/// A free loopback port.
pub(crate) fn free_port() -> u16 {
    // Never the same port twice in one test process: the kernel may hand a released port out
    // again, and a node given another's bus port "listens" through that node's bus.
    static GIVEN: std::sync::Mutex<std::collections::BTreeSet<u16>> =
        std::sync::Mutex::new(std::collections::BTreeSet::new());
    loop {
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .and_then(|l| l.local_addr())
            .map(|a| a.port())
            .expect("a free port");
        let mut given = GIVEN
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        if given.insert(port) {
            return port;
        }
    }
}

/// `redis-server args…`, once it listens on `port` on loopback.
pub(crate) fn redis_server<S: AsRef<std::ffi::OsStr>>(port: u16, args: &[S]) -> Child {
    let child = Command::new("redis-server")
        .args(args)
        .stdout(Stdio::null())
        .spawn()
        .expect("redis-server is not installed: run `bash scripts/test`, which installs it");
    wait_for(
        Duration::from_secs(5),
        &format!("a server to listen on {port}"),
        || std::net::TcpStream::connect(("127.0.0.1", port)).is_ok(),
    );
    child
}

/// Kills `child` and waits for it.
pub(crate) fn kill(child: &mut Child) {
    let _ = child.kill();
    let _ = child.wait();
}
