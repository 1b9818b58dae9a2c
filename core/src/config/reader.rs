//! A small path-tracking reader over a parsed TOML document.
//!
//! It walks `toml`'s spanned document tree (`DeTable`), knows the key path
//! and byte span of every value it hands out, and never stops at a mistake:
//! wrong types, missing keys and unknown keys are recorded in an [`Issues`]
//! sink and the walk goes on. Values it could not read come back as `None`,
//! so the validation that follows skips them instead of reporting them twice.
//!
//! ```text
//!   &str ──parse_recoverable──▶ DeTable ──TableReader──▶ raw structs of Field<T>
//!                                   │                          │
//!                                   └──── Issues (path, span) ◀┘ ◀── validation
//! ```

use super::error::{ConfigError, ConfigIssue, IssueKind};
use std::ops::Range;
use toml::de::{DeTable, DeValue};
use toml::Spanned;

/// Where a value is (or should be): its key path and byte span.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) struct Loc {
    pub path: String,
    pub span: Option<Range<usize>>,
}

impl Loc {
    /// The location of `key` inside this table-valued location.
    pub fn key(&self, key: &str) -> String {
        join_key(&self.path, key)
    }
}

/// A value read from the file with the place it came from. `v` is `None`
/// when the key was absent or its value unusable (already reported).
#[derive(Debug, Clone)]
pub(crate) struct Field<T> {
    pub v: Option<T>,
    pub at: Loc,
}

/// Collects issues for one file; turns byte spans into line and column.
pub(crate) struct Issues<'s> {
    src: &'s str,
    list: Vec<(usize, ConfigIssue)>,
}

impl<'s> Issues<'s> {
    pub fn new(src: &'s str) -> Self {
        Self {
            src,
            list: Vec::new(),
        }
    }

    /// Records one problem at `at`.
    pub fn report(&mut self, at: &Loc, kind: IssueKind, message: String, got: Option<String>) {
        let (line, column, offset) = match &at.span {
            Some(span) => {
                let (l, c) = line_col(self.src, span.start);
                (Some(l), Some(c), span.start)
            }
            None => (None, None, usize::MAX),
        };
        self.list.push((
            offset,
            ConfigIssue {
                kind,
                path: at.path.clone(),
                line,
                column,
                message,
                got,
            },
        ));
    }

    /// The text of a one-line scalar value at `at` as written in the file
    /// (`48_000`, `"A10"`), for "(got ...)".
    pub fn as_written(&self, at: &Loc) -> Option<String> {
        let text = self.src.get(at.span.clone()?)?.trim();
        let simple = !text.is_empty()
            && !text.contains('\n')
            && !text.starts_with('[')
            && !text.starts_with('{')
            && text.chars().count() <= 60;
        simple.then(|| text.to_string())
    }

    /// The value at `at` as written, else `v` formatted.
    pub fn written_or(&self, at: &Loc, v: impl std::fmt::Display) -> String {
        self.as_written(at).unwrap_or_else(|| v.to_string())
    }

    /// `v` for "(got ...)": as written when it is a short scalar.
    pub fn got(&self, at: &Loc, v: &DeValue<'_>) -> String {
        match v {
            DeValue::Array(_) | DeValue::Table(_) => render(v),
            _ => self.as_written(at).unwrap_or_else(|| render(v)),
        }
    }

    /// Whether nothing was reported.
    pub fn is_empty(&self) -> bool {
        self.list.is_empty()
    }

    /// All issues in file order, as the error of file `file`.
    pub fn into_error(mut self, file: &str) -> ConfigError {
        // Stable: issues at the same place keep the order they were found in.
        self.list.sort_by_key(|(offset, _)| *offset);
        ConfigError {
            file: file.to_string(),
            issues: self.list.into_iter().map(|(_, i)| i).collect(),
        }
    }
}

/// The value in `f` if it lies in `lo..=hi`; reports it otherwise.
pub(crate) fn check_range<T>(issues: &mut Issues<'_>, f: &Field<T>, lo: T, hi: T) -> Option<T>
where
    T: Copy + PartialOrd + std::fmt::Display,
{
    let v = f.v?;
    if v < lo || v > hi {
        let got = issues.written_or(&f.at, v);
        issues.report(
            &f.at,
            IssueKind::OutOfRange,
            format!("must be from {lo} to {hi}"),
            Some(got),
        );
        return None;
    }
    Some(v)
}

/// 1-based line and column (in characters) of byte `offset` in `src`; an
/// offset past the end or inside a character counts from the character's
/// start.
pub(crate) fn line_col(src: &str, offset: usize) -> (u32, u32) {
    let mut offset = offset.min(src.len());
    while !src.is_char_boundary(offset) {
        offset = offset.saturating_sub(1);
    }
    let before = src.get(..offset).unwrap_or(src);
    let line = before.matches('\n').count() + 1;
    let line_start = before.rfind('\n').map_or(0, |i| i + 1);
    let column = before[line_start..].chars().count() + 1;
    (line as u32, column as u32)
}

/// Parses `src` as TOML; on syntax errors reports every one of them
/// (with recovery) and returns `None`.
pub(crate) fn parse_document<'s>(
    src: &'s str,
    issues: &mut Issues<'s>,
) -> Option<Spanned<DeTable<'s>>> {
    let (doc, errors) = DeTable::parse_recoverable(src);
    if errors.is_empty() {
        return Some(doc);
    }
    for e in errors {
        let at = Loc {
            path: String::new(),
            span: Some(e.span().unwrap_or(0..0)),
        };
        // The text at the error, e.g. the key of "duplicate key".
        let got = issues.as_written(&at);
        issues.report(
            &at,
            IssueKind::Syntax,
            format!("TOML syntax error: {}", e.message().trim()),
            got,
        );
    }
    None
}

/// `parent.key`, quoting the key when it is not a bare TOML key.
pub(crate) fn join_key(parent: &str, key: &str) -> String {
    let bare = !key.is_empty()
        && key
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '-');
    let key = if bare {
        key.to_string()
    } else {
        format!("{key:?}")
    };
    if parent.is_empty() {
        key
    } else {
        format!("{parent}.{key}")
    }
}

/// A short rendering of a value for "(got ...)".
pub(crate) fn render(v: &DeValue<'_>) -> String {
    match v {
        DeValue::String(s) => quote(s),
        DeValue::Integer(i) => i.to_string(),
        DeValue::Float(f) => f.to_string(),
        DeValue::Boolean(b) => b.to_string(),
        DeValue::Datetime(d) => d.to_string(),
        DeValue::Array(a) => format!("an array of {} items", a.len()),
        DeValue::Table(_) => "a table".to_string(),
    }
}

/// A string value quoted as in TOML, cut short when long.
pub(crate) fn quote(s: &str) -> String {
    const MAX: usize = 60;
    if s.chars().count() > MAX {
        let cut: String = s.chars().take(MAX).collect();
        format!("{cut:?}…")
    } else {
        format!("{s:?}")
    }
}

fn type_name(v: &DeValue<'_>) -> &'static str {
    match v {
        DeValue::String(_) => "a string",
        DeValue::Integer(_) => "an integer",
        DeValue::Float(_) => "a float",
        DeValue::Boolean(_) => "a boolean",
        DeValue::Datetime(_) => "a datetime",
        DeValue::Array(_) => "an array",
        DeValue::Table(_) => "a table",
    }
}

/// Reads one table; remembers which keys were read so that [`finish`]
/// can report the rest as unknown.
///
/// [`finish`]: TableReader::finish
pub(crate) struct TableReader<'a, 'i> {
    loc: Loc,
    table: &'a DeTable<'i>,
    read: Vec<&'static str>,
}

impl<'a, 'i> TableReader<'a, 'i> {
    /// A reader of the document's root table.
    pub fn root(doc: &'a Spanned<DeTable<'i>>) -> Self {
        Self {
            loc: Loc {
                path: String::new(),
                span: Some(doc.span()),
            },
            table: doc.get_ref(),
            read: Vec::new(),
        }
    }

    /// Where this table is.
    pub fn loc(&self) -> &Loc {
        &self.loc
    }

    /// Whether the table has `key` (whatever its value).
    pub fn has(&self, key: &str) -> bool {
        self.table.get(key).is_some()
    }

    /// The location of `key` in this table: its value's span when present,
    /// else the table's own.
    pub fn loc_of(&self, key: &str) -> Loc {
        let span = match self.table.get(key) {
            Some(v) => Some(v.span()),
            None => self.loc.span.clone(),
        };
        Loc {
            path: self.loc.key(key),
            span,
        }
    }

    fn take(
        &mut self,
        issues: &mut Issues<'_>,
        key: &'static str,
        required: bool,
    ) -> (Loc, Option<&'a Spanned<DeValue<'i>>>) {
        self.read.push(key);
        let at = self.loc_of(key);
        let v = self.table.get(key);
        if v.is_none() && required {
            let mut missing = self.loc_or_root();
            missing.path = at.path.clone();
            issues.report(
                &missing,
                IssueKind::MissingKey,
                "missing required key".to_string(),
                None,
            );
        }
        (at, v)
    }

    /// The table's own span, for "missing key" (the top of the file at the root).
    fn loc_or_root(&self) -> Loc {
        let mut l = self.loc.clone();
        if l.path.is_empty() {
            // Point at the top of the file, not at the span of the whole document.
            l.span = Some(0..0);
        }
        l
    }

    fn wrong_type(issues: &mut Issues<'_>, at: &Loc, expected: &str, v: &DeValue<'_>) {
        let got = issues.got(at, v);
        issues.report(
            at,
            IssueKind::WrongType,
            format!("expected {expected}, found {}", type_name(v)),
            Some(got),
        );
    }

    /// A string value.
    pub fn string(
        &mut self,
        issues: &mut Issues<'_>,
        key: &'static str,
        required: bool,
    ) -> Field<String> {
        let (at, v) = self.take(issues, key, required);
        let v = v.and_then(|v| match v.get_ref() {
            DeValue::String(s) => Some(s.to_string()),
            other => {
                Self::wrong_type(issues, &at, "a string", other);
                None
            }
        });
        Field { v, at }
    }

    /// A boolean value.
    pub fn boolean(
        &mut self,
        issues: &mut Issues<'_>,
        key: &'static str,
        required: bool,
    ) -> Field<bool> {
        let (at, v) = self.take(issues, key, required);
        let v = v.and_then(|v| match v.get_ref() {
            DeValue::Boolean(b) => Some(*b),
            other => {
                Self::wrong_type(issues, &at, "true or false", other);
                None
            }
        });
        Field { v, at }
    }

    /// A non-negative integer that fits `T`.
    pub fn uint<T: TryFrom<u64>>(
        &mut self,
        issues: &mut Issues<'_>,
        key: &'static str,
        required: bool,
    ) -> Field<T> {
        let (at, v) = self.take(issues, key, required);
        let v = v.and_then(|v| {
            let DeValue::Integer(i) = v.get_ref() else {
                Self::wrong_type(issues, &at, "a non-negative integer", v.get_ref());
                return None;
            };
            let parsed = i128::from_str_radix(i.as_str(), i.radix()).ok();
            let fits = parsed
                .and_then(|n| u64::try_from(n).ok())
                .and_then(|n| T::try_from(n).ok());
            if fits.is_none() {
                let message = if i.as_str().starts_with('-') {
                    "must not be negative".to_string()
                } else {
                    format!("must be from 0 to {}", max_of::<T>())
                };
                let got = issues.got(&at, v.get_ref());
                issues.report(&at, IssueKind::OutOfRange, message, Some(got));
            }
            fits
        });
        Field { v, at }
    }

    /// An array of strings, each with its location (`key[i]`); an element
    /// that is not a string is reported and skipped.
    pub fn strings(
        &mut self,
        issues: &mut Issues<'_>,
        key: &'static str,
        required: bool,
    ) -> Vec<Field<String>> {
        let (at, v) = self.take(issues, key, required);
        let Some(v) = v else { return Vec::new() };
        let DeValue::Array(items) = v.get_ref() else {
            Self::wrong_type(issues, &at, "an array of strings", v.get_ref());
            return Vec::new();
        };
        let mut out = Vec::new();
        for (i, item) in items.iter().enumerate() {
            let item_at = Loc {
                path: format!("{}[{i}]", at.path),
                span: Some(item.span()),
            };
            match item.get_ref() {
                DeValue::String(s) => out.push(Field {
                    v: Some(s.to_string()),
                    at: item_at,
                }),
                other => Self::wrong_type(issues, &item_at, "a string", other),
            }
        }
        out
    }

    /// A table of strings (`[env]`), each value with its location
    /// (`key.name`); a value that is not a string is reported and skipped.
    pub fn string_table(
        &mut self,
        issues: &mut Issues<'_>,
        key: &'static str,
        required: bool,
    ) -> Vec<(String, Field<String>)> {
        let (at, v) = self.take(issues, key, required);
        let Some(v) = v else { return Vec::new() };
        let DeValue::Table(t) = v.get_ref() else {
            Self::wrong_type(issues, &at, "a table of strings", v.get_ref());
            return Vec::new();
        };
        let mut out = Vec::new();
        for (k, item) in t.iter() {
            let name: &str = k.get_ref();
            let item_at = Loc {
                path: at.key(name),
                span: Some(item.span()),
            };
            match item.get_ref() {
                DeValue::String(s) => out.push((
                    name.to_string(),
                    Field {
                        v: Some(s.to_string()),
                        at: item_at,
                    },
                )),
                other => Self::wrong_type(issues, &item_at, "a string", other),
            }
        }
        out
    }

    /// A sub-table.
    pub fn table(
        &mut self,
        issues: &mut Issues<'_>,
        key: &'static str,
        required: bool,
    ) -> Option<TableReader<'a, 'i>> {
        let (at, v) = self.take(issues, key, required);
        let v = v?;
        match v.get_ref() {
            DeValue::Table(t) => Some(TableReader {
                loc: at,
                table: t,
                read: Vec::new(),
            }),
            other => {
                Self::wrong_type(issues, &at, "a table", other);
                None
            }
        }
    }

    /// An array of tables (`[[key]]` or `key = [{...}, ...]`); an element
    /// that is not a table is reported and skipped.
    pub fn tables(
        &mut self,
        issues: &mut Issues<'_>,
        key: &'static str,
        required: bool,
    ) -> Vec<TableReader<'a, 'i>> {
        let (at, v) = self.take(issues, key, required);
        let Some(v) = v else { return Vec::new() };
        let DeValue::Array(items) = v.get_ref() else {
            Self::wrong_type(issues, &at, "an array of tables", v.get_ref());
            return Vec::new();
        };
        let mut out = Vec::new();
        for (i, item) in items.iter().enumerate() {
            let item_at = Loc {
                path: format!("{}[{i}]", at.path),
                span: Some(item.span()),
            };
            match item.get_ref() {
                DeValue::Table(t) => out.push(TableReader {
                    loc: item_at,
                    table: t,
                    read: Vec::new(),
                }),
                other => {
                    Self::wrong_type(issues, &item_at, "a table", other);
                }
            }
        }
        out
    }

    /// Reports every key that was not read as unknown, listing the known ones.
    pub fn finish(self, issues: &mut Issues<'_>) {
        for (k, v) in self.table.iter() {
            let key: &str = k.get_ref();
            if self.read.contains(&key) {
                continue;
            }
            let value_at = Loc {
                path: self.loc.key(key),
                span: Some(v.span()),
            };
            let got = issues.got(&value_at, v.get_ref());
            let at = Loc {
                span: Some(k.span()),
                ..value_at
            };
            issues.report(
                &at,
                IssueKind::UnknownKey,
                format!("unknown key (expected one of: {})", self.read.join(", ")),
                Some(got),
            );
        }
    }
}

/// The largest value of `T`, for "must be from 0 to MAX" (probed downwards
/// from `u64::MAX` in powers of two minus one: exact for u8..u64).
fn max_of<T: TryFrom<u64>>() -> u64 {
    let mut max = u64::MAX;
    while T::try_from(max).is_err() {
        max >>= 1;
    }
    max
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn line_and_column_count_characters() {
        let src = "a = 1\nbé = \"x\"\n";
        assert_eq!(line_col(src, 0), (1, 1));
        assert_eq!(line_col(src, 6), (2, 1));
        // 'é' is two bytes but one column.
        let eq = src.find('=').unwrap();
        assert_eq!(
            line_col(src, src[eq + 1..].find('=').unwrap() + eq + 1),
            (2, 4)
        );
    }

    #[test]
    fn an_offset_inside_a_character_or_past_the_end_points_at_that_character() {
        let src = "a\nbé\n";
        // 'é' is bytes 3..5; byte 4 is inside it.
        assert_eq!(line_col(src, 3), (2, 2));
        assert_eq!(line_col(src, 4), (2, 2));
        assert_eq!(line_col(src, usize::MAX), (3, 1));
    }

    #[test]
    fn keys_are_quoted_only_when_needed() {
        assert_eq!(join_key("", "pools"), "pools");
        assert_eq!(join_key("pools[0]", "name"), "pools[0].name");
        assert_eq!(join_key("t", "a.b"), "t.\"a.b\"");
    }

    #[test]
    fn max_of_knows_the_integer_widths() {
        assert_eq!(max_of::<u8>(), 255);
        assert_eq!(max_of::<u32>(), u32::MAX as u64);
        assert_eq!(max_of::<u64>(), u64::MAX);
    }
}
