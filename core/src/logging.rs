//! Log set-up of the binaries (feature `logging`; the default build stays
//! pure): one place decides colour, format and filter for `gshare-region`
//! and `gshare-edge`.
//!
//! ```text
//!   RUST_LOG (or the binary's default filter) ─▶ EnvFilter ─▶ [quiet: dropped events] ─▶ stderr
//!                                                            text: ANSI colour only on a terminal
//!                                                            json: one object per line
//! ```
//!
//! Colour: only when stderr is a terminal and `NO_COLOR` is unset, so logs
//! redirected to a file or journald hold no escape codes. `quiet` drops
//! events a binary knows to be noise under its default filter (the region:
//! openraft's errors for a peer that is not up yet, which the region's own
//! peer links report once, as a warning); with `RUST_LOG` set, nothing is
//! dropped.

use std::io::IsTerminal;
use tracing_subscriber::filter::{filter_fn, EnvFilter};
use tracing_subscriber::layer::{Layer, SubscriberExt};
use tracing_subscriber::util::SubscriberInitExt;

/// How log lines are written.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum LogFormat {
    /// `2026-12-01T11:00:00.000Z  INFO target: message key=value`.
    #[default]
    Text,
    /// One JSON object per line (`timestamp`, `level`, `target`, `fields`).
    Json,
}

impl LogFormat {
    /// The names `--log-format` takes.
    pub const NAMES: [&'static str; 2] = ["text", "json"];
}

impl std::str::FromStr for LogFormat {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "text" => Ok(LogFormat::Text),
            "json" => Ok(LogFormat::Json),
            other => Err(format!("unknown log format {other:?} (text or json)")),
        }
    }
}

impl std::fmt::Display for LogFormat {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            LogFormat::Text => "text",
            LogFormat::Json => "json",
        })
    }
}

/// Events a binary drops under its default filter.
pub type Quiet = fn(&tracing::Metadata<'_>) -> bool;

/// Whether colour goes to stderr: a terminal, and `NO_COLOR` unset or empty.
pub fn stderr_wants_colour() -> bool {
    std::io::stderr().is_terminal() && std::env::var_os("NO_COLOR").is_none_or(|v| v.is_empty())
}

/// Installs the global subscriber: `RUST_LOG` if set, else `default_filter`
/// with the events `quiet` names dropped. A second call does nothing.
pub fn init(format: LogFormat, default_filter: &str, quiet: Option<Quiet>) {
    let (filter, quiet) = match EnvFilter::try_from_default_env() {
        Ok(f) => (f, None),
        Err(_) => (EnvFilter::new(default_filter), quiet),
    };
    let keep = filter_fn(move |m| quiet.is_none_or(|q| !q(m)));
    let registry = tracing_subscriber::registry().with(filter);
    let _ = match format {
        LogFormat::Text => registry
            .with(
                tracing_subscriber::fmt::layer()
                    .with_writer(std::io::stderr)
                    .with_ansi(stderr_wants_colour())
                    .with_filter(keep),
            )
            .try_init(),
        LogFormat::Json => registry
            .with(
                tracing_subscriber::fmt::layer()
                    .json()
                    .with_writer(std::io::stderr)
                    .with_ansi(false)
                    .with_filter(keep),
            )
            .try_init(),
    };
}

/// Ends the process with `code` after saying `message`: on stderr as it is
/// (`text`), or as one ERROR log line with the message in `error` (`json`),
/// so that a log shipper reading JSON sees why the process stopped.
pub fn exit_with(format: LogFormat, message: &str, code: i32) -> ! {
    match format {
        LogFormat::Text => eprintln!("{message}"),
        LogFormat::Json => tracing::error!(error = %message, "exiting"),
    }
    std::process::exit(code)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn formats_parse_by_name_and_refuse_others() {
        for name in LogFormat::NAMES {
            assert_eq!(name.parse::<LogFormat>().unwrap().to_string(), name);
        }
        let e = "yaml".parse::<LogFormat>().unwrap_err();
        assert!(e.contains("text or json"), "{e}");
    }
}
