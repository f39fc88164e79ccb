//! Which of this process's TCP connections run a keepalive timer, read from the kernel's
//! socket table (`/proc/net/tcp`, Linux): an idle connection with `SO_KEEPALIVE` shows timer
//! 2, one without shows none.

use std::collections::HashSet;
use std::time::Duration;

/// The inodes of this process's sockets.
fn own_sockets() -> HashSet<u64> {
    std::fs::read_dir("/proc/self/fd")
        .expect("/proc/self/fd (Linux)")
        .filter_map(|entry| std::fs::read_link(entry.ok()?.path()).ok())
        .filter_map(|target| {
            let target = target.to_string_lossy().into_owned();
            target
                .strip_prefix("socket:[")?
                .strip_suffix(']')?
                .parse()
                .ok()
        })
        .collect()
}

/// This process's established connections to any of `ports` on loopback, each as its local
/// port and whether a keepalive timer runs on it.
pub(crate) fn connections(ports: &[u16]) -> Vec<(u16, bool)> {
    let own = own_sockets();
    let table = std::fs::read_to_string("/proc/net/tcp").expect("/proc/net/tcp (Linux)");
    table
        .lines()
        .skip(1)
        .filter_map(|line| {
            let fields: Vec<&str> = line.split_whitespace().collect();
            let (local, remote, state, timer, inode) = (
                fields.get(1)?,
                fields.get(2)?,
                fields.get(3)?,
                fields.get(5)?,
                fields.get(9)?,
            );
            let port = |address: &str| u16::from_str_radix(address.rsplit_once(':')?.1, 16).ok();
            let established = *state == "01";
            let ours = inode.parse::<u64>().is_ok_and(|inode| own.contains(&inode));
            let to = port(remote)?;
            (established && ours && ports.contains(&to))
                .then(|| Some((port(local)?, timer.starts_with("02:"))))
                .flatten()
        })
        .collect()
}

/// Waits (at most two seconds, for sockets that just sent to go idle) until every connection
/// of this process to `ports` runs a keepalive timer; returns how many there are, or panics
/// naming those without.
pub(crate) fn every_connection_probed(ports: &[u16]) -> usize {
    let started = std::time::Instant::now();
    loop {
        let found = connections(ports);
        let unprobed: Vec<u16> = found
            .iter()
            .filter(|(_, probed)| !probed)
            .map(|(local, _)| *local)
            .collect();
        if unprobed.is_empty() {
            return found.len();
        }
        assert!(
            started.elapsed() < Duration::from_secs(2),
            "connections to {ports:?} without TCP keepalive, from local ports {unprobed:?}"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
}
