//! A path named in a config file, with the place it was written: core does
//! no I/O, so the binary that opens the file reports a missing or unreadable
//! one at the key that names it (`agent.toml:9:11: tls.cert: … (got "…")`).

use super::error::{ConfigIssue, IssueKind};
use super::reader::{line_col, quote, Field};

/// A path-valued key of a config file.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FileRef {
    /// The path as written (relative paths are relative to the config file).
    pub path: String,
    /// Its key path, e.g. `tls.cert` or `runtimes.vllm.template`.
    pub key: String,
    /// 1-based line of the value.
    pub line: Option<u32>,
    /// 1-based column of the value.
    pub column: Option<u32>,
}

impl FileRef {
    /// An issue about this file (e.g. "cannot read template: …"), reported
    /// at its key with the path as "got".
    pub fn issue(&self, message: String) -> ConfigIssue {
        ConfigIssue {
            kind: IssueKind::Invalid,
            path: self.key.clone(),
            line: self.line,
            column: self.column,
            message,
            got: Some(quote(&self.path)),
        }
    }

    /// What to run when this TLS file does not exist: the CA comes from
    /// `gsharectl certs init` (once per region, then copied), a certificate
    /// or key from `gsharectl certs issue`. Empty for other files.
    pub fn tls_hint(&self) -> &'static str {
        let leaf = self.key.rsplit('.').next().unwrap_or("");
        if !self.key.contains("tls") {
            ""
        } else if leaf == "ca_cert" {
            "; create the region's CA once with `gsharectl certs init --dir <dir>` \
             and copy its ca.pem to every machine (a second CA cannot link)"
        } else if leaf == "cert" || leaf == "key" {
            "; issue it with `gsharectl certs issue --dir <dir of ca.pem> --name <name>` \
             on the machine that holds the CA key, then copy the .pem and .key here"
        } else {
            ""
        }
    }
}

/// The [`FileRef`] of a string field in `src` (`None` when it was absent or unusable).
pub(crate) fn file_ref(src: &str, f: &Field<String>) -> Option<FileRef> {
    let path = f.v.as_ref()?;
    let (line, column) =
        f.at.span
            .as_ref()
            .map(|s| line_col(src, s.start))
            .map_or((None, None), |(l, c)| (Some(l), Some(c)));
    Some(FileRef {
        path: path.clone(),
        key: f.at.path.clone(),
        line,
        column,
    })
}
