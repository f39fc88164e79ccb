//! The shared conformance suite against stores opened for one commit (C15): such a store's
//! reservations go through the engine's in-process claims, and nothing else changes.

mod common;

idem_core::conformance_tests!(common::SqliteOneCommit);
idem_ops::operator_tests!(common::SqliteOneCommit);
