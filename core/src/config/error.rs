//! The error of a config file: every problem found in it, each with its key
//! path, its place in the file and the offending value.

use std::fmt;

/// What kind of mistake one [`ConfigIssue`] is.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum IssueKind {
    /// The file is not valid TOML.
    Syntax,
    /// A key the schema does not know (often a typo).
    UnknownKey,
    /// A required key is absent.
    MissingKey,
    /// A value of the wrong TOML type (a string where a number belongs...).
    WrongType,
    /// A value of the right type outside its allowed range.
    OutOfRange,
    /// A malformed value: a bad name, an unknown enum word.
    Invalid,
    /// A second entry with a name that must be unique.
    Duplicate,
    /// A reference to a GPU model (or another item) that is not defined.
    UnknownReference,
    /// A (GPU model, pool kind) in use without a price.
    MissingPrice,
    /// Values that are each fine but contradict one another.
    Inconsistent,
}

/// One problem in a config file.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ConfigIssue {
    /// What kind of problem this is.
    pub kind: IssueKind,
    /// Key path of the offending value, e.g. `pools[1].nodes[3].gpus[0].model`
    /// (empty for a syntax error or the document itself).
    pub path: String,
    /// 1-based line of the offending value (for a missing key: of the table
    /// that lacks it), when known.
    pub line: Option<u32>,
    /// 1-based column (in characters) that goes with `line`.
    pub column: Option<u32>,
    /// What is wrong, in words.
    pub message: String,
    /// The offending value as written (strings quoted), when there is one.
    pub got: Option<String>,
}

impl fmt::Display for ConfigIssue {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if let (Some(l), Some(c)) = (self.line, self.column) {
            write!(f, "{l}:{c}: ")?;
        }
        if !self.path.is_empty() {
            write!(f, "{}: ", self.path)?;
        }
        f.write_str(&self.message)?;
        if let Some(got) = &self.got {
            write!(f, " (got {got})")?;
        }
        Ok(())
    }
}

/// Every problem found in one config file.
///
/// `Display` lists them one per line, in file order:
///
/// ```text
/// topology.toml:14:19: pools[1].nodes[0].gpus[0].model: unknown GPU model (expected one of: A100-80G) (got "H900")
/// topology.toml:20:1: pricing.tiers.burstable: missing required key
/// ```
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub struct ConfigError {
    /// The file name given to the parser (used as the prefix of each line).
    pub file: String,
    /// All the problems, in the order they appear in the file.
    pub issues: Vec<ConfigIssue>,
}

impl fmt::Display for ConfigError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for (i, issue) in self.issues.iter().enumerate() {
            if i > 0 {
                f.write_str("\n")?;
            }
            // "file:line:col: path: problem" or "file: path: problem".
            if issue.line.is_some() {
                write!(f, "{}:{issue}", self.file)?;
            } else {
                write!(f, "{}: {issue}", self.file)?;
            }
        }
        Ok(())
    }
}

impl ConfigError {
    /// The error of `file` with `issues`, in file order (issues without a
    /// place last; equal places keep their order).
    pub fn in_file_order(file: &str, mut issues: Vec<ConfigIssue>) -> Self {
        issues.sort_by_key(|i| (i.line.is_none(), i.line, i.column));
        ConfigError {
            file: file.to_string(),
            issues,
        }
    }

    /// The issues at exactly this key path.
    pub fn at<'a>(&'a self, path: &'a str) -> impl Iterator<Item = &'a ConfigIssue> + 'a {
        self.issues.iter().filter(move |i| i.path == path)
    }
}
