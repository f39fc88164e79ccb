//! Slow and stalled raw-socket clients against a server started with short deadlines
//! ([`DEADLINES`]): the assertion that a connection is cut within its deadline, connections
//! that stall mid-head, a slow-loris crowd, and a normal client's rounds meanwhile.

use crate::{Closed, RawClient};
use std::future::Future;
use std::time::{Duration, Instant};
use tokio::task::JoinHandle;

/// The head deadline the tests configure.
pub const HEADER_TIMEOUT: Duration = Duration::from_millis(1000);
/// The body deadline the tests configure.
pub const BODY_TIMEOUT: Duration = Duration::from_millis(1500);
/// How late after its deadline a cut may come (a loaded test machine).
pub const SLACK: Duration = Duration::from_millis(1500);

/// The short deadlines ([`HEADER_TIMEOUT`], [`BODY_TIMEOUT`]), as a server reads them from
/// its environment.
pub const DEADLINES: [(&str, &str); 2] = [
    ("IDEM_HEADER_TIMEOUT_MS", "1000"),
    ("IDEM_BODY_TIMEOUT_MS", "1500"),
];

/// Asserts that `client`'s connection is closed by the server within `deadline` + [`SLACK`]
/// of its opening (and not before `deadline` minus a little: the cut is the timeout's).
pub async fn assert_cut(client: &mut RawClient, what: &str, deadline: Duration) -> Closed {
    let left = (deadline + SLACK).saturating_sub(client.age());
    let Some(closed) = client.closed_within(left).await else {
        panic!(
            "{what}: the server still held the connection {:?} after it opened (deadline \
             {deadline:?})",
            client.age()
        );
    };
    assert!(
        closed.after + Duration::from_millis(200) >= deadline,
        "{what}: cut after {:?}, before the deadline {deadline:?}: {}",
        closed.after,
        closed.text()
    );
    eprintln!(
        "{what}: closed after {:?}: {:?}",
        closed.after,
        closed.status()
    );
    closed
}

/// Three connections that stall in their head: one sent half a request line, one half its
/// headers, one nothing at all.
#[derive(Debug)]
pub struct StalledHeads {
    half_line: RawClient,
    half_headers: RawClient,
    silent: RawClient,
}

impl StalledHeads {
    /// Opens the three connections to `addr`, sending `half_line` on the first and
    /// `half_headers` on the second.
    pub async fn open(addr: &str, half_line: &[u8], half_headers: &[u8]) -> Self {
        let mut heads = Self {
            half_line: RawClient::connect(addr).await,
            half_headers: RawClient::connect(addr).await,
            silent: RawClient::connect(addr).await,
        };
        assert!(heads.half_line.send(half_line).await, "half a request line");
        assert!(
            heads.half_headers.send(half_headers).await,
            "half the headers"
        );
        heads
    }

    /// Asserts that the server cuts each of them within [`HEADER_TIMEOUT`].
    pub async fn assert_cut(mut self) {
        assert_cut(&mut self.half_line, "half a request line", HEADER_TIMEOUT).await;
        assert_cut(&mut self.half_headers, "half the headers", HEADER_TIMEOUT).await;
        assert_cut(&mut self.silent, "nothing sent", HEADER_TIMEOUT).await;
    }
}

/// Slow-loris connections, each dribbling a request head a byte at a time (pausing 100 ms
/// after each) and never finishing it.
#[derive(Debug)]
pub struct Lorises(Vec<JoinHandle<Closed>>);

impl Lorises {
    /// Starts `count` of them against `addr`, each sending `head` byte by byte.
    pub fn start(addr: &str, count: usize, head: &'static [u8]) -> Self {
        let lorises = (0..count)
            .map(|_| {
                let addr = addr.to_owned();
                tokio::spawn(async move {
                    let mut client = RawClient::connect(&addr).await;
                    for byte in head {
                        if !client.send(std::slice::from_ref(byte)).await {
                            break;
                        }
                        if let Some(closed) = client.closed_within(Duration::from_millis(100)).await
                        {
                            return closed;
                        }
                    }
                    let left = (HEADER_TIMEOUT + SLACK).saturating_sub(client.age());
                    client.closed_within(left).await.unwrap_or_else(|| {
                        panic!(
                            "a slow-loris connection was still open {:?} after it opened",
                            client.age()
                        )
                    })
                })
            })
            .collect();
        Self(lorises)
    }

    /// Asserts that every one was closed within [`HEADER_TIMEOUT`] + [`SLACK`]: dribbling
    /// does not extend the head deadline.
    pub async fn assert_closed(self) {
        for loris in self.0 {
            let closed = loris.await.expect("a slow-loris task panicked");
            assert!(
                closed.after <= HEADER_TIMEOUT + SLACK,
                "a slow-loris connection was closed only after {:?}",
                closed.after
            );
        }
    }
}

/// Runs `round` (given 1, 2, ...) with 100 ms between rounds until `during` has passed since
/// the first began; returns how many rounds ran.
pub async fn rounds_during<F, Fut>(during: Duration, mut round: F) -> u32
where
    F: FnMut(u32) -> Fut,
    Fut: Future<Output = ()>,
{
    let started = Instant::now();
    let mut rounds = 0;
    while started.elapsed() < during {
        rounds += 1;
        round(rounds).await;
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    rounds
}
