//! Serving the example servers to clients that may be slow or hostile: HTTP/1 connections with a deadline
//! for the request head, a deadline and a byte budget for request bodies, a cap on open
//! connections, and every request run to its end on a task of its own, which writes its log
//! line; the flags that set those limits, the signal to stop, and what the test hooks read
//! from a request.

mod body;
mod connections;
mod flags;
mod limits;
mod request_log;
mod signal;
mod tasks;
mod test_hooks;

pub use body::{buffer_body, BodyGate, Refusal};
pub use connections::serve;
pub use flags::{Flag, FlagError, Flags};
pub use limits::Limits;
pub use request_log::{run_logged, Ended};
pub use signal::shutdown_signal;
pub use tasks::Tasks;
pub use test_hooks::{test_delay, MAX_TEST_DELAY};
