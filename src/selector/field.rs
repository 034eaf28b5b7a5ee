//! Field selectors: `path=value` / `path!=value` terms over dotted field paths, with the
//! API server's backslash escaping.

use std::fmt;
use std::str::FromStr;

use super::{Result, SelectorError};

/// The operator of one field requirement.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum FieldOp {
    /// `path=value`
    Equals,
    /// `path==value`
    DoubleEquals,
    /// `path!=value`
    NotEquals,
}

/// One term of a [`FieldSelector`].
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct FieldRequirement {
    field: String,
    op: FieldOp,
    value: String,
}

impl FieldRequirement {
    /// The dotted field path, e.g. `metadata.name`.
    pub fn field(&self) -> &str {
        &self.field
    }
    /// The operator.
    pub fn op(&self) -> FieldOp {
        self.op
    }
    /// The (unescaped) value.
    pub fn value(&self) -> &str {
        &self.value
    }
    /// Whether the field's value satisfies this term (a missing field counts as `""`).
    pub fn matches_value(&self, got: Option<&str>) -> bool {
        let got = got.unwrap_or("");
        match self.op {
            FieldOp::Equals | FieldOp::DoubleEquals => got == self.value,
            FieldOp::NotEquals => got != self.value,
        }
    }
}

fn escape_field_value(v: &str) -> String {
    let mut out = String::with_capacity(v.len());
    for c in v.chars() {
        if matches!(c, '\\' | ',' | '=' | '!') {
            out.push('\\');
        }
        out.push(c);
    }
    out
}

impl fmt::Display for FieldRequirement {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let op = match self.op {
            FieldOp::Equals => "=",
            FieldOp::DoubleEquals => "==",
            FieldOp::NotEquals => "!=",
        };
        write!(f, "{}{}{}", self.field, op, escape_field_value(&self.value))
    }
}

/// A parsed field selector: terms over dotted field paths that must all hold. The empty
/// selector matches everything. Terms keep their input order.
#[derive(Debug, Clone, Default, PartialEq, Eq, Hash)]
pub struct FieldSelector {
    requirements: Vec<FieldRequirement>,
}

impl FieldSelector {
    /// The selector that matches every object.
    pub fn everything() -> Self {
        Self::default()
    }

    /// Parse `s` with the API server's syntax; the empty string gives [`everything`](Self::everything).
    pub fn parse(s: &str) -> Result<Self> {
        let mut requirements = Vec::new();
        if s.trim().is_empty() {
            return Ok(Self::everything());
        }
        for term in split_unescaped(s, ',') {
            let bad = || SelectorError::FieldTerm {
                selector: s.to_string(),
                term: term.clone(),
            };
            let (field, op, raw) = if let Some((l, r)) = split_op(&term, "!=") {
                (l, FieldOp::NotEquals, r)
            } else if let Some((l, r)) = split_op(&term, "==") {
                (l, FieldOp::DoubleEquals, r)
            } else if let Some((l, r)) = split_op(&term, "=") {
                (l, FieldOp::Equals, r)
            } else {
                return Err(bad());
            };
            let field = field.trim();
            if field.is_empty() || field.contains('\\') {
                return Err(bad());
            }
            let value = unescape(raw).ok_or_else(bad)?;
            requirements.push(FieldRequirement {
                field: field.to_string(),
                op,
                value,
            });
        }
        Ok(Self { requirements })
    }

    /// Whether the selector has no terms.
    pub fn is_empty(&self) -> bool {
        self.requirements.is_empty()
    }

    /// The terms in input order.
    pub fn requirements(&self) -> &[FieldRequirement] {
        &self.requirements
    }

    /// Whether every term holds; `field` returns the value at a dotted path (`None` = absent,
    /// which compares as the empty string, as on the API server).
    pub fn matches<F: Fn(&str) -> Option<String>>(&self, field: F) -> bool {
        self.requirements
            .iter()
            .all(|r| r.matches_value(field(&r.field).as_deref()))
    }
}

/// Split `term` at the first occurrence of `op` that is not escaped by a backslash.
///
/// Compares bytes, not `&str` slices: `i` may sit inside a multi-byte character (slicing there
/// panicked on input like `"¡"`, found by `tests/fuzz_props.rs`). `op` is ASCII, so a match
/// always starts and ends on a character boundary.
fn split_op<'a>(term: &'a str, op: &str) -> Option<(&'a str, &'a str)> {
    let bytes = term.as_bytes();
    let mut i = 0;
    while i < bytes.len() {
        if bytes[i] == b'\\' {
            i += 2;
            continue;
        }
        if bytes[i..].starts_with(op.as_bytes()) {
            return Some((&term[..i], &term[i + op.len()..]));
        }
        i += 1;
    }
    None
}

fn split_unescaped(s: &str, sep: char) -> Vec<String> {
    let mut out = Vec::new();
    let mut cur = String::new();
    let mut it = s.chars();
    while let Some(c) = it.next() {
        if c == '\\' {
            cur.push(c);
            if let Some(n) = it.next() {
                cur.push(n);
            }
        } else if c == sep {
            out.push(std::mem::take(&mut cur));
        } else {
            cur.push(c);
        }
    }
    out.push(cur);
    out
}

fn unescape(s: &str) -> Option<String> {
    let mut out = String::with_capacity(s.len());
    let mut it = s.chars();
    while let Some(c) = it.next() {
        if c == '\\' {
            match it.next() {
                Some(n @ ('\\' | ',' | '=' | '!')) => out.push(n),
                _ => return None,
            }
        } else if c == '=' || c == '!' {
            // an unescaped operator character inside a value: the API server rejects it too
            return None;
        } else {
            out.push(c);
        }
    }
    Some(out)
}

impl fmt::Display for FieldSelector {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        super::write_joined(f, &self.requirements)
    }
}

impl FromStr for FieldSelector {
    type Err = SelectorError;
    fn from_str(s: &str) -> Result<Self> {
        Self::parse(s)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn field_selectors_parse_match_and_round_trip() {
        let field = |p: &str| match p {
            "metadata.name" => Some("pod-1".to_string()),
            "metadata.namespace" => Some("ns,1".to_string()),
            "status.phase" => Some("Running".to_string()),
            _ => None,
        };
        let table = [
            ("", true, ""),
            ("metadata.name=pod-1", true, "metadata.name=pod-1"),
            ("metadata.name==pod-1", true, "metadata.name==pod-1"),
            ("metadata.name!=pod-1", false, "metadata.name!=pod-1"),
            ("metadata.namespace=ns\\,1", true, "metadata.namespace=ns\\,1"),
            (
                "status.phase=Running,spec.nodeName=",
                true,
                "status.phase=Running,spec.nodeName=",
            ),
            ("spec.nodeName!=", false, "spec.nodeName!="),
            ("status.phase=Pending", false, "status.phase=Pending"),
        ];
        for (input, want, canonical) in table {
            let sel = FieldSelector::parse(input).expect("valid");
            assert_eq!(sel.matches(field), want, "{input:?}");
            assert_eq!(sel.to_string(), canonical);
            assert_eq!(FieldSelector::parse(canonical).expect("reparse"), sel);
        }
    }

    #[test]
    fn malformed_field_selectors_are_rejected() {
        for input in ["metadata.name", "=x", "a=b,c", "a=b=c", "a=\\x", ","] {
            let err = FieldSelector::parse(input).expect_err(input);
            assert!(err.to_string().contains("can't understand"), "{input:?}: {err}");
        }
    }
}
