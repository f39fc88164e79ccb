//! What operators see (store rule 6), by `SCAN`: Redis keeps no index by age or by consumer,
//! and a Cluster refuses commands on keys of several slots, so the store finds its records with
//! `SCAN <cursor> MATCH <escaped prefix>:* COUNT <n> TYPE hash` on one node at a time (every
//! master of a Cluster in turn, in address order), reads each key found with `lua/list.lua`
//! (once per key, pipelined to the node that holds it; never a body), and filters by the
//! selection at that node's `TIME`. The records' audit trails (`{<prefix>:<digest>}:audit`,
//! lists) match neither the pattern nor the type, and would fail the check of a record key
//! (`<prefix>:` and 64 hex digits) besides: neither a listing nor the counts take one for a
//! record.
//!
//! A listing's [`Cursor`] is `s.<scan cursor>` on one Redis and `s.<scan cursor>@<host>:<port>`
//! on a Cluster (the master being scanned), with `e` for a scan cursor once that node's scan
//! has ended. A scan step can find more records than the page has room for: those keys' digests
//! ride in the cursor (`s.<scan cursor>.<digest>.<digest>...`) and are read again first on the
//! next page, so no record found is dropped and no page exceeds its limit.

use crate::conn::{answer, Node};
use crate::connections::Connections;
use crate::error::{unexpected, BACKEND};
use crate::record::{self, bytes, server_time};
use crate::scripts::scripts;
use idem_core::{Error, Field, StoreErrorKind, Timestamp};
use idem_ops::{Cursor, ListQuery, Listed, ListedState, Page, Selection, Stats};
use redis::{ServerErrorKind, Value};

/// How many scan steps one `list` call takes at most (fewer once its page is full or the
/// listing ends): one call reads at most about this many times the step's `COUNT`.
const MAX_STEPS: usize = 8;

/// The least `COUNT` of a listing's scan step (Redis's default): a step asks for about the
/// limit's worth of keys, but no fewer than this, so that a small limit does not cost a round
/// trip per key. What a step finds beyond the page's room rides in the cursor.
const MIN_STEP: usize = 10;
/// The most leftover keys a cursor may carry: far more than a scan step leaves.
const MAX_PENDING: usize = 16 * ListQuery::MAX_LIMIT;

/// The `COUNT` of each scan step of `stats`, and so the most records held at once.
const STATS_BATCH: usize = 500;

/// The hex digest after `<prefix>:` in a record's key.
const DIGEST_LEN: usize = 64;

/// Scans one store's prefix.
pub(crate) struct Scanner<'a> {
    conn: &'a Connections,
    prefix: &'a str,
}

/// Records read in one scan step, with the clock of the node that holds them.
struct Batch {
    now: Timestamp,
    /// Each record with its key.
    records: Vec<(String, Listed)>,
}

/// Where a listing stands: which node, where its scan resumes, and the keys found but not yet
/// listed.
#[derive(Debug, PartialEq)]
struct Resume {
    node: Node,
    /// The next `SCAN` cursor on `node`; `None` once its scan has ended.
    scan: Option<u64>,
    /// Digests of keys found on `node` that did not fit on a page.
    pending: Vec<String>,
}

impl<'a> Scanner<'a> {
    pub(crate) fn new(conn: &'a Connections, prefix: &'a str) -> Self {
        Self { conn, prefix }
    }

    /// At most `limit` records of the selection from at most [`MAX_STEPS`] scan steps.
    pub(crate) async fn list(&self, query: &ListQuery) -> Result<Page, Error> {
        let nodes = self.conn.nodes().await?;
        let mut at = match query.cursor() {
            Some(cursor) => Resume::parse(cursor, &nodes)?,
            None => Resume::start(first(&nodes)?),
        };
        let limit = query.limit_value();
        let mut records = Vec::new();
        for _ in 0..MAX_STEPS {
            let keys = self.next_keys(&mut at, limit.max(MIN_STEP)).await?;
            if !keys.is_empty() {
                let batch = self.read(&at.node, keys).await?;
                let mut selected = batch
                    .records
                    .into_iter()
                    .filter(|(_, record)| selects(query.selection(), record, batch.now));
                let room = limit - records.len();
                records.extend(selected.by_ref().take(room).map(|(_, record)| record));
                at.pending.extend(selected.map(|(key, _)| self.digest(key)));
            }
            if !at.move_on(&nodes) {
                return Ok(Page {
                    records,
                    next: None,
                });
            }
            if records.len() == limit {
                break;
            }
        }
        Ok(Page {
            records,
            next: Some(at.cursor()),
        })
    }

    /// Every record of the prefix, counted by state at its node's clock, a batch at a time.
    pub(crate) async fn stats(&self) -> Result<Stats, Error> {
        let nodes = self.conn.nodes().await?;
        let mut stats = Stats::at(self.time(first(&nodes)?).await?);
        for node in &nodes {
            let mut cursor = 0;
            loop {
                let (next, keys) = self.scan(node, cursor, STATS_BATCH).await?;
                if !keys.is_empty() {
                    let batch = self.read(node, keys).await?;
                    stats.now = stats.now.max(batch.now);
                    for (_, record) in &batch.records {
                        count(&mut stats, record, batch.now);
                    }
                }
                if next == 0 {
                    break;
                }
                cursor = next;
            }
        }
        Ok(stats)
    }

    /// The keys to read next: those left over from the last page, or one scan step's.
    async fn next_keys(&self, at: &mut Resume, count: usize) -> Result<Vec<String>, Error> {
        if !at.pending.is_empty() {
            // At most a step's worth: a call reads a bounded number of keys, whatever the
            // cursor carries.
            let take = count.min(at.pending.len());
            return Ok(at
                .pending
                .drain(..take)
                .map(|digest| format!("{}:{digest}", self.prefix))
                .collect());
        }
        let Some(cursor) = at.scan else {
            return Ok(Vec::new());
        };
        let (next, keys) = self.scan(&at.node, cursor, count).await?;
        at.scan = (next != 0).then_some(next);
        Ok(keys)
    }

    /// One `SCAN` step on `node`: the next cursor (0 at the end) and the keys of records.
    async fn scan(
        &self,
        node: &Node,
        cursor: u64,
        count: usize,
    ) -> Result<(u64, Vec<String>), Error> {
        let mut cmd = redis::cmd("SCAN");
        cmd.arg(cursor)
            .arg("MATCH")
            .arg(pattern(self.prefix))
            .arg("COUNT")
            .arg(count)
            .arg("TYPE")
            .arg("hash");
        let reply = self.conn.query_on(node, &cmd).await?;
        let bad = || unexpected("SCAN", &reply);
        let Value::Array(parts) = &reply else {
            return Err(bad());
        };
        let [next, Value::Array(keys)] = parts.as_slice() else {
            return Err(bad());
        };
        let next = std::str::from_utf8(&bytes(next, "scan cursor")?)
            .ok()
            .and_then(|text| text.parse().ok())
            .ok_or_else(bad)?;
        let mut found = Vec::with_capacity(keys.len());
        for key in keys {
            let key = String::from_utf8(bytes(key, "key")?).map_err(|_| {
                Error::CorruptRecord("redis record: a key under the prefix is not text".to_owned())
            })?;
            // `<prefix>:<anything>` also matches the keys of a store whose prefix extends this
            // one's (`idem` and `idem:v2`): those are not this store's records.
            if self.is_record_key(&key) {
                found.push(key);
            }
        }
        Ok((next, found))
    }

    fn is_record_key(&self, key: &str) -> bool {
        key.strip_prefix(self.prefix)
            .and_then(|rest| rest.strip_prefix(':'))
            .is_some_and(is_digest)
    }

    fn digest(&self, key: String) -> String {
        key.get(self.prefix.len() + 1..)
            .unwrap_or_default()
            .to_owned()
    }

    /// Reads `keys` on `node` in one round trip (the script is loaded in the same pipeline): a
    /// key gone since the scan (its TTL) is skipped; a record that does not decode is
    /// [`Error::CorruptRecord`]. A key whose slot has moved since (a resharding) is read again
    /// through its slot's routing.
    async fn read(&self, node: &Node, keys: Vec<String>) -> Result<Batch, Error> {
        let script = &scripts().list;
        let invocations: Vec<_> = keys
            .iter()
            .map(|key| {
                let mut invocation = script.prepare_invoke();
                invocation.key(key.as_str());
                invocation
            })
            .collect();
        let mut pipe = redis::pipe();
        pipe.load_script(script).cmd("TIME");
        for invocation in &invocations {
            pipe.invoke_script(invocation);
        }
        let mut replies = self.conn.pipeline_on(node, pipe).await?.into_iter();
        let (Some(loaded), Some(time)) = (replies.next(), replies.next()) else {
            return Err(Error::store(
                BACKEND,
                StoreErrorKind::Other,
                "a pipeline returned too few answers",
            ));
        };
        answer(loaded)?;
        let now = server_time(&answer(time)?)?;
        let mut records = Vec::with_capacity(keys.len());
        for ((key, invocation), reply) in keys.into_iter().zip(&invocations).zip(replies) {
            let reply = match reply {
                Value::ServerError(error)
                    if matches!(
                        error.kind(),
                        Some(ServerErrorKind::Moved | ServerErrorKind::Ask)
                    ) =>
                {
                    self.conn.invoke(invocation).await?
                }
                reply => answer(reply)?,
            };
            match reply {
                Value::Nil => {}
                Value::Array(fields) => {
                    // Named, so that an operator can find the one record every scan of
                    // the prefix stops on (C12).
                    let listed =
                        record::listed(&fields, self.prefix, &key).map_err(
                            |error| match error {
                                Error::CorruptRecord(why) => {
                                    Error::CorruptRecord(format!("{why} (key {key})"))
                                }
                                other => other,
                            },
                        )?;
                    records.push((key, listed));
                }
                other => return Err(unexpected("list.lua", &other)),
            }
        }
        Ok(Batch { now, records })
    }

    async fn time(&self, node: &Node) -> Result<Timestamp, Error> {
        server_time(&self.conn.query_on(node, &redis::cmd("TIME")).await?)
    }
}

fn first(nodes: &[Node]) -> Result<&Node, Error> {
    nodes.first().ok_or_else(|| {
        Error::store(
            BACKEND,
            StoreErrorKind::Unavailable,
            "the Cluster named no master",
        )
    })
}

/// The `MATCH` pattern of the prefix's keys: the prefix with its glob characters escaped, so
/// that a prefix like `a*` or `a[bc]` matches itself only.
fn pattern(prefix: &str) -> String {
    let mut pattern = String::with_capacity(prefix.len() * 2 + 2);
    for c in prefix.chars() {
        if matches!(c, '*' | '?' | '[' | ']' | '\\') {
            pattern.push('\\');
        }
        pattern.push(c);
    }
    pattern.push_str(":*");
    pattern
}

fn is_digest(text: &str) -> bool {
    text.len() == DIGEST_LEN && text.bytes().all(|b| matches!(b, b'0'..=b'9' | b'a'..=b'f'))
}

/// Whether `record` is one the selection lists at `now` (the rules of
/// [`Selection`]'s variants, as the memory store applies them).
fn selects(selection: &Selection, record: &Listed, now: Timestamp) -> bool {
    match (selection, &record.state) {
        (Selection::InProgress { older_than }, ListedState::InProgress { .. }) => {
            // A record of unknown age counts as reserved at the epoch, as in the SQL stores.
            record.reserved_at.unwrap_or_default() + *older_than <= now
        }
        (Selection::Completed { consumer, route }, ListedState::Completed { expires_at, .. }) => {
            record.id.consumer() == consumer
                && route.as_deref().is_none_or(|r| r == record.id.route())
                && *expires_at > now
        }
        // Every state, expired or not, as a lookup of each would read it.
        (Selection::Key { key }, _) => record.id.key() == key,
        // A mark without its check time (a hand edit) is due: never left unchecked.
        (Selection::InDoubt { due }, ListedState::Completed { .. }) => {
            in_doubt(record, now) && (!due || record.check_at.is_none_or(|at| at <= now))
        }
        _ => false,
    }
}

/// Whether `record` is a live completed record marked in doubt at `now` (readable mark or not).
fn in_doubt(record: &Listed, now: Timestamp) -> bool {
    record.doubt.is_some()
        && matches!(record.state, ListedState::Completed { expires_at, .. } if expires_at > now)
}

/// Counts `record` in `stats` by its state at `now`.
fn count(stats: &mut Stats, record: &Listed, now: Timestamp) {
    let live = record.state.deadline() > now;
    stats.in_doubt += u64::from(in_doubt(record, now));
    match (&record.state, live) {
        (ListedState::InProgress { .. }, true) => stats.in_progress += 1,
        (ListedState::InProgress { .. }, false) => stats.orphaned += 1,
        (ListedState::Completed { .. }, true) => stats.completed += 1,
        (ListedState::Completed { .. }, false) => stats.expired += 1,
    }
    if let (ListedState::InProgress { .. }, Some(at)) = (&record.state, record.reserved_at) {
        stats.oldest_in_progress = Some(stats.oldest_in_progress.map_or(at, |t| t.min(at)));
    }
}

impl Resume {
    fn start(node: &Node) -> Self {
        Self {
            node: node.clone(),
            scan: Some(0),
            pending: Vec::new(),
        }
    }

    /// Once this node is done (its scan ended, nothing pending), moves to the start of the next
    /// one; false when it was the last.
    fn move_on(&mut self, nodes: &[Node]) -> bool {
        if self.scan.is_some() || !self.pending.is_empty() {
            return true;
        }
        match nodes.iter().find(|node| **node > self.node) {
            Some(node) => {
                *self = Resume::start(node);
                true
            }
            None => false,
        }
    }

    fn cursor(&self) -> Cursor {
        let mut text = match self.scan {
            Some(scan) => format!("s.{scan}"),
            None => "s.e".to_owned(),
        };
        for digest in &self.pending {
            text.push('.');
            text.push_str(digest);
        }
        if let Node::Master { .. } = self.node {
            text.push('@');
            text.push_str(&self.node.to_string());
        }
        Cursor::new(text)
    }

    /// The position a cursor of this store wrote, on one of `nodes`; any other text, or a
    /// master that is no longer one (the Cluster changed: list again), is
    /// [`Error::InvalidInput`].
    fn parse(cursor: &Cursor, nodes: &[Node]) -> Result<Self, Error> {
        let bad = || Error::invalid(Field::Cursor, "not a cursor of this store");
        let rest = cursor.as_str().strip_prefix("s.").ok_or_else(bad)?;
        let (position, node) = match rest.split_once('@') {
            Some((position, address)) => {
                let node = nodes
                    .iter()
                    .find(|node| matches!(node, Node::Master { .. }) && node.to_string() == address)
                    .ok_or_else(|| {
                        Error::invalid(
                            Field::Cursor,
                            "the cursor names no master of this Cluster (another store's, or the Cluster changed: list again)",
                        )
                    })?;
                (position, node)
            }
            None => (
                rest,
                nodes
                    .iter()
                    .find(|node| **node == Node::Only)
                    .ok_or_else(bad)?,
            ),
        };
        let mut parts = position.split('.');
        let scan = match parts.next().ok_or_else(bad)? {
            "e" => None,
            scan => Some(scan.parse::<u64>().map_err(|_| bad())?),
        };
        let pending: Vec<String> = parts
            .map(|digest| is_digest(digest).then(|| digest.to_owned()).ok_or_else(bad))
            .collect::<Result<_, _>>()?;
        // A scan step leaves at most a few steps' worth of keys for the next page; more is
        // not a cursor this store made.
        if pending.len() > MAX_PENDING {
            return Err(bad());
        }
        Ok(Self {
            node: node.clone(),
            scan,
            pending,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn master(port: u16) -> Node {
        Node::Master {
            host: "127.0.0.1".to_owned(),
            port,
        }
    }

    #[test]
    fn the_pattern_escapes_every_glob_character_of_the_prefix() {
        assert_eq!(pattern("idem"), "idem:*");
        assert_eq!(pattern(r"a*b?c[d]e\f"), r"a\*b\?c\[d\]e\\f:*");
    }

    #[test]
    fn cursors_round_trip() {
        let digest = "0123456789abcdef".repeat(4);
        let single = [Node::Only];
        let cluster = [master(7000), master(7001)];
        for (at, nodes) in [
            (Resume::start(&Node::Only), &single[..]),
            (
                Resume {
                    node: Node::Only,
                    scan: None,
                    pending: vec![digest.clone(), digest.clone()],
                },
                &single[..],
            ),
            (
                Resume {
                    node: master(7001),
                    scan: Some(u64::MAX),
                    pending: vec![digest.clone()],
                },
                &cluster[..],
            ),
        ] {
            let cursor = at.cursor();
            assert_eq!(
                Resume::parse(&cursor, nodes).expect("parses"),
                at,
                "{cursor}"
            );
        }
        assert_eq!(
            Resume::start(&master(7000)).cursor().as_str(),
            "s.0@127.0.0.1:7000"
        );
    }

    #[test]
    fn foreign_cursors_are_refused() {
        let single = [Node::Only];
        let cluster = [master(7000)];
        for (text, nodes) in [
            ("", &single[..]),
            ("s.", &single[..]),
            ("s.x", &single[..]),
            ("s.-1", &single[..]),
            ("s.1.abc", &single[..]),
            ("p.1.6100", &single[..]),
            ("s.1@127.0.0.1:7000", &single[..]),
            ("s.1", &cluster[..]),
            ("s.1@127.0.0.1:7001", &cluster[..]),
            ("s.1@", &cluster[..]),
        ] {
            assert!(
                matches!(
                    Resume::parse(&Cursor::new(text), nodes),
                    Err(Error::InvalidInput {
                        field: Field::Cursor,
                        ..
                    })
                ),
                "{text:?}"
            );
        }
    }
}
