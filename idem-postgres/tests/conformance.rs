//! The shared conformance suite against `PgStore` on a real server (prepared statements), and
//! the transactional suites (guard style, and the closure with two commits and with one) at each
//! isolation level. Every scenario gets a table of its own.

mod common;

use common::Pg;
use idem_postgres::Isolation;

idem_core::conformance_tests!(Pg::direct(Isolation::ReadCommitted));
idem_ops::operator_tests!(Pg::direct(Isolation::ReadCommitted));

/// Every reservation reading first (`PgStoreBuilder::read_first`).
mod read_first {
    use super::*;
    idem_core::conformance_tests!(Pg::reading_first(Isolation::ReadCommitted));
    idem_core::transact_tests!(Pg::reading_first(Isolation::ReadCommitted));
}

mod read_committed {
    use super::*;
    idem_core::transactional_tests!(Pg::direct(Isolation::ReadCommitted));
    idem_core::transact_tests!(Pg::direct(Isolation::ReadCommitted));
}

mod repeatable_read {
    use super::*;
    idem_core::transactional_tests!(Pg::direct(Isolation::RepeatableRead));
    idem_core::transact_tests!(Pg::direct(Isolation::RepeatableRead));
}

mod serializable {
    use super::*;
    idem_core::transactional_tests!(Pg::direct(Isolation::Serializable));
    // One commit is refused at SERIALIZABLE (`one_commit::c15_*_serializable_*`).
    idem_core::transact_tests!(two_commits: Pg::direct(Isolation::Serializable));
}
