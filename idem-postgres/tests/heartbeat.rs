//! Renewals that the application cannot starve (C9), on PostgreSQL: with every worker of the
//! application's runtime blocked by handlers for longer than the lease, the engine's heartbeat
//! still renews the leases, on connections its own thread opened (the store's others are driven
//! by the blocked runtime), so another instance never takes over a live execution. The shared
//! scenario needs a runtime of its own, hence a plain test.

mod common;

use common::Pg;
use idem_postgres::Isolation;

#[test]
fn c09_renewals_do_not_depend_on_the_applications_workers() {
    idem_core::testing::c09_renewals_do_not_depend_on_the_applications_workers(&Pg::direct(
        Isolation::ReadCommitted,
    ));
}
