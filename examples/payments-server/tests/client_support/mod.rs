//! What the idem-client tests share: this server run as a real child process, and a recording
//! TCP proxy in front of it.

#![allow(dead_code)]

pub(crate) mod payments;
pub(crate) mod proxy;
