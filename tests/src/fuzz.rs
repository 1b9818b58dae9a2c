//! Fuzzing on stable: proptest strategies that feed parsers of untrusted
//! input with arbitrary bytes and with structure-aware mutations of valid
//! inputs (a real config file with a value swapped for an extreme, a line
//! dropped or doubled, bytes spliced in; a valid frame with a byte flipped
//! or its length forged; a valid JSON body with a field replaced).
//!
//! ```text
//!   seed input ──▶ Edit × 1..8 (byte / line / value / JSON-leaf edits) ──▶ parser
//!                                                                           │
//!   arbitrary bytes ─────────────────────────────────────────────────────▶ ─┤
//!                                                   no panic, bounded output ◀┘
//! ```
//!
//! The number of cases per target is [`cases`]: [`DEFAULT_CASES`] in the
//! normal suite (seconds per target in release), `GSHARE_FUZZ_CASES=N` for
//! a long run. A failure prints the shrunk input that reproduces it.

use proptest::prelude::*;
use proptest::sample::Index;
use proptest::test_runner::Config;
use serde_json::Value;

/// The environment variable that sets the cases per target.
pub const CASES_ENV: &str = "GSHARE_FUZZ_CASES";

/// Cases per target in the normal suite.
pub const DEFAULT_CASES: u32 = 256;

/// Cases per target: `GSHARE_FUZZ_CASES` if set (a positive integer), else
/// [`DEFAULT_CASES`].
pub fn cases() -> u32 {
    std::env::var(CASES_ENV)
        .ok()
        .and_then(|v| v.trim().parse::<u32>().ok())
        .filter(|n| *n > 0)
        .unwrap_or(DEFAULT_CASES)
}

/// The proptest configuration of every fuzz target: [`cases`] cases, no
/// regression files written into the source tree.
pub fn config() -> Config {
    Config {
        cases: cases(),
        failure_persistence: None,
        ..Config::default()
    }
}

/// Values that break naive parsers and arithmetic: zero, one, powers of
/// two at the integer widths, the extremes, non-numbers, wrong types.
pub const EXTREME_VALUES: &[&str] = &[
    "0",
    "1",
    "-1",
    "4294967295",
    "4294967296",
    "9223372036854775807",
    "9223372036854775808",
    "18446744073709551615",
    "18446744073709551616",
    "-9223372036854775808",
    "1e308",
    "-0.0",
    "nan",
    "inf",
    "0x7fffffffffffffff",
    "\"\"",
    "\"x\"",
    "\"\u{0}\u{feff}é\"",
    "[]",
    "[[]]",
    "{}",
    "true",
    "1979-05-27T07:32:00Z",
];

/// One edit of a text or byte input.
#[derive(Debug, Clone)]
pub enum Edit {
    /// Overwrite the byte at a position.
    Byte(Index, u8),
    /// Insert bytes at a position.
    Insert(Index, Vec<u8>),
    /// Delete up to `n` bytes from a position.
    Delete(Index, usize),
    /// Cut the input at a position.
    Truncate(Index),
    /// Drop a line.
    DropLine(Index),
    /// Repeat a line.
    DupLine(Index),
    /// Swap two lines.
    SwapLines(Index, Index),
    /// Replace the value of a `key = value` line with one of [`EXTREME_VALUES`].
    Value(Index, Index),
    /// Replace the value of a `key = value` line with a long string.
    LongValue(Index, usize),
}

fn edit() -> impl Strategy<Value = Edit> {
    prop_oneof![
        (any::<Index>(), any::<u8>()).prop_map(|(i, b)| Edit::Byte(i, b)),
        (
            any::<Index>(),
            proptest::collection::vec(any::<u8>(), 1..16)
        )
            .prop_map(|(i, b)| Edit::Insert(i, b)),
        (any::<Index>(), 1usize..64).prop_map(|(i, n)| Edit::Delete(i, n)),
        any::<Index>().prop_map(Edit::Truncate),
        any::<Index>().prop_map(Edit::DropLine),
        any::<Index>().prop_map(Edit::DupLine),
        (any::<Index>(), any::<Index>()).prop_map(|(a, b)| Edit::SwapLines(a, b)),
        (any::<Index>(), any::<Index>()).prop_map(|(a, b)| Edit::Value(a, b)),
        (any::<Index>(), 1usize..100_000).prop_map(|(a, n)| Edit::LongValue(a, n)),
    ]
}

fn split_lines(bytes: &[u8]) -> Vec<Vec<u8>> {
    bytes
        .split_inclusive(|b| *b == b'\n')
        .map(<[u8]>::to_vec)
        .collect()
}

fn set_value(lines: &mut [Vec<u8>], line: Index, value: &[u8]) {
    let with_value: Vec<usize> = (0..lines.len())
        .filter(|i| lines[*i].contains(&b'='))
        .collect();
    if with_value.is_empty() {
        return;
    }
    let l = &mut lines[with_value[line.index(with_value.len())]];
    let eq = l.iter().position(|b| *b == b'=').unwrap_or(0);
    let mut out = l[..=eq].to_vec();
    out.push(b' ');
    out.extend_from_slice(value);
    out.push(b'\n');
    *l = out;
}

/// Applies `e` to `bytes`.
pub fn apply(bytes: &mut Vec<u8>, e: &Edit) {
    let len = bytes.len();
    match e {
        Edit::Byte(i, b) if len > 0 => bytes[i.index(len)] = *b,
        Edit::Byte(..) => bytes.push(0),
        Edit::Insert(i, b) => {
            let at = i.index(len + 1);
            bytes.splice(at..at, b.iter().copied());
        }
        Edit::Delete(i, n) if len > 0 => {
            let at = i.index(len);
            let end = at.saturating_add(*n).min(len);
            bytes.drain(at..end);
        }
        Edit::Delete(..) => {}
        Edit::Truncate(i) => bytes.truncate(i.index(len + 1)),
        Edit::DropLine(_)
        | Edit::DupLine(_)
        | Edit::SwapLines(..)
        | Edit::Value(..)
        | Edit::LongValue(..) => {
            let mut lines = split_lines(bytes);
            if lines.is_empty() {
                return;
            }
            let n = lines.len();
            match e {
                Edit::DropLine(i) => {
                    lines.remove(i.index(n));
                }
                Edit::DupLine(i) => {
                    let l = lines[i.index(n)].clone();
                    lines.insert(i.index(n), l);
                }
                Edit::SwapLines(a, b) => lines.swap(a.index(n), b.index(n)),
                Edit::Value(line, v) => {
                    let value = EXTREME_VALUES[v.index(EXTREME_VALUES.len())];
                    set_value(&mut lines, *line, value.as_bytes());
                }
                Edit::LongValue(line, n) => {
                    let value = format!("\"{}\"", "a".repeat(*n));
                    set_value(&mut lines, *line, value.as_bytes());
                }
                _ => {}
            }
            *bytes = lines.concat();
        }
    }
}

/// `seed` after 1 to 8 edits (bytes may stop being UTF-8).
pub fn mutated_bytes(seed: Vec<u8>) -> impl Strategy<Value = Vec<u8>> {
    proptest::collection::vec(edit(), 1..8).prop_map(move |edits| {
        let mut b = seed.clone();
        for e in &edits {
            apply(&mut b, e);
        }
        b
    })
}

/// `seed` after 1 to 8 edits, as text (invalid UTF-8 replaced).
pub fn mutated_text(seed: &str) -> impl Strategy<Value = String> {
    mutated_bytes(seed.as_bytes().to_vec()).prop_map(|b| String::from_utf8_lossy(&b).into_owned())
}

/// Arbitrary bytes, up to 4 KiB.
pub fn arbitrary_bytes() -> impl Strategy<Value = Vec<u8>> {
    proptest::collection::vec(any::<u8>(), 0..4096)
}

/// Arbitrary text, up to 4 KiB: random characters, and random sequences
/// of the characters that mean something in TOML, CSV, HTTP and JSON.
pub fn arbitrary_text() -> impl Strategy<Value = String> {
    prop_oneof![
        arbitrary_bytes().prop_map(|b| String::from_utf8_lossy(&b).into_owned()),
        proptest::collection::vec(
            prop_oneof![
                Just("["),
                Just("]"),
                Just("[["),
                Just("]]"),
                Just("{"),
                Just("}"),
                Just("="),
                Just("\""),
                Just("'''"),
                Just(","),
                Just("."),
                Just("\n"),
                Just("\r\n"),
                Just(":"),
                Just("#"),
                Just("a"),
                Just("pools"),
                Just("name"),
                Just("0"),
                Just("18446744073709551615"),
                Just("-1"),
                Just("1e308"),
                Just(" "),
            ],
            0..256,
        )
        .prop_map(|parts| parts.concat()),
    ]
}

/// One step into a JSON value.
#[derive(Debug, Clone)]
enum Step {
    Key(String),
    Item(usize),
}

fn leaf_paths(v: &Value, at: &mut Vec<Step>, out: &mut Vec<Vec<Step>>) {
    out.push(at.clone());
    match v {
        Value::Object(m) => {
            for (k, v) in m {
                at.push(Step::Key(k.clone()));
                leaf_paths(v, at, out);
                at.pop();
            }
        }
        Value::Array(a) => {
            for (i, v) in a.iter().enumerate() {
                at.push(Step::Item(i));
                leaf_paths(v, at, out);
                at.pop();
            }
        }
        _ => {}
    }
}

fn at_mut<'v>(v: &'v mut Value, path: &[Step]) -> Option<&'v mut Value> {
    let mut cur = v;
    for s in path {
        cur = match s {
            Step::Key(k) => cur.get_mut(k.as_str())?,
            Step::Item(i) => cur.get_mut(*i)?,
        };
    }
    Some(cur)
}

/// JSON values that break naive handlers.
fn extreme_json() -> impl Strategy<Value = Value> {
    prop_oneof![
        Just(Value::from(0u64)),
        Just(Value::from(1u64)),
        Just(Value::from(u32::MAX)),
        Just(Value::from(1u64 << 32)),
        Just(Value::from(1u64 << 63)),
        Just(Value::from(u64::MAX)),
        Just(Value::from(-1i64)),
        Just(Value::from(i64::MIN)),
        Just(Value::from(1e308)),
        Just(Value::from(0.5)),
        Just(Value::from("")),
        Just(Value::from("edge:")),
        Just(Value::from("../../etc")),
        (1usize..100_000).prop_map(|n| Value::from("a".repeat(n))),
        Just(Value::Null),
        Just(Value::Bool(true)),
        Just(Value::Array(vec![])),
        Just(Value::Object(Default::default())),
        any::<i64>().prop_map(Value::from),
        any::<u64>().prop_map(Value::from),
        "[a-z:_-]{0,12}".prop_map(Value::from),
    ]
}

/// One edit of a JSON body.
#[derive(Debug, Clone)]
enum JsonEdit {
    Replace(Index, Value),
    Remove(Index),
    AddKey(Index, String, Value),
}

fn json_edit() -> impl Strategy<Value = JsonEdit> {
    prop_oneof![
        4 => (any::<Index>(), extreme_json()).prop_map(|(i, v)| JsonEdit::Replace(i, v)),
        1 => any::<Index>().prop_map(JsonEdit::Remove),
        1 => (any::<Index>(), "[a-z_]{1,10}", extreme_json())
            .prop_map(|(i, k, v)| JsonEdit::AddKey(i, k, v)),
    ]
}

fn apply_json(v: &mut Value, e: &JsonEdit) {
    let mut paths = Vec::new();
    leaf_paths(v, &mut Vec::new(), &mut paths);
    match e {
        JsonEdit::Replace(i, with) => {
            if let Some(slot) = at_mut(v, &paths[i.index(paths.len())]) {
                *slot = with.clone();
            }
        }
        JsonEdit::Remove(i) => {
            let path = &paths[i.index(paths.len())];
            if let Some((last, parent)) = path.split_last() {
                match (at_mut(v, parent), last) {
                    (Some(Value::Object(m)), Step::Key(k)) => {
                        m.remove(k);
                    }
                    (Some(Value::Array(a)), Step::Item(i)) if *i < a.len() => {
                        a.remove(*i);
                    }
                    _ => {}
                }
            }
        }
        JsonEdit::AddKey(i, k, with) => {
            if let Some(Value::Object(m)) = at_mut(v, &paths[i.index(paths.len())]) {
                m.insert(k.clone(), with.clone());
            }
        }
    }
}

/// A JSON body: `seed` with 1 to 4 structural edits (fields replaced by
/// extremes, removed, unknown ones added), then as bytes with, sometimes,
/// byte edits on top.
pub fn mutated_json(seed: Value) -> impl Strategy<Value = Vec<u8>> {
    (
        proptest::collection::vec(json_edit(), 1..4),
        proptest::collection::vec(edit(), 0..2),
    )
        .prop_map(move |(json_edits, byte_edits)| {
            let mut v = seed.clone();
            for e in &json_edits {
                apply_json(&mut v, e);
            }
            let mut b = serde_json::to_vec(&v).unwrap_or_default();
            for e in &byte_edits {
                apply(&mut b, e);
            }
            b
        })
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::strategy::ValueTree;
    use proptest::test_runner::TestRunner;

    #[test]
    fn value_edits_replace_the_right_hand_side() {
        let mut b = b"a = 1\n[t]\nb = \"x\"\n".to_vec();
        let mut runner = TestRunner::deterministic();
        let line = any::<Index>().new_tree(&mut runner).unwrap().current();
        let value = any::<Index>().new_tree(&mut runner).unwrap().current();
        apply(&mut b, &Edit::Value(line, value));
        let text = String::from_utf8(b).unwrap();
        assert_eq!(text.lines().count(), 3);
        assert!(text.contains("[t]"));
        assert!(EXTREME_VALUES
            .iter()
            .any(|v| text.contains(&format!("= {v}\n"))));
    }

    #[test]
    fn json_edits_keep_the_body_json_without_byte_edits() {
        let seed = serde_json::json!({"a": 1, "b": {"c": [1, 2]}});
        let mut runner = TestRunner::deterministic();
        for _ in 0..64 {
            let edits = proptest::collection::vec(json_edit(), 1..4)
                .new_tree(&mut runner)
                .unwrap()
                .current();
            let mut v = seed.clone();
            for e in &edits {
                apply_json(&mut v, e);
            }
            assert!(serde_json::to_vec(&v).is_ok());
        }
    }
}
