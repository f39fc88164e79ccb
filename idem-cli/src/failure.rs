//! How a command ended: the exit status and what is left to say.

use crate::target::Usage;
use idem_core::Error;

/// How a command ended, for the exit status.
#[derive(Debug)]
pub(crate) enum Failure {
    /// The command line was wrong (exit 2).
    Usage(String),
    /// The store refused or failed (exit 1).
    Idem(Error),
    /// `inspect` found no record, `doubt show` neither record nor trail, `doubt settle` or
    /// `doubt release` no record in doubt (exit 3); what was missing is already said.
    NotFound,
    /// `doubt settle` or `doubt release` lost: the record changed since it was read (exit 4);
    /// already said.
    Contested,
    /// Writing the output failed (a closed pipe): exit 1, nothing to add.
    Output(std::io::Error),
}

/// Input the command line gave that idem refuses (a key, a consumer, a cursor): exit 2.
pub(crate) fn usage(error: Error) -> Failure {
    Failure::Usage(error.to_string())
}

impl From<Error> for Failure {
    fn from(error: Error) -> Self {
        Failure::Idem(error)
    }
}

impl From<Usage> for Failure {
    fn from(usage: Usage) -> Self {
        Failure::Usage(usage.0)
    }
}

impl From<std::io::Error> for Failure {
    fn from(error: std::io::Error) -> Self {
        Failure::Output(error)
    }
}
