//! Where a command writes.

use crate::failure::Failure;
use crate::render;
use serde_json::Value;
use std::io::Write;

/// Where a command writes: the answer on `out`, progress and notes on `err`.
pub(crate) struct Io<'a> {
    /// The answer (a table or one JSON document).
    pub out: &'a mut dyn Write,
    /// Progress, notes, the next cursor of a table listing.
    pub err: &'a mut dyn Write,
    /// `--json`.
    pub json: bool,
    /// Whether `out` is a terminal (a watch clears the screen between runs only then).
    pub terminal: bool,
}

impl Io<'_> {
    /// Writes `value` as one JSON document on `out`.
    pub(crate) fn json(&mut self, value: &Value) -> Result<(), Failure> {
        writeln!(self.out, "{}", render::json_text(value))?;
        Ok(())
    }
}
