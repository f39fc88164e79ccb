//! The proxy's own tests: each fault, against an echo server on loopback.

use super::{Direction, Fault, FaultProxy, Hold, LoseAnswer, Orphan, COMMIT_QUERY};
use std::time::Duration;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

/// How long "nothing arrives" is watched for.
const QUIET: Duration = Duration::from_millis(200);

/// An echo server that answers each piece with the piece followed by `end`; its address.
async fn echo(end: &'static [u8]) -> String {
    let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let addr = listener.local_addr().expect("addr").to_string();
    tokio::spawn(async move {
        while let Ok((mut socket, _)) = listener.accept().await {
            tokio::spawn(async move {
                let mut buf = [0u8; 1024];
                while let Ok(n @ 1..) = socket.read(&mut buf).await {
                    let mut reply = buf[..n].to_vec();
                    reply.extend_from_slice(end);
                    if socket.write_all(&reply).await.is_err() {
                        return;
                    }
                }
            });
        }
    });
    addr
}

async fn client(proxy: &FaultProxy) -> TcpStream {
    TcpStream::connect(proxy.addr()).await.expect("connect")
}

/// Reads what arrives within [`QUIET`]: `Some(bytes)`, empty at EOF; `None` if nothing came.
async fn read(socket: &mut TcpStream) -> Option<Vec<u8>> {
    let mut buf = [0u8; 1024];
    match tokio::time::timeout(QUIET, socket.read(&mut buf)).await {
        Ok(Ok(n)) => Some(buf[..n].to_vec()),
        Ok(Err(_)) => Some(Vec::new()),
        Err(_) => None,
    }
}

#[tokio::test]
async fn pass_through_and_freeze_switch_while_traffic_flows() {
    let proxy = FaultProxy::start(&echo(b".").await).await.expect("proxy");
    let mut socket = client(&proxy).await;
    socket.write_all(b"a").await.expect("write");
    assert_eq!(read(&mut socket).await.as_deref(), Some(&b"a."[..]));
    proxy.set(Fault::Freeze);
    socket.write_all(b"b").await.expect("write");
    assert_eq!(read(&mut socket).await, None, "frozen: nothing arrives");
    let mut frozen_new = client(&proxy).await;
    frozen_new.write_all(b"c").await.expect("write");
    assert_eq!(
        read(&mut frozen_new).await,
        None,
        "a new connection is frozen too"
    );
    proxy.set(Fault::PassThrough);
    assert_eq!(read(&mut socket).await.as_deref(), Some(&b"b."[..]));
    assert_eq!(read(&mut frozen_new).await.as_deref(), Some(&b"c."[..]));
    assert_eq!(proxy.connections(), 2);
}

#[tokio::test]
async fn an_answer_is_lost_once_after_the_server_replied() {
    let proxy = FaultProxy::start(&echo(b"<end>").await)
        .await
        .expect("proxy");
    let mut socket = client(&proxy).await;
    proxy.set(LoseAnswer::to(&b"COMMIT"[..]).reply_end(&b"<end>"[..]));
    socket.write_all(b"SELECT").await.expect("write");
    assert_eq!(
        read(&mut socket).await.as_deref(),
        Some(&b"SELECT<end>"[..])
    );
    socket.write_all(b"COMMIT").await.expect("write");
    assert_eq!(
        read(&mut socket).await.as_deref(),
        Some(&[][..]),
        "dropped, no answer"
    );
    assert_eq!(proxy.answers_lost(), 1);
    assert_eq!(proxy.fault(), Fault::PassThrough, "one shot");
    let mut again = client(&proxy).await;
    again.write_all(b"COMMIT").await.expect("write");
    assert_eq!(read(&mut again).await.as_deref(), Some(&b"COMMIT<end>"[..]));
}

/// Everything that arrives until nothing more comes for [`QUIET`]: `None` if nothing came at
/// all, empty at EOF.
async fn read_until_quiet(socket: &mut TcpStream) -> Option<Vec<u8>> {
    let mut all = read(socket).await?;
    while !all.is_empty() {
        match read(socket).await {
            Some(more) if !more.is_empty() => all.extend_from_slice(&more),
            _ => break,
        }
    }
    Some(all)
}

#[tokio::test]
async fn a_request_is_held_on_one_connection_until_the_fault_changes() {
    let proxy = FaultProxy::start(&echo(b"").await).await.expect("proxy");
    let mut held = client(&proxy).await;
    let mut other = client(&proxy).await;
    // Both connections are up before the hold is armed.
    held.write_all(b"hello").await.expect("write");
    assert_eq!(read(&mut held).await.as_deref(), Some(&b"hello"[..]));
    other.write_all(b"hello").await.expect("write");
    assert_eq!(read(&mut other).await.as_deref(), Some(&b"hello"[..]));
    proxy.set(Hold::to(COMMIT_QUERY));
    // The text alone, as inside another statement, is not the COMMIT message.
    held.write_all(b"Q\0\0\0\x29BEGIN ISOLATION LEVEL READ COMMITTED\0")
        .await
        .expect("write");
    assert_eq!(
        read_until_quiet(&mut held).await.as_deref(),
        Some(&b"Q\0\0\0\x29BEGIN ISOLATION LEVEL READ COMMITTED\0"[..])
    );
    // What precedes the COMMIT in the same piece goes through; the COMMIT and everything
    // after it wait.
    let mut piece = b"pre".to_vec();
    piece.extend_from_slice(COMMIT_QUERY);
    held.write_all(&piece).await.expect("write");
    assert_eq!(
        read_until_quiet(&mut held).await.as_deref(),
        Some(&b"pre"[..])
    );
    held.write_all(b"after").await.expect("write");
    assert_eq!(
        read(&mut held).await,
        None,
        "held: nothing reaches the server"
    );
    assert_eq!(proxy.requests_held(), 1);
    assert_eq!(proxy.fault(), Fault::Holding(Hold::to(COMMIT_QUERY)));
    // One connection only, once: the others, open or new, pass through, COMMIT included.
    other.write_all(COMMIT_QUERY).await.expect("write");
    assert_eq!(read(&mut other).await.as_deref(), Some(COMMIT_QUERY));
    let mut new = client(&proxy).await;
    new.write_all(COMMIT_QUERY).await.expect("write");
    assert_eq!(read(&mut new).await.as_deref(), Some(COMMIT_QUERY));
    assert_eq!(proxy.requests_held(), 1, "held once");
    assert_eq!(read(&mut held).await, None, "still held, the socket open");
    // Switched: the held bytes flow on, in order, then the connection passes through.
    proxy.set(Fault::PassThrough);
    let mut released = COMMIT_QUERY.to_vec();
    released.extend_from_slice(b"after");
    assert_eq!(
        read_until_quiet(&mut held).await.as_deref(),
        Some(released.as_slice())
    );
    held.write_all(b"again").await.expect("write");
    assert_eq!(read(&mut held).await.as_deref(), Some(&b"again"[..]));
    assert_eq!(proxy.requests_held(), 1);
}

#[tokio::test]
async fn half_open_closes_one_direction() {
    let proxy = FaultProxy::start(&echo(b"").await).await.expect("proxy");
    let mut socket = client(&proxy).await;
    proxy.set(Fault::HalfOpen(Direction::ToClient));
    assert_eq!(
        read(&mut socket).await.as_deref(),
        Some(&[][..]),
        "EOF toward the client"
    );
    proxy.set(Fault::PassThrough);
    let mut other = client(&proxy).await;
    proxy.set(Fault::HalfOpen(Direction::ToServer));
    // The echo server sees EOF and closes, which reaches the client as EOF too.
    other.write_all(b"x").await.expect("write");
    assert_eq!(read(&mut other).await.as_deref(), Some(&[][..]));
}

#[tokio::test]
async fn a_delay_holds_every_piece_back_then_passes_it_on() {
    let proxy = FaultProxy::start(&echo(b"").await).await.expect("proxy");
    let mut socket = client(&proxy).await;
    proxy.set(Fault::Delay(Duration::from_millis(300)));
    let sent = std::time::Instant::now();
    socket.write_all(b"late").await.expect("write");
    assert_eq!(
        read(&mut socket).await,
        None,
        "nothing within the quiet time"
    );
    let mut buf = [0u8; 16];
    let n = tokio::time::timeout(Duration::from_secs(2), socket.read(&mut buf))
        .await
        .expect("the echo arrives after the delay")
        .expect("read");
    assert_eq!(&buf[..n], b"late");
    let took = sent.elapsed();
    assert!(
        took >= Duration::from_millis(600),
        "delayed both ways: {took:?}"
    );
    proxy.set(Fault::PassThrough);
    socket.write_all(b"now").await.expect("write");
    assert_eq!(read(&mut socket).await.as_deref(), Some(&b"now"[..]));
}

/// A server that reports every piece it reads (empty at EOF); its address.
async fn listening_server() -> (String, tokio::sync::mpsc::UnboundedReceiver<Vec<u8>>) {
    let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let addr = listener.local_addr().expect("addr").to_string();
    let (heard, hears) = tokio::sync::mpsc::unbounded_channel();
    tokio::spawn(async move {
        while let Ok((mut socket, _)) = listener.accept().await {
            let heard = heard.clone();
            tokio::spawn(async move {
                let mut buf = [0u8; 64];
                loop {
                    let n = socket.read(&mut buf).await.unwrap_or(0);
                    let _ = heard.send(buf[..n].to_vec());
                    if n == 0 {
                        return;
                    }
                }
            });
        }
    });
    (addr, hears)
}

#[tokio::test]
async fn client_gone_closes_the_client_and_keeps_the_server_silent() {
    let (addr, mut hears) = listening_server().await;
    let proxy = FaultProxy::start(&addr).await.expect("proxy");
    let mut socket = client(&proxy).await;
    socket.write_all(b"hi").await.expect("write");
    let first = tokio::time::timeout(Duration::from_secs(1), hears.recv())
        .await
        .expect("the server hears the client");
    assert_eq!(first.as_deref(), Some(&b"hi"[..]));
    proxy.set(Fault::ClientGone);
    assert_eq!(
        read(&mut socket).await.as_deref(),
        Some(&[][..]),
        "the client reads EOF"
    );
    let _ = socket.write_all(b"lost").await;
    drop(socket);
    assert!(
        tokio::time::timeout(QUIET * 2, hears.recv()).await.is_err(),
        "the server hears nothing, not even EOF"
    );
    drop(proxy);
    let last = tokio::time::timeout(Duration::from_secs(1), hears.recv())
        .await
        .expect("the server's socket closes with the proxy");
    assert_eq!(last.as_deref(), Some(&[][..]));
}

#[tokio::test]
async fn an_orphan_reaches_the_server_then_only_its_client_is_closed() {
    let (addr, mut hears) = listening_server().await;
    let proxy = FaultProxy::start(&addr).await.expect("proxy");
    let mut orphaned = client(&proxy).await;
    let mut other = client(&proxy).await;
    proxy.set(Orphan::at(&b"COMMIT"[..]));
    other.write_all(b"first").await.expect("write");
    let heard = tokio::time::timeout(Duration::from_secs(1), hears.recv())
        .await
        .expect("heard");
    assert_eq!(heard.as_deref(), Some(&b"first"[..]));
    orphaned.write_all(b"xCOMMIT").await.expect("write");
    let heard = tokio::time::timeout(Duration::from_secs(1), hears.recv())
        .await
        .expect("the matching request reaches the server");
    assert_eq!(heard.as_deref(), Some(&b"xCOMMIT"[..]));
    assert_eq!(
        read(&mut orphaned).await.as_deref(),
        Some(&[][..]),
        "its client reads EOF"
    );
    drop(orphaned);
    assert!(
        tokio::time::timeout(QUIET * 2, hears.recv()).await.is_err(),
        "the server hears nothing more, not even EOF"
    );
    assert_eq!(proxy.orphaned(), 1);
    assert_eq!(proxy.fault(), Fault::PassThrough, "one shot");
    other.write_all(b"COMMIT").await.expect("write");
    let heard = tokio::time::timeout(Duration::from_secs(1), hears.recv())
        .await
        .expect("other connections flow");
    assert_eq!(heard.as_deref(), Some(&b"COMMIT"[..]));
}

#[tokio::test]
async fn server_gone_closes_the_server_and_keeps_the_client_silent() {
    let (addr, mut hears) = listening_server().await;
    let proxy = FaultProxy::start(&addr).await.expect("proxy");
    let mut socket = client(&proxy).await;
    socket.write_all(b"hi").await.expect("write");
    let first = tokio::time::timeout(Duration::from_secs(1), hears.recv())
        .await
        .expect("the server hears the client");
    assert_eq!(first.as_deref(), Some(&b"hi"[..]));
    proxy.set(Fault::ServerGone);
    let last = tokio::time::timeout(Duration::from_secs(1), hears.recv())
        .await
        .expect("the server's socket closes");
    assert_eq!(last.as_deref(), Some(&[][..]), "the server reads EOF");
    socket
        .write_all(b"anyone?")
        .await
        .expect("the client may still send");
    assert_eq!(
        read(&mut socket).await,
        None,
        "the client hears nothing, not even EOF"
    );
    proxy.set(Fault::PassThrough);
    assert_eq!(read(&mut socket).await, None, "it stays so");
    let mut later = client(&proxy).await;
    later.write_all(b"again").await.expect("write");
    let heard = tokio::time::timeout(Duration::from_secs(1), hears.recv())
        .await
        .expect("a later connection flows");
    assert_eq!(heard.as_deref(), Some(&b"again"[..]));
}
