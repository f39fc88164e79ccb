//! Who holds a reservation (host, pid, a start id per process), so an operator can tell a hung
//! handler from a dead one. Stores write [`Holder::this_process`] (or their own) with every
//! reservation and takeover, as [`Holder::encode`]; older records have none.

use idem_core::{Error, FencingToken};
use std::fmt;
use std::sync::OnceLock;

/// The process that made a reservation. `start_id` is random per process (a reused pid gets
/// another); `started`, `boot_id` and `pid_namespace` let a tool on the same machine tell
/// whether the process with that pid is still the holder.
///
/// ```
/// use idem_ops::Holder;
/// let me = Holder::this_process();
/// assert_eq!(me.pid(), std::process::id());
/// assert!(!me.host().is_empty());
/// assert_eq!(Holder::decode(&me.encode())?, *me);
/// assert!(Holder::decode("garbage").is_err());
/// # Ok::<(), idem_core::Error>(())
/// ```
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Holder {
    host: String,
    pid: u32,
    start_id: u64,
    started: Option<u64>,
    boot_id: Option<String>,
    pid_namespace: Option<u64>,
}

/// The first stored form (no boot id, no namespace), still read.
const VERSION_1: &str = "h1";
/// The stored form written now.
const VERSION_2: &str = "h2";
/// The longest host name kept or read.
const MAX_HOST_LEN: usize = 255;
/// The longest boot id read (a UUID is 36 characters).
const MAX_BOOT_ID_LEN: usize = 64;

/// How much of an unreadable stored value an error or an `unreadable (…)` note repeats.
pub(crate) const SHOWN_CHARS: usize = 64;

/// At most `SHOWN_CHARS` characters of `text`, debug-escaped, with `…` where cut.
pub(crate) fn shown(text: &str) -> String {
    let mut cut: String = text.chars().take(SHOWN_CHARS).collect();
    if cut.len() < text.len() {
        cut.push('…');
    }
    format!("{cut:?}")
}

impl Holder {
    /// A holder from its parts; `host` trimmed, cut to 255 bytes, without control characters,
    /// `unknown` if empty. Boot id and namespace unknown ([`with_machine`](Self::with_machine)).
    ///
    /// ```
    /// use idem_ops::Holder;
    /// let h = Holder::new(" web-1\n", 42, 7, Some(1234));
    /// assert_eq!((h.host(), h.pid(), h.start_id(), h.started()), ("web-1", 42, 7, Some(1234)));
    /// assert_eq!(Holder::new("", 1, 1, None).host(), "unknown");
    /// ```
    pub fn new(host: &str, pid: u32, start_id: u64, started: Option<u64>) -> Self {
        // At most MAX_HOST_LEN bytes, cut at a character boundary.
        let mut len = 0;
        let cleaned: String = (host.trim().chars().filter(|c| !c.is_control()))
            .take_while(|c| {
                len += c.len_utf8();
                len <= MAX_HOST_LEN
            })
            .collect();
        Self {
            host: if cleaned.is_empty() {
                "unknown".to_owned()
            } else {
                cleaned
            },
            pid,
            start_id,
            started,
            boot_id: None,
            pid_namespace: None,
        }
    }

    /// With boot id and pid namespace (an empty, over-64-byte or multi-word boot id is dropped).
    ///
    /// ```
    /// use idem_ops::Holder;
    /// let h = Holder::new("web-1", 42, 7, None).with_machine(Some("b00t"), Some(4026531836));
    /// assert_eq!((h.boot_id(), h.pid_namespace()), (Some("b00t"), Some(4026531836)));
    /// assert_eq!(Holder::decode(&h.encode())?, h);
    /// # Ok::<(), idem_core::Error>(())
    /// ```
    pub fn with_machine(mut self, boot_id: Option<&str>, pid_namespace: Option<u64>) -> Self {
        self.boot_id = boot_id
            .map(str::trim)
            .filter(|b| valid_boot_id(b))
            .map(str::to_owned);
        self.pid_namespace = pid_namespace;
        self
    }

    /// This process, computed once: [`std::process::id`], host from `/proc/sys/kernel/hostname`
    /// or `HOSTNAME`.
    pub fn this_process() -> &'static Holder {
        static THIS: OnceLock<Holder> = OnceLock::new();
        THIS.get_or_init(|| {
            let host = std::fs::read_to_string("/proc/sys/kernel/hostname")
                .ok()
                .filter(|h| !h.trim().is_empty())
                .or_else(|| std::env::var("HOSTNAME").ok())
                .unwrap_or_default();
            let random = FencingToken::generate();
            let mut start_id = [0u8; 8];
            start_id.copy_from_slice(&random.as_bytes()[..8]);
            let pid = std::process::id();
            let boot_id = std::fs::read_to_string("/proc/sys/kernel/random/boot_id").ok();
            Holder::new(
                &host,
                pid,
                u64::from_be_bytes(start_id),
                process_started(pid),
            )
            .with_machine(boot_id.as_deref(), pid_namespace_of("self"))
        })
    }

    /// [`this_process`](Self::this_process) in its stored form, formatted once.
    ///
    /// ```
    /// use idem_ops::Holder;
    /// assert_eq!(Holder::this_process_encoded(), Holder::this_process().encode());
    /// ```
    pub fn this_process_encoded() -> &'static str {
        static THIS: OnceLock<String> = OnceLock::new();
        THIS.get_or_init(|| Holder::this_process().encode())
    }

    /// The host name.
    pub fn host(&self) -> &str {
        &self.host
    }

    /// The process id.
    pub fn pid(&self) -> u32 {
        self.pid
    }

    /// The random id the process drew when it started.
    pub fn start_id(&self) -> u64 {
        self.start_id
    }

    /// The process's start time (Linux: field 22 of `/proc/<pid>/stat`), if it could be read.
    pub fn started(&self) -> Option<u64> {
        self.started
    }

    /// The boot id of the machine the process ran on, if it was recorded.
    pub fn boot_id(&self) -> Option<&str> {
        self.boot_id.as_deref()
    }

    /// The inode of the process's pid namespace, if it was recorded.
    pub fn pid_namespace(&self) -> Option<u64> {
        self.pid_namespace
    }

    /// The stored form, one line: `h2 <pid> <start id, 16 hex> <started|-> <boot id|->
    /// <namespace|-> <host>` (host last: it may hold spaces). `h1` (no boot id, namespace) is read.
    pub fn encode(&self) -> String {
        let started = self.started.map_or("-".to_owned(), |s| s.to_string());
        let namespace = self.pid_namespace.map_or("-".to_owned(), |n| n.to_string());
        format!(
            "{VERSION_2} {} {:016x} {started} {} {namespace} {}",
            self.pid,
            self.start_id,
            self.boot_id.as_deref().unwrap_or("-"),
            self.host
        )
    }

    /// Reads the stored form back; anything else is [`Error::CorruptRecord`].
    pub fn decode(text: &str) -> Result<Self, Error> {
        let bad = || Error::CorruptRecord(format!("stored holder {}", shown(text)));
        let (version, rest) = text.split_once(' ').ok_or_else(bad)?;
        let fixed = match version {
            VERSION_1 => 3,
            VERSION_2 => 5,
            _ => return Err(bad()),
        };
        let mut parts = rest.splitn(fixed + 1, ' ');
        let mut next = || parts.next().ok_or_else(bad);
        let pid = next()?.parse().map_err(|_| bad())?;
        let start_id = next()?;
        if start_id.len() != 16 {
            return Err(bad());
        }
        let start_id = u64::from_str_radix(start_id, 16).map_err(|_| bad())?;
        let number = |field: &str| match field {
            "-" => Ok(None),
            n => n.parse().map(Some).map_err(|_| bad()),
        };
        let started = number(next()?)?;
        let (boot_id, pid_namespace) = if version == VERSION_2 {
            let boot_id = match next()? {
                "-" => None,
                id if valid_boot_id(id) => Some(id.to_owned()),
                _ => return Err(bad()),
            };
            (boot_id, number(next()?)?)
        } else {
            (None, None)
        };
        let host = next()?;
        if host.is_empty() || host.len() > MAX_HOST_LEN || host.chars().any(char::is_control) {
            return Err(bad());
        }
        Ok(Self {
            host: host.to_owned(),
            pid,
            start_id,
            started,
            boot_id,
            pid_namespace,
        })
    }
}

fn valid_boot_id(id: &str) -> bool {
    !id.is_empty()
        && id.len() <= MAX_BOOT_ID_LEN
        && id != "-"
        && id.chars().all(|c| c.is_ascii_graphic())
}

impl fmt::Display for Holder {
    /// `pid 4242 on web-1 (start 9f3c…)`.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "pid {} on {} (start {:016x})",
            self.pid, self.host, self.start_id
        )
    }
}

/// Process `pid`'s start time: field 22 of `/proc/<pid>/stat` (ticks since boot), if readable.
fn process_started(pid: u32) -> Option<u64> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // The command name (field 2) is in parentheses and may hold spaces: count after its end.
    let after_name = &stat[stat.rfind(')')? + 1..];
    after_name.split_whitespace().nth(19)?.parse().ok()
}

/// The inode of `/proc/<who>/ns/pid` (its link reads `pid:[4026531836]`).
fn pid_namespace_of(who: &str) -> Option<u64> {
    let link = std::fs::read_link(format!("/proc/{who}/ns/pid")).ok()?;
    let link = link.to_str()?;
    link.strip_prefix("pid:[")?.strip_suffix(']')?.parse().ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn this_process_is_computed_once_and_names_this_pid() {
        let a = Holder::this_process();
        let b = Holder::this_process();
        assert!(std::ptr::eq(a, b));
        assert_eq!(a.pid(), std::process::id());
        assert!(std::ptr::eq(
            Holder::this_process_encoded(),
            Holder::this_process_encoded()
        ));
        if std::path::Path::new("/proc/self/ns/pid").exists() {
            assert!(a.pid_namespace().is_some());
        }
    }

    #[test]
    fn the_stored_form_round_trips_any_host() {
        for host in ["web-1", "a host with spaces", "ünï", "x"] {
            for started in [None, Some(0), Some(u64::MAX)] {
                for (boot, ns) in [(None, None), (Some("0b7c-e2"), Some(4026531836))] {
                    let h = Holder::new(host, u32::MAX, u64::MAX, started).with_machine(boot, ns);
                    assert_eq!(Holder::decode(&h.encode()).expect("decodes"), h);
                }
            }
        }
        let long = "h".repeat(400);
        assert_eq!(Holder::new(&long, 1, 1, None).host().len(), 255);
        let multiline = Holder::new("a\nb\u{7}", 1, 2, None);
        assert_eq!(multiline.host(), "ab");
        assert!(!multiline.encode().contains('\n'));
    }

    #[test]
    fn the_first_stored_form_still_decodes_with_an_unknown_machine() {
        let old = Holder::decode("h1 42 0000000000000007 1234 web 1").expect("an h1 holder");
        assert_eq!(old, Holder::new("web 1", 42, 7, Some(1234)));
        assert_eq!((old.boot_id(), old.pid_namespace()), (None, None));
    }

    #[test]
    fn c12_foreign_stored_holders_are_corrupt() {
        let long_host = format!("h1 1 0000000000000001 - {}", "h".repeat(256));
        for text in [
            "",
            "h1",
            "h1 1 0000000000000001 - ",
            "h3 1 0000000000000001 - host",
            "h1 x 0000000000000001 - host",
            "h1 1 01 - host",
            "h1 1 000000000000000g - host",
            "h1 1 0000000000000001 soon host",
            "h1 -1 0000000000000001 - host",
            "h1 1 0000000000000001 - ho\u{1b}[2Jst",
            "h2 1 0000000000000001 - - - ",
            "h2 1 0000000000000001 - - ns host",
            long_host.as_str(),
        ] {
            assert!(
                matches!(Holder::decode(text), Err(Error::CorruptRecord(_))),
                "{text:?}"
            );
        }
    }

    #[test]
    fn an_error_repeats_at_most_64_characters_of_a_stored_holder() {
        let hostile = format!("h9 {}", "x".repeat(10_000));
        let Err(Error::CorruptRecord(why)) = Holder::decode(&hostile) else {
            panic!("a foreign holder is corrupt");
        };
        assert!(why.len() < 100, "{why}");
        assert!(why.contains('…'));
    }

    #[test]
    fn the_start_time_of_a_process_is_read_past_its_name() {
        if std::path::Path::new("/proc/self/stat").exists() {
            assert!(process_started(std::process::id()).is_some());
        }
        assert_eq!(process_started(u32::MAX), None);
    }
}
