//! Label selectors: the requirement grammar, its lexer and parser, label key and value
//! validation, and matching against any label container.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::fmt;
use std::str::FromStr;

use super::{Result, SelectorError};

/// Read access to an object's labels, so selectors can match any label container.
pub trait Labels {
    /// The value of label `key`, if present.
    fn get_label(&self, key: &str) -> Option<&str>;
}

impl Labels for BTreeMap<String, String> {
    fn get_label(&self, key: &str) -> Option<&str> {
        self.get(key).map(String::as_str)
    }
}

impl Labels for crate::object::StringMap {
    fn get_label(&self, key: &str) -> Option<&str> {
        self.get(key)
    }
}

impl<S: std::hash::BuildHasher> Labels for HashMap<String, String, S> {
    fn get_label(&self, key: &str) -> Option<&str> {
        self.get(key).map(String::as_str)
    }
}

impl Labels for [(String, String)] {
    fn get_label(&self, key: &str) -> Option<&str> {
        self.iter().find(|(k, _)| k == key).map(|(_, v)| v.as_str())
    }
}

impl<L: Labels + ?Sized> Labels for &L {
    fn get_label(&self, key: &str) -> Option<&str> {
        (**self).get_label(key)
    }
}

/// The operator of one label requirement.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum LabelOp {
    /// `key=value`
    Equals,
    /// `key==value`
    DoubleEquals,
    /// `key!=value`
    NotEquals,
    /// `key in (a,b)`
    In,
    /// `key notin (a,b)`
    NotIn,
    /// `key`
    Exists,
    /// `!key`
    DoesNotExist,
    /// `key>N`: the label is an integer greater than `N`.
    GreaterThan,
    /// `key<N`: the label is an integer less than `N`.
    LessThan,
}

/// One requirement of a [`LabelSelector`]: a key, an operator and its values.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct LabelRequirement {
    key: String,
    op: LabelOp,
    /// Exactly one value for `=`/`==`/`!=`/`>`/`<` (an integer for the last two), one or more
    /// for `in`/`notin`, none otherwise.
    values: BTreeSet<String>,
}

impl LabelRequirement {
    /// The label key.
    pub fn key(&self) -> &str {
        &self.key
    }
    /// The operator.
    pub fn op(&self) -> LabelOp {
        self.op
    }
    /// The values, sorted (one for equality operators, empty for existence operators).
    pub fn values(&self) -> impl Iterator<Item = &str> {
        self.values.iter().map(String::as_str)
    }

    /// Whether `labels` satisfies this requirement.
    pub fn matches<L: Labels + ?Sized>(&self, labels: &L) -> bool {
        let got = labels.get_label(&self.key);
        match self.op {
            LabelOp::Equals | LabelOp::DoubleEquals | LabelOp::In => got.is_some_and(|v| self.values.contains(v)),
            LabelOp::NotEquals | LabelOp::NotIn => got.is_none_or(|v| !self.values.contains(v)),
            LabelOp::Exists => got.is_some(),
            LabelOp::DoesNotExist => got.is_none(),
            LabelOp::GreaterThan | LabelOp::LessThan => {
                // as the API server: a missing or non-integer label never matches
                let (Some(have), Some(want)) = (
                    got.and_then(|v| v.parse::<i64>().ok()),
                    self.values.iter().next().and_then(|v| v.parse::<i64>().ok()),
                ) else {
                    return false;
                };
                if self.op == LabelOp::GreaterThan {
                    have > want
                } else {
                    have < want
                }
            }
        }
    }
}

impl fmt::Display for LabelRequirement {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let first = self.values.iter().next().map_or("", String::as_str);
        match self.op {
            LabelOp::Equals => write!(f, "{}={}", self.key, first),
            LabelOp::DoubleEquals => write!(f, "{}=={}", self.key, first),
            LabelOp::NotEquals => write!(f, "{}!={}", self.key, first),
            LabelOp::GreaterThan => write!(f, "{}>{}", self.key, first),
            LabelOp::LessThan => write!(f, "{}<{}", self.key, first),
            LabelOp::Exists => write!(f, "{}", self.key),
            LabelOp::DoesNotExist => write!(f, "!{}", self.key),
            LabelOp::In | LabelOp::NotIn => {
                let word = if self.op == LabelOp::In { "in" } else { "notin" };
                write!(f, "{} {} (", self.key, word)?;
                for (i, v) in self.values.iter().enumerate() {
                    if i > 0 {
                        f.write_str(",")?;
                    }
                    f.write_str(v)?;
                }
                f.write_str(")")
            }
        }
    }
}

/// A parsed label selector: requirements that must all hold. The empty selector matches
/// everything.
///
/// Requirements are kept sorted by key (as the API server does), so [`Display`](fmt::Display)
/// gives one canonical string for equivalent inputs and parsing that string gives the same
/// selector back.
#[derive(Debug, Clone, Default, PartialEq, Eq, Hash)]
pub struct LabelSelector {
    requirements: Vec<LabelRequirement>,
}

impl LabelSelector {
    /// The selector that matches every object.
    pub fn everything() -> Self {
        Self::default()
    }

    /// Parse `s` with the API server's syntax; the empty string gives [`everything`](Self::everything).
    pub fn parse(s: &str) -> Result<Self> {
        let tokens = lex(s)?;
        let mut p = Parser { tokens, pos: 0 };
        let mut requirements = Vec::new();
        if p.peek() == &Token::End {
            return Ok(Self::everything());
        }
        loop {
            requirements.push(p.requirement()?);
            match p.next() {
                Token::End => break,
                Token::Comma => {
                    if p.peek() == &Token::End {
                        return Err(SelectorError::Syntax("found '', expected: identifier after ','".into()));
                    }
                }
                other => {
                    return Err(SelectorError::Syntax(format!(
                        "found '{}', expected: ',' or end of string",
                        other.text()
                    )))
                }
            }
        }
        requirements.sort_by(|a, b| a.key.cmp(&b.key));
        Ok(Self { requirements })
    }

    /// Whether the selector has no requirements (matches everything).
    pub fn is_empty(&self) -> bool {
        self.requirements.is_empty()
    }

    /// The requirements, sorted by key.
    pub fn requirements(&self) -> &[LabelRequirement] {
        &self.requirements
    }

    /// Whether `labels` satisfies every requirement.
    pub fn matches<L: Labels + ?Sized>(&self, labels: &L) -> bool {
        self.requirements.iter().all(|r| r.matches(labels))
    }
}

impl fmt::Display for LabelSelector {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        super::write_joined(f, &self.requirements)
    }
}

impl FromStr for LabelSelector {
    type Err = SelectorError;
    fn from_str(s: &str) -> Result<Self> {
        Self::parse(s)
    }
}

#[derive(Debug, Clone, PartialEq, Eq)]
enum Token {
    Ident(String),
    In,
    NotIn,
    Eq,
    DoubleEq,
    NotEq,
    Gt,
    Lt,
    Bang,
    Open,
    Close,
    Comma,
    End,
}

impl Token {
    fn text(&self) -> &str {
        match self {
            Token::Ident(s) => s,
            Token::In => "in",
            Token::NotIn => "notin",
            Token::Eq => "=",
            Token::DoubleEq => "==",
            Token::NotEq => "!=",
            Token::Gt => ">",
            Token::Lt => "<",
            Token::Bang => "!",
            Token::Open => "(",
            Token::Close => ")",
            Token::Comma => ",",
            Token::End => "",
        }
    }
}

fn is_special(c: char) -> bool {
    matches!(c, '=' | '!' | '(' | ')' | ',' | '<' | '>')
}

fn lex(s: &str) -> Result<Vec<Token>> {
    let mut out = Vec::new();
    let mut it = s.chars().peekable();
    while let Some(&c) = it.peek() {
        if c.is_whitespace() {
            it.next();
            continue;
        }
        if is_special(c) {
            it.next();
            let tok = match c {
                '=' if it.peek() == Some(&'=') => {
                    it.next();
                    Token::DoubleEq
                }
                '=' => Token::Eq,
                '!' if it.peek() == Some(&'=') => {
                    it.next();
                    Token::NotEq
                }
                '!' => Token::Bang,
                '(' => Token::Open,
                ')' => Token::Close,
                ',' => Token::Comma,
                '>' => Token::Gt,
                '<' => Token::Lt,
                other => return Err(SelectorError::Syntax(format!("unsupported operator '{other}'"))),
            };
            out.push(tok);
            continue;
        }
        let mut ident = String::new();
        while let Some(&c) = it.peek() {
            if c.is_whitespace() || is_special(c) {
                break;
            }
            ident.push(c);
            it.next();
        }
        out.push(match ident.as_str() {
            "in" => Token::In,
            "notin" => Token::NotIn,
            _ => Token::Ident(ident),
        });
    }
    out.push(Token::End);
    Ok(out)
}

struct Parser {
    tokens: Vec<Token>,
    pos: usize,
}

impl Parser {
    fn peek(&self) -> &Token {
        self.tokens.get(self.pos).unwrap_or(&Token::End)
    }
    fn next(&mut self) -> Token {
        let t = self.peek().clone();
        if self.pos < self.tokens.len() {
            self.pos += 1;
        }
        t
    }

    fn requirement(&mut self) -> Result<LabelRequirement> {
        let negated = if self.peek() == &Token::Bang {
            self.next();
            true
        } else {
            false
        };
        let key = match self.next() {
            Token::Ident(k) => k,
            other => {
                return Err(SelectorError::Syntax(format!(
                    "found '{}', expected: !, identifier",
                    other.text()
                )))
            }
        };
        validate_key(&key)?;
        if negated {
            return Ok(LabelRequirement {
                key,
                op: LabelOp::DoesNotExist,
                values: BTreeSet::new(),
            });
        }
        let op = match self.peek() {
            Token::End | Token::Comma => {
                return Ok(LabelRequirement {
                    key,
                    op: LabelOp::Exists,
                    values: BTreeSet::new(),
                })
            }
            Token::Eq => LabelOp::Equals,
            Token::DoubleEq => LabelOp::DoubleEquals,
            Token::NotEq => LabelOp::NotEquals,
            Token::In => LabelOp::In,
            Token::NotIn => LabelOp::NotIn,
            Token::Gt => LabelOp::GreaterThan,
            Token::Lt => LabelOp::LessThan,
            other => {
                return Err(SelectorError::Syntax(format!(
                    "found '{}', expected: in, notin, =, ==, !=, gt, lt",
                    other.text()
                )))
            }
        };
        self.next();
        let mut values = BTreeSet::new();
        match op {
            LabelOp::In | LabelOp::NotIn => {
                if self.next() != Token::Open {
                    return Err(SelectorError::Syntax(format!(
                        "found '{}', expected: '(' after '{}'",
                        self.tokens.get(self.pos.saturating_sub(1)).map_or("", Token::text),
                        if op == LabelOp::In { "in" } else { "notin" }
                    )));
                }
                // value (',' value)* ')' where a value may be empty
                loop {
                    let v = match self.peek().clone() {
                        Token::Ident(v) => {
                            self.next();
                            v
                        }
                        Token::Comma | Token::Close => String::new(),
                        other => {
                            return Err(SelectorError::Syntax(format!(
                                "found '{}', expected: ',', ')' or identifier",
                                other.text()
                            )))
                        }
                    };
                    validate_value(&v)?;
                    values.insert(v);
                    match self.next() {
                        Token::Comma => continue,
                        Token::Close => break,
                        other => {
                            return Err(SelectorError::Syntax(format!(
                                "found '{}', expected: ',' or ')'",
                                other.text()
                            )))
                        }
                    }
                }
            }
            _ => {
                let v = match self.peek().clone() {
                    Token::Ident(v) => {
                        self.next();
                        v
                    }
                    // `key=` selects the empty value, as on the API server.
                    Token::End | Token::Comma => String::new(),
                    other => {
                        return Err(SelectorError::Syntax(format!(
                            "found '{}', expected: identifier",
                            other.text()
                        )))
                    }
                };
                if matches!(op, LabelOp::GreaterThan | LabelOp::LessThan) && v.parse::<i64>().is_err() {
                    return Err(SelectorError::InvalidValue {
                        value: v,
                        reason: "for 'Gt', 'Lt' operators, the value must be an integer".into(),
                    });
                }
                validate_value(&v)?;
                values.insert(v);
            }
        }
        Ok(LabelRequirement { key, op, values })
    }
}

fn is_alnum(c: char) -> bool {
    c.is_ascii_alphanumeric()
}

/// A qualified name part: at most 63 characters, alphanumeric at both ends, `-_.` inside.
fn check_name_part(s: &str) -> std::result::Result<(), String> {
    if s.is_empty() {
        return Err("name part must be non-empty".into());
    }
    if s.len() > 63 {
        return Err("name part must be no more than 63 characters".into());
    }
    check_label_chars(s, "name part")
}

fn check_label_chars(s: &str, what: &str) -> std::result::Result<(), String> {
    let ok_inner = s.chars().all(|c| is_alnum(c) || matches!(c, '-' | '_' | '.'));
    let first = s.chars().next().is_some_and(is_alnum);
    let last = s.chars().last().is_some_and(is_alnum);
    if ok_inner && first && last {
        Ok(())
    } else {
        Err(format!(
            "{what} must consist of alphanumeric characters, '-', '_' or '.', and must start and end with an alphanumeric character"
        ))
    }
}

fn check_dns_subdomain(s: &str) -> std::result::Result<(), String> {
    let ok = !s.is_empty()
        && s.len() <= 253
        && s.split('.').all(|l| {
            !l.is_empty()
                && l.chars()
                    .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-')
                && !l.starts_with('-')
                && !l.ends_with('-')
        });
    if ok {
        Ok(())
    } else {
        Err("prefix part must be a lowercase RFC 1123 subdomain of at most 253 characters".into())
    }
}

pub(super) fn validate_key(key: &str) -> Result<()> {
    let res = match key.split_once('/') {
        Some((prefix, name)) => check_dns_subdomain(prefix).and_then(|()| check_name_part(name)),
        None => check_name_part(key),
    };
    res.map_err(|reason| SelectorError::InvalidKey {
        key: key.to_string(),
        reason,
    })
}

pub(super) fn validate_value(v: &str) -> Result<()> {
    if v.is_empty() {
        return Ok(());
    }
    let res = if v.len() > 63 {
        Err("must be no more than 63 characters".to_string())
    } else {
        check_label_chars(v, "a valid label value")
    };
    res.map_err(|reason| SelectorError::InvalidValue {
        value: v.to_string(),
        reason,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn labels(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
        pairs
            .iter()
            .map(|(k, v)| ((*k).to_string(), (*v).to_string()))
            .collect()
    }

    #[test]
    fn label_selectors_parse_to_canonical_form() {
        let table = [
            ("", ""),
            ("app=web", "app=web"),
            ("app == web", "app==web"),
            ("app!=web", "app!=web"),
            ("env in (prod, dev)", "env in (dev,prod)"),
            ("env notin (a,b,a)", "env notin (a,b)"),
            ("app", "app"),
            ("!app", "!app"),
            ("  b=1 , a=2 ", "a=2,b=1"),
            ("example.com/tier=front", "example.com/tier=front"),
            ("x=", "x="),
            ("x in (a,)", "x in (,a)"),
            ("a,!b,c in (z)", "a,!b,c in (z)"),
            ("app>1", "app>1"),
            ("replicas < 10 , app", "app,replicas<10"),
            ("n>007", "n>007"),
        ];
        for (input, canonical) in table {
            let sel = LabelSelector::parse(input).unwrap_or_else(|e| panic!("{input:?} should parse: {e}"));
            assert_eq!(sel.to_string(), canonical, "input {input:?}");
            let again: LabelSelector = canonical.parse().expect("canonical form parses");
            assert_eq!(again, sel, "round trip of {input:?}");
        }
    }

    #[test]
    fn malformed_label_selectors_are_rejected_with_a_reason() {
        let table = [
            ("app=", None),
            ("=web", Some("expected: !, identifier")),
            ("app=web,", Some("after ','")),
            ("app in a", Some("expected: '('")),
            ("app in (a", Some("expected: ',' or ')'")),
            ("app web", Some("expected: in, notin")),
            ("app>x", Some("must be an integer")),
            ("app<", Some("must be an integer")),
            ("app>1.5", Some("must be an integer")),
            ("app>99999999999999999999", Some("must be an integer")),
            ("app>-1", Some("invalid label value")),
            ("app>(1)", Some("expected: identifier")),
            ("app>=1", Some("expected: identifier")),
            ("app in (1) > 2", Some("expected: ',' or end of string")),
            ("-app=x", Some("invalid label key")),
            ("app=-x", Some("invalid label value")),
            ("a/b/c=x", Some("invalid label key")),
            ("Example.com/a=x", Some("invalid label key")),
            (&*format!("app={}", "v".repeat(64)), Some("63")),
            (&*format!("{}=v", "k".repeat(64)), Some("63")),
            ("!", Some("expected: !, identifier")),
            ("app==", None),
            ("a,,b", Some("expected: !, identifier")),
            ("app=(x)", Some("expected: identifier")),
        ];
        for (input, want) in table {
            match (LabelSelector::parse(input), want) {
                (Ok(_), None) => {}
                (Ok(sel), Some(_)) => panic!("{input:?} should fail, parsed as {sel}"),
                (Err(e), None) => panic!("{input:?} should parse, got {e}"),
                (Err(e), Some(fragment)) => {
                    let msg = e.to_string();
                    assert!(msg.contains(fragment), "{input:?}: {msg:?} lacks {fragment:?}");
                }
            }
        }
    }

    #[test]
    fn label_selectors_match_like_the_api_server() {
        let l = labels(&[("app", "web"), ("env", "prod"), ("empty", "")]);
        let table = [
            ("", true),
            ("app=web", true),
            ("app==web", true),
            ("app=db", false),
            ("app!=db", true),
            ("missing!=x", true),
            ("app in (db,web)", true),
            ("app in (db)", false),
            ("missing in (x)", false),
            ("app notin (db)", true),
            ("app notin (web)", false),
            ("missing notin (x)", true),
            ("app", true),
            ("missing", false),
            ("!missing", true),
            ("!app", false),
            ("empty=", true),
            ("empty", true),
            ("app=web,env=dev", false),
            ("app=web,env=prod,!missing", true),
            ("n>9", true),
            ("n>10", false),
            ("n<11", true),
            ("n<10", false),
            ("big>9", true),
            ("app>0", false),
            ("app<0", false),
            ("missing>0", false),
            ("missing<0", false),
        ];
        let l = {
            let mut l = l;
            l.insert("n".into(), "10".into());
            l.insert("big".into(), "0100".into());
            l
        };
        for (input, want) in table {
            let sel = LabelSelector::parse(input).expect("valid");
            assert_eq!(sel.matches(&l), want, "{input:?}");
        }
    }
}
