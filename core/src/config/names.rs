//! The rule for names in config files (pools, nodes, GPU models, tenants).
//!
//! A name is 1 to 63 ASCII letters, digits, `-`, `_` or `.`, starting with
//! a letter or digit, so that it can stand in a URL path, a `edge:<pool>`
//! preference and a metrics label without escaping.

use super::error::IssueKind;
use super::reader::{quote, Field, Issues};

/// The longest name accepted.
pub const MAX_NAME_LEN: usize = 63;

/// Whether `name` follows the naming rule.
pub fn is_valid_name(name: &str) -> bool {
    let mut chars = name.chars();
    let first_ok = chars.next().is_some_and(|c| c.is_ascii_alphanumeric());
    first_ok
        && name.len() <= MAX_NAME_LEN
        && chars.all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.'))
}

/// The name in `f` if it is present and valid; reports it otherwise.
pub(crate) fn check_name(issues: &mut Issues<'_>, f: &Field<String>) -> Option<String> {
    let name = f.v.as_ref()?;
    if is_valid_name(name) {
        Some(name.clone())
    } else {
        issues.report(
            &f.at,
            IssueKind::Invalid,
            format!(
                "a name is 1 to {MAX_NAME_LEN} ASCII letters, digits, '-', '_' or '.', starting with a letter or digit"
            ),
            Some(quote(name)),
        );
        None
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_follow_the_rule() {
        for ok in ["acme", "A100-SXM4-80GB", "edge-hk.1", "n_0", "7"] {
            assert!(is_valid_name(ok), "{ok}");
        }
        for bad in ["", "-x", "a b", "über", "a/b", &"x".repeat(64)] {
            assert!(!is_valid_name(bad), "{bad}");
        }
    }
}
