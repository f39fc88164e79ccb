//! What the proxy does to the traffic: the faults it can be switched to.

/// How the proxy treats the traffic of every connection, the open ones and those to come.
/// Switch with [`FaultProxy::set`](super::FaultProxy::set) at any moment, traffic flowing.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Fault {
    /// Every byte is forwarded, both ways, as it arrives.
    PassThrough,
    /// Nothing is forwarded in either direction and every socket stays open: a server that
    /// froze, or a network that blackholes its packets. New connections are accepted and
    /// connected upstream, then frozen too. Bytes already read wait in the proxy and flow again
    /// once the proxy is switched to another fault.
    Freeze,
    /// One direction is closed (a FIN is sent that way) and whatever would travel in it is
    /// discarded; the other keeps flowing. Switching back to another fault does not reopen a
    /// direction already closed on an open connection; connections opened later flow again.
    HalfOpen(Direction),
    /// Pass-through until a request matches, then its answer is lost; see [`LoseAnswer`].
    LoseAnswer(LoseAnswer),
    /// Pass-through until a request matches, then it and everything after it on that connection
    /// wait in the proxy; see [`Hold`].
    Hold(Hold),
    /// A [`Hold`] that fired: one connection's requests wait in the proxy, every other
    /// connection passes through. Switching to any other fault lets the held bytes flow on.
    Holding(Hold),
    /// Every piece, either way, is forwarded this long after it was read: a slow network or a
    /// server that answers late. A connection forwards one piece at a time, so a request and
    /// its answer take at least twice the delay. Pieces read while it is set keep their delay
    /// when the proxy is switched to another fault.
    Delay(std::time::Duration),
    /// Pass-through until a request matches, then that connection is made half-open: see
    /// [`Orphan`].
    Orphan(Orphan),
    /// The client's side of every connection is closed (the client reads EOF) while the
    /// server's socket stays open and hears nothing more, not even a FIN: the server's half of
    /// a half-open connection, as when the client's host vanished or a NAT forgot the flow.
    /// The server learns nothing until its own timeouts end the session. A connection treated
    /// so stays so; connections opened after the proxy is switched to another fault flow.
    ClientGone,
    /// The mirror of [`ClientGone`](Fault::ClientGone): the server's side of every connection
    /// is closed while the client's socket stays open and hears nothing more, whatever it
    /// sends: the client's half of a half-open connection, as when the server's sessions ended
    /// during a partition (a restart, a failover, its own keepalive) and their FIN was lost.
    /// The client learns nothing until its own deadlines give up. A connection treated so
    /// stays so; connections opened after the proxy is switched to another fault flow.
    ServerGone,
}

/// A direction of the traffic.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Direction {
    /// From the client (the store) to the server.
    ToServer,
    /// From the server to the client.
    ToClient,
}

/// The bytes that end PostgreSQL's answer to a statement run outside a transaction (or to a
/// `COMMIT`): ReadyForQuery, idle. The server has committed when it sends them.
pub const READY_FOR_QUERY_IDLE: &[u8] = b"Z\0\0\0\x05I";

/// The bytes that end PostgreSQL's answer to a statement inside an open transaction:
/// ReadyForQuery, in a transaction block.
pub const READY_FOR_QUERY_IN_TRANSACTION: &[u8] = b"Z\0\0\0\x05T";

/// Loses the answer to one request, on one connection, once.
///
/// Traffic passes through until the client sends bytes containing [`request`](Self::request)
/// (matched across reads). Those bytes and everything the client sends after them still reach
/// the server, which runs (and commits) the request; the server's reply is swallowed up to and
/// including [`reply_end`](Self::reply_end), and then both sockets of that connection are
/// closed: the client sees its connection drop with no answer. The proxy then switches itself
/// back to [`Fault::PassThrough`], so a retry on a new connection gets through.
///
/// The pattern must be in the message that runs the request: with prepared statements the SQL
/// text travels only in the Parse message, answered before the statement runs, so match a
/// parameter (its Bind message) instead: a key's text, or a token's raw bytes. With the simple
/// protocol the parameters are in the statement's text (a token as hex).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LoseAnswer {
    /// What the request contains.
    pub request: Vec<u8>,
    /// What ends the server's reply to it.
    pub reply_end: Vec<u8>,
}

impl LoseAnswer {
    /// Loses the answer to the first request containing `request`, a statement that runs
    /// outside a transaction or a `COMMIT` (the reply ends with [`READY_FOR_QUERY_IDLE`]).
    pub fn to(request: impl Into<Vec<u8>>) -> Self {
        Self {
            request: request.into(),
            reply_end: READY_FOR_QUERY_IDLE.to_vec(),
        }
    }

    /// The reply ends with `reply_end` instead (e.g. [`READY_FOR_QUERY_IN_TRANSACTION`]).
    pub fn reply_end(mut self, reply_end: impl Into<Vec<u8>>) -> Self {
        self.reply_end = reply_end.into();
        self
    }
}

/// The simple-protocol `COMMIT` that sqlx sends to commit a transaction (a Query message:
/// type, length 11, the text, NUL): never the text inside another statement, such as
/// `BEGIN ISOLATION LEVEL READ COMMITTED`.
pub const COMMIT_QUERY: &[u8] = b"Q\0\0\0\x0bCOMMIT\0";

/// Holds one request, on one connection, once.
///
/// Traffic passes through until the client sends bytes containing [`request`](Self::request)
/// (matched across reads). From the start of the match on, nothing that client sends on that
/// connection reaches the server: the bytes wait in the proxy and both sockets stay open (the
/// server's side still flows to the client). The proxy shows [`Fault::Holding`] then, and every
/// other connection, open or to come, passes through. Once the proxy is switched to any other
/// fault, the held bytes flow on, in order, and so does what the client sent after them (a
/// fault that closed the way to the server discards them; they are not matched again).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Hold {
    /// What the held request contains.
    pub request: Vec<u8>,
}

impl Hold {
    /// Holds the first request containing `request` (e.g. [`COMMIT_QUERY`]).
    pub fn to(request: impl Into<Vec<u8>>) -> Self {
        Self {
            request: request.into(),
        }
    }
}

/// Makes one connection half-open, once, at one request.
///
/// Traffic passes through until the client sends bytes containing [`request`](Self::request)
/// (matched across reads). Those bytes still reach the server, which runs the request; then
/// the client's side of that connection is closed (the client reads EOF, the server's answer is
/// never forwarded) and the server's socket stays open and silent, as with
/// [`Fault::ClientGone`]: a session the server still believes in, inside its transaction. The
/// proxy then switches itself back to [`Fault::PassThrough`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Orphan {
    /// What the request contains.
    pub request: Vec<u8>,
}

impl Orphan {
    /// Orphans the connection that sends the first request containing `request`.
    pub fn at(request: impl Into<Vec<u8>>) -> Self {
        Self {
            request: request.into(),
        }
    }
}

impl From<Orphan> for Fault {
    fn from(orphan: Orphan) -> Self {
        Fault::Orphan(orphan)
    }
}

impl From<Hold> for Fault {
    fn from(hold: Hold) -> Self {
        Fault::Hold(hold)
    }
}

impl From<LoseAnswer> for Fault {
    fn from(lose: LoseAnswer) -> Self {
        Fault::LoseAnswer(lose)
    }
}
