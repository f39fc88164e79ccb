//! One proxied connection: the bytes between one client socket and its server socket, treated
//! as the current [`Fault`] says.

use super::fault::{Direction, Fault, Hold};
use super::matcher::Matcher;
use super::Control;
use std::sync::Arc;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio::sync::watch;

/// How much is read from a socket at once.
const PIECE: usize = 64 * 1024;

/// Forwards between `client` and `server` until both have closed, the answer to a request is
/// lost (both sockets are closed then), or the proxy is dropped. While a request is held, the
/// client's side is not read at all: what it sends next waits behind the held bytes.
pub(super) async fn forward(client: TcpStream, server: TcpStream, control: Arc<Control>) {
    let mut faults = control.faults.subscribe();
    let (mut from_client, mut to_client) = client.into_split();
    let (mut from_server, mut to_server) = server.into_split();
    let (mut up, mut down) = (vec![0u8; PIECE], vec![0u8; PIECE]);
    // Whether each side may still send (no EOF read from it yet).
    let (mut client_sends, mut server_sends) = (true, true);
    // Whether each direction was closed (a half-open fault, or its sender's EOF passed on).
    let (mut up_closed, mut down_closed) = (false, false);
    // The request of the armed `LoseAnswer` or `Hold`, looked for in what the client sends.
    let mut watching: Option<Matcher> = None;
    // Once this connection's answer is being lost: the end of the reply to swallow.
    let mut swallowing: Option<Matcher> = None;
    // Once this connection's request is held: the hold, and the bytes read and not forwarded.
    let mut holding: Option<(Hold, Vec<u8>)> = None;
    // Once this connection was orphaned: its client's side is gone.
    let mut orphaned = false;
    loop {
        if !client_sends && !server_sends {
            return;
        }
        let Some(fault) = unfrozen(&mut faults).await else {
            return;
        };
        if fault == Fault::ClientGone || orphaned {
            // The client's sockets go; the server's stay open and silent until the proxy is
            // dropped (which drops this task).
            drop((from_client, to_client));
            let _silent = (from_server, to_server);
            return std::future::pending().await;
        }
        if fault == Fault::ServerGone {
            // The server's sockets go; the client's stay open, and what it sends is read and
            // discarded, until the proxy is dropped.
            drop((from_server, to_server));
            let _silent = to_client;
            while matches!(from_client.read(&mut up).await, Ok(1..)) {}
            return std::future::pending().await;
        }
        match fault {
            Fault::HalfOpen(Direction::ToServer) if !up_closed => {
                let _ = to_server.shutdown().await;
                up_closed = true;
            }
            Fault::HalfOpen(Direction::ToClient) if !down_closed => {
                let _ = to_client.shutdown().await;
                down_closed = true;
            }
            _ => {}
        }
        // Switched away from this connection's hold: what it held flows on.
        if let Some((hold, _)) = &holding {
            if !matches!(&fault, Fault::Holding(h) if h == hold) {
                let (_, held) = holding.take().expect("holding");
                if !up_closed && to_server.write_all(&held).await.is_err() {
                    return;
                }
            }
        }
        tokio::select! {
            // The proxy was dropped (its fault switch with it): the link closes, by design.
            changed = faults.changed() => if changed.is_err() { return },
            read = from_client.read(&mut up), if client_sends && holding.is_none() => {
                let n = match read {
                    Ok(n) if n > 0 => n,
                    _ => {
                        client_sends = false;
                        if !up_closed {
                            let _ = to_server.shutdown().await;
                            up_closed = true;
                        }
                        continue;
                    }
                };
                // A fault switched while the piece was read applies to it.
                let Some(fault) = unfrozen(&mut faults).await else { return };
                if up_closed || matches!(fault, Fault::ClientGone | Fault::ServerGone) {
                    continue;
                }
                delayed(&fault).await;
                match &fault {
                    Fault::LoseAnswer(lose) => {
                        let matcher = watch(&mut watching, &lose.request);
                        // Swallow before forwarding: the reply may come back at once.
                        if swallowing.is_none() && matcher.feed(&up[..n]) && control.claim(lose) {
                            swallowing = Some(Matcher::new(&lose.reply_end));
                        }
                    }
                    Fault::Hold(hold) => {
                        let matcher = watch(&mut watching, &hold.request);
                        if let Some(start) = matcher.find(&up[..n]) {
                            if control.claim_hold(hold) {
                                // What came before the request still goes; from it on, held.
                                if to_server.write_all(&up[..start]).await.is_err() {
                                    return;
                                }
                                holding = Some((hold.clone(), up[start..n].to_vec()));
                                continue;
                            }
                        }
                    }
                    Fault::Orphan(orphan) => {
                        let matcher = watch(&mut watching, &orphan.request);
                        if matcher.feed(&up[..n]) && control.claim_orphan(orphan) {
                            orphaned = true;
                            if to_server.write_all(&up[..n]).await.is_err() {
                                return;
                            }
                            continue;
                        }
                    }
                    _ => watching = None,
                }
                if to_server.write_all(&up[..n]).await.is_err() {
                    return;
                }
            }
            read = from_server.read(&mut down), if server_sends => {
                let n = match read {
                    Ok(n) if n > 0 => n,
                    _ => {
                        server_sends = false;
                        if !down_closed {
                            let _ = to_client.shutdown().await;
                            down_closed = true;
                        }
                        continue;
                    }
                };
                if let Some(end) = &mut swallowing {
                    if end.feed(&down[..n]) {
                        // The server answered in full and nothing reached the client: drop
                        // both sockets.
                        return;
                    }
                    continue;
                }
                let Some(fault) = unfrozen(&mut faults).await else { return };
                if down_closed || matches!(fault, Fault::ClientGone | Fault::ServerGone) {
                    continue;
                }
                delayed(&fault).await;
                if to_client.write_all(&down[..n]).await.is_err() {
                    return;
                }
            }
        }
    }
}

/// Waits out `fault`'s delay, if it is a [`Fault::Delay`].
async fn delayed(fault: &Fault) {
    if let Fault::Delay(delay) = fault {
        tokio::time::sleep(*delay).await;
    }
}

/// The matcher in `slot` if it looks for `pattern`, else a new one for it.
fn watch<'a>(slot: &'a mut Option<Matcher>, pattern: &[u8]) -> &'a mut Matcher {
    if !matches!(slot, Some(m) if m.pattern() == pattern) {
        *slot = Some(Matcher::new(pattern));
    }
    slot.as_mut().expect("a matcher")
}

/// The current fault once it is not [`Fault::Freeze`] (waiting as long as it is); `None` when
/// the proxy is gone.
async fn unfrozen(faults: &mut watch::Receiver<Fault>) -> Option<Fault> {
    loop {
        let fault = faults.borrow_and_update().clone();
        if fault != Fault::Freeze {
            return Some(fault);
        }
        faults.changed().await.ok()?;
    }
}
