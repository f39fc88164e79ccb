//! Renewals that the application cannot starve (C9), on SQLite: the shared scenario, which
//! needs a runtime of its own (every worker blocked by handlers past the lease).

mod common;

#[test]
fn c09_renewals_do_not_depend_on_the_applications_workers() {
    idem_core::testing::c09_renewals_do_not_depend_on_the_applications_workers(&common::Sqlite);
}
