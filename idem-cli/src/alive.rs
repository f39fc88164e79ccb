//! Whether the process that holds a reservation still runs, where this machine can tell: only
//! on the holder's own host, machine boot and pid namespace, from `/proc`.

use idem_ops::Holder;
use std::io::ErrorKind;
use std::path::Path;

/// What this machine can say about a holder.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Liveness {
    /// The process with the holder's pid runs here and started when the holder did.
    Alive,
    /// No process with the holder's pid runs here, or only its zombie: the process is gone
    /// (whether it exited or crashed).
    Dead,
    /// A process with the holder's pid runs, but it started at another time: the pid was
    /// reused, the holder is gone.
    PidReused,
    /// The holder ran on another host, another boot of this one or another pid namespace, or
    /// did not record which: this machine cannot tell.
    Elsewhere,
    /// A process with the holder's pid runs here, but the holder recorded no start time to
    /// compare with.
    Unknown,
    /// This machine offers no `/proc` to look in, hides other processes (`hidepid`), or does
    /// not let this user examine the pid.
    CannotCheck,
}

impl Liveness {
    /// As the tables and JSON print it.
    pub(crate) fn as_str(self) -> &'static str {
        match self {
            Liveness::Alive => "alive",
            Liveness::Dead => "dead",
            Liveness::PidReused => "dead (pid reused)",
            Liveness::Elsewhere => "unknown (another host or namespace)",
            Liveness::Unknown => "unknown",
            Liveness::CannotCheck => "cannot check",
        }
    }
}

/// Whether `holder` still runs, as the process `here` (on this machine) sees it.
pub(crate) fn liveness(holder: &Holder, here: &Holder) -> Liveness {
    let same = |a: Option<&str>, b: Option<&str>| a.is_some() && a == b;
    if holder.host() != here.host()
        || !same(holder.boot_id(), here.boot_id())
        || holder.pid_namespace().is_none()
        || holder.pid_namespace() != here.pid_namespace()
    {
        return Liveness::Elsewhere;
    }
    if !Path::new("/proc/1/stat").exists() {
        return Liveness::CannotCheck;
    }
    let stat = match std::fs::read_to_string(format!("/proc/{}/stat", holder.pid())) {
        Ok(stat) => stat,
        Err(e) if e.kind() == ErrorKind::NotFound => return Liveness::Dead,
        Err(_) => return Liveness::CannotCheck,
    };
    let Some(after_name) = stat.rfind(')').map(|end| &stat[end + 1..]) else {
        return Liveness::CannotCheck;
    };
    let mut fields = after_name.split_whitespace();
    if fields.next() == Some("Z") {
        return Liveness::Dead;
    }
    let started: Option<u64> = fields.nth(18).and_then(|s| s.parse().ok());
    match (holder.started(), started) {
        (None, _) => Liveness::Unknown,
        (Some(_), None) => Liveness::CannotCheck,
        (Some(recorded), Some(now)) if recorded != now => Liveness::PidReused,
        (Some(_), Some(_)) => Liveness::Alive,
    }
}

/// [`liveness`] as this process sees it (its host, boot and namespace computed as idem
/// computes a holder's).
pub(crate) fn liveness_here(holder: &Holder) -> Liveness {
    liveness(holder, Holder::this_process())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A holder for `pid` on this machine, boot and namespace.
    fn here(pid: u32, started: Option<u64>) -> Holder {
        let me = Holder::this_process();
        Holder::new(me.host(), pid, 1, started).with_machine(me.boot_id(), me.pid_namespace())
    }

    fn proc_is_visible() -> bool {
        Path::new("/proc/1/stat").exists() && Holder::this_process().pid_namespace().is_some()
    }

    #[test]
    fn this_process_is_alive_and_elsewhere_is_unknown() {
        let me = Holder::this_process();
        if proc_is_visible() {
            assert_eq!(liveness_here(me), Liveness::Alive);
        }
        let elsewhere = Holder::new("another-host.example", me.pid(), 1, me.started())
            .with_machine(me.boot_id(), me.pid_namespace());
        assert_eq!(liveness_here(&elsewhere), Liveness::Elsewhere);
        let other_namespace = Holder::new(me.host(), me.pid(), 1, me.started())
            .with_machine(me.boot_id(), me.pid_namespace().map(|n| n + 1));
        assert_eq!(liveness_here(&other_namespace), Liveness::Elsewhere);
        let other_boot = Holder::new(me.host(), me.pid(), 1, me.started())
            .with_machine(Some("another-boot"), me.pid_namespace());
        assert_eq!(liveness_here(&other_boot), Liveness::Elsewhere);
        let old_form = Holder::new(me.host(), me.pid(), 1, me.started());
        assert_eq!(liveness_here(&old_form), Liveness::Elsewhere);
    }

    #[test]
    fn a_pid_that_runs_no_process_is_dead_and_a_reused_one_too() {
        if !proc_is_visible() {
            return;
        }
        let me = Holder::this_process();
        let mut child = std::process::Command::new("true")
            .spawn()
            .expect("spawn a process that exits");
        let pid = child.id();
        child.wait().expect("wait for it");
        assert_eq!(liveness_here(&here(pid, Some(1))), Liveness::Dead);
        if let Some(started) = me.started() {
            assert_eq!(
                liveness_here(&here(me.pid(), Some(started + 1))),
                Liveness::PidReused
            );
        }
        assert_eq!(liveness_here(&here(me.pid(), None)), Liveness::Unknown);
    }

    #[test]
    fn a_zombie_is_dead() {
        if !proc_is_visible() {
            return;
        }
        let mut child = std::process::Command::new("true")
            .spawn()
            .expect("spawn a process that exits");
        let pid = child.id();
        // Not reaped yet: once it has exited, it is a zombie until `wait`.
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(5);
        let zombie = loop {
            let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
            if stat
                .rsplit(')')
                .next()
                .map(str::trim_start)
                .is_some_and(|s| s.starts_with('Z'))
            {
                break true;
            }
            if std::time::Instant::now() > deadline {
                break false;
            }
            std::thread::sleep(std::time::Duration::from_millis(10));
        };
        assert!(zombie, "the child became a zombie");
        assert_eq!(liveness_here(&here(pid, Some(1))), Liveness::Dead);
        child.wait().expect("reap it");
    }
}
