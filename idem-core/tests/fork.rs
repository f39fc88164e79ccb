//! Fencing tokens after `fork` (C6): pre-forked workers must never hold the same token. A
//! process makes tokens, forks, and parent and child each make more: no token may repeat.
#![allow(unsafe_code)] // fork, pipe, waitpid: the test has to fork a real process.

use idem_core::FencingToken;
use std::collections::HashSet;
use std::io::{Read, Write};

const PER_PROCESS: usize = 64;

#[test]
fn c06_tokens_never_repeat_across_a_fork() {
    // Warm up whatever state token generation keeps, as a server does before it forks.
    let before: Vec<FencingToken> = (0..PER_PROCESS).map(|_| FencingToken::generate()).collect();
    let (mut reader, mut writer) = std::io::pipe().expect("pipe");
    // SAFETY: the child only generates tokens, writes them to the pipe and `_exit`s; it does not
    // return into the test harness or touch its threads' state.
    let pid = unsafe { libc::fork() };
    assert!(pid >= 0, "fork failed");
    if pid == 0 {
        drop(reader);
        let mut bytes = Vec::with_capacity(PER_PROCESS * 16);
        for _ in 0..PER_PROCESS {
            bytes.extend_from_slice(FencingToken::generate().as_bytes());
        }
        let code = i32::from(writer.write_all(&bytes).is_err());
        drop(writer);
        // SAFETY: ends the child at once, without running the parent's destructors twice.
        unsafe { libc::_exit(code) };
    }
    drop(writer);
    let parent: Vec<FencingToken> = (0..PER_PROCESS).map(|_| FencingToken::generate()).collect();
    let mut bytes = Vec::new();
    reader
        .read_to_end(&mut bytes)
        .expect("read the child's tokens");
    let mut status = 0;
    // SAFETY: waits for the child forked above.
    let waited = unsafe { libc::waitpid(pid, &mut status, 0) };
    assert_eq!(waited, pid);
    assert!(
        libc::WIFEXITED(status) && libc::WEXITSTATUS(status) == 0,
        "child failed"
    );
    assert_eq!(bytes.len(), PER_PROCESS * 16, "the child sent its tokens");
    let child: Vec<FencingToken> = bytes
        .chunks_exact(16)
        .map(|c| FencingToken::from_slice(c).expect("16 bytes"))
        .collect();
    let all: HashSet<FencingToken> = before
        .iter()
        .chain(&parent)
        .chain(&child)
        .copied()
        .collect();
    assert_eq!(
        all.len(),
        3 * PER_PROCESS,
        "a token repeated across the fork"
    );
}
