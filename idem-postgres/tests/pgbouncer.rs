//! The whole conformance and transactional suites through a real PgBouncer in transaction mode
//! (the simple query protocol: nothing is kept on a server connection between transactions).

mod common;

idem_core::conformance_tests!(common::Pg::bouncer());
idem_ops::operator_tests!(common::Pg::bouncer());
idem_core::transactional_tests!(common::Pg::bouncer());
idem_core::transact_tests!(common::Pg::bouncer());
