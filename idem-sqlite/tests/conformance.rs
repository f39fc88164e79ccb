//! The shared conformance and transactional suites against `SqliteStore`, every scenario on a
//! table of its own in one database file; and the same suite from two processes at once on one
//! file.

mod common;

idem_core::conformance_tests!(common::Sqlite);
idem_ops::operator_tests!(common::Sqlite);
idem_core::transactional_tests!(common::Sqlite);
idem_core::transact_tests!(common::Sqlite);

/// Two child processes run this whole suite (but the closure's scenarios) at once against one
/// database file (named by `IDEM_SQLITE_DB`): scenarios of both share the file, its writer lock
/// and its purges, and both pass. No process-wide lock keeps them apart: each scenario has its
/// own table.
#[test]
fn suite_from_two_processes_at_once_on_one_file() {
    if std::env::var_os("IDEM_SQLITE_DB").is_some() {
        return; // a child: the suite itself is what it runs
    }
    let dir = tempfile::tempdir().expect("dir");
    let db = dir.path().join("shared.db");
    let children: Vec<_> = (0..2)
        .map(|_| {
            std::process::Command::new(std::env::current_exe().expect("test binary"))
                // The closure's scenarios hold the file's write lock while their effect waits
                // (to prove duplicates do not): beside them the other process's scenarios,
                // whose leases are 400 ms, would lose theirs. They run in the parent's suite.
                .args([
                    "--skip",
                    "suite_from_two_processes_at_once_on_one_file",
                    "--skip",
                    "txc_",
                    "--quiet",
                ])
                .env("IDEM_SQLITE_DB", &db)
                .stdout(std::process::Stdio::piped())
                .stderr(std::process::Stdio::piped())
                .spawn()
                .expect("spawn")
        })
        .collect();
    for child in children {
        let out = child.wait_with_output().expect("wait");
        assert!(
            out.status.success(),
            "a process failed:\n{}\n{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        let conformance: &[&str] = idem_core::__idem_conformance_scenarios!(names);
        let transactional: &[&str] = idem_core::__idem_transactional_scenarios!(names);
        let operator: &[&str] = idem_ops::__idem_operator_scenarios!(names);
        let expected = format!(
            "{} passed",
            conformance.len() + operator.len() + transactional.len()
        );
        let stdout = String::from_utf8_lossy(&out.stdout);
        assert!(stdout.contains(&expected), "expected {expected}:\n{stdout}");
    }
}
