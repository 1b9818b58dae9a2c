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

/// The Raft id a replica's certificate name `r<id>` carries (`None`: not
/// such a name; ids are non-zero, written without leading zeros). The
/// region's peer port takes only such certificates, so no node (its
/// agent's certificate names it) may be named so.
pub fn replica_id(name: &str) -> Option<u64> {
    let digits = name.strip_prefix('r')?;
    if digits.starts_with('0') || !digits.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    digits.parse().ok().filter(|id| *id != 0)
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
    fn replica_names_carry_their_id() {
        assert_eq!(replica_id("r1"), Some(1));
        assert_eq!(replica_id("r42"), Some(42));
        for name in [
            "r0", "r01", "r", "r1a", "1", "rr1", "node-r1", "c1", "R1", "r-1", "",
        ] {
            assert_eq!(replica_id(name), None, "{name}");
        }
    }

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
