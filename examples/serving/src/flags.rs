//! A command line of flags with values (`--name value` or `--name=value`), each flag standing in
//! for an environment variable: a flag given beats its variable, a variable beats the default.

use std::fmt;

/// A flag that takes a value, and the environment variable read when it is not given.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Flag {
    /// The flag, `--name`.
    pub name: &'static str,
    /// The environment variable.
    pub env: &'static str,
}

/// Why a command line was not read.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum FlagError {
    /// `-h` or `--help`.
    Help,
    /// An argument that is none of the flags.
    Unknown(String),
    /// A flag at the end of the command line, without its value.
    NoValue(String),
}

impl FlagError {
    /// What to tell the user: the usage alone for `--help`, else the error and the usage.
    pub fn with_usage(&self, usage: &str) -> String {
        match self {
            FlagError::Help => usage.to_owned(),
            other => format!("{other}\n{usage}"),
        }
    }
}

impl fmt::Display for FlagError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            FlagError::Help => f.write_str("help asked for"),
            FlagError::Unknown(argument) => write!(f, "unknown argument {argument}"),
            FlagError::NoValue(flag) => write!(f, "{flag} needs a value"),
        }
    }
}

impl std::error::Error for FlagError {}

/// The values of a command line's flags, each from the command line, else from its variable.
#[derive(Debug, Clone, Default)]
pub struct Flags {
    values: Vec<(&'static str, Option<String>)>,
}

impl Flags {
    /// Reads `args` (without the program name) for the flags of `known`, the variables of the
    /// flags not given from `env` (which gives `None` for a variable not set).
    pub fn read(
        args: impl IntoIterator<Item = String>,
        known: &[&[Flag]],
        env: impl Fn(&str) -> Option<String>,
    ) -> Result<Self, FlagError> {
        let mut values: Vec<(&'static str, Option<String>)> = known
            .iter()
            .flat_map(|flags| flags.iter())
            .map(|flag| (flag.name, env(flag.env)))
            .collect();
        let mut args = args.into_iter();
        while let Some(argument) = args.next() {
            let (name, inline) = match argument.split_once('=') {
                Some((name, value)) => (name.to_owned(), Some(value.to_owned())),
                None => (argument.clone(), None),
            };
            if name == "-h" || name == "--help" {
                return Err(FlagError::Help);
            }
            let Some((_, slot)) = values.iter_mut().find(|(flag, _)| *flag == name) else {
                return Err(FlagError::Unknown(name));
            };
            let value = inline.or_else(|| args.next());
            *slot = Some(value.ok_or(FlagError::NoValue(name))?);
        }
        Ok(Self { values })
    }

    /// The value of the flag `name` (`--name`), if it was given or its variable set.
    pub fn get(&self, name: &str) -> Option<&str> {
        self.values
            .iter()
            .find(|(flag, _)| *flag == name)
            .and_then(|(_, value)| value.as_deref())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const FLAGS: &[Flag] = &[
        Flag {
            name: "--addr",
            env: "ADDR",
        },
        Flag {
            name: "--lease-ms",
            env: "LEASE_MS",
        },
    ];

    fn read(args: &[&str]) -> Result<Flags, FlagError> {
        Flags::read(args.iter().map(|s| (*s).to_owned()), &[FLAGS], |name| {
            (name == "LEASE_MS").then(|| "9".to_owned())
        })
    }

    #[test]
    fn flags_beat_variables_and_take_values_inline_or_after() {
        let flags = read(&["--addr=a:1"]).expect("flags");
        assert_eq!(flags.get("--addr"), Some("a:1"));
        assert_eq!(flags.get("--lease-ms"), Some("9"));
        let flags = read(&["--lease-ms", "5", "--addr", "b"]).expect("flags");
        assert_eq!(flags.get("--lease-ms"), Some("5"));
        assert_eq!(flags.get("--addr"), Some("b"));
        assert_eq!(flags.get("--nope"), None);
    }

    #[test]
    fn help_unknown_and_missing_values_are_errors() {
        assert_eq!(read(&["--help"]).expect_err("help"), FlagError::Help);
        assert_eq!(
            read(&["--nope=1"]).expect_err("unknown"),
            FlagError::Unknown("--nope".into())
        );
        let missing = read(&["--addr"]).expect_err("no value");
        assert_eq!(missing, FlagError::NoValue("--addr".into()));
        assert_eq!(missing.with_usage("usage"), "--addr needs a value\nusage");
        assert_eq!(FlagError::Help.with_usage("usage"), "usage");
    }
}
