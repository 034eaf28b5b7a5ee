//! `-o` formats as kubectl spells them, and the printers that do not depend on a command:
//! YAML, JSONPath templates, custom columns, tables and the `AGE` column.

use jsonpath_rust::JsonPath;
use serde_json::Value;

use super::{CliError, CliResult};

/// One `-o` format. Parsed at run time (not by clap) so that a format a command cannot print
/// is one line naming the ones it can, with exit code 2.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Format {
    /// A table (kubectl's default).
    Table,
    /// A table with more columns.
    Wide,
    /// `kind[.group]/name`, one per line.
    Name,
    /// JSON.
    Json,
    /// YAML.
    Yaml,
    /// `jsonpath=TEMPLATE`.
    JsonPath(Vec<Node>),
    /// `custom-columns=HEADER:PATH,…`.
    CustomColumns(Vec<(String, String)>),
}

impl Format {
    /// The format's name as `-o` spells it (without the argument).
    pub fn name(&self) -> &'static str {
        match self {
            Format::Table => "table",
            Format::Wide => "wide",
            Format::Name => "name",
            Format::Json => "json",
            Format::Yaml => "yaml",
            Format::JsonPath(_) => "jsonpath",
            Format::CustomColumns(_) => "custom-columns",
        }
    }

    /// Parses `-o` for `command`, which prints the formats in `allowed` (by name); `default`
    /// when `-o` is not given.
    pub fn parse(raw: Option<&str>, command: &str, allowed: &[&str], default: Format) -> CliResult<Format> {
        let Some(raw) = raw else {
            return Ok(default);
        };
        let (name, arg) = match raw.split_once('=') {
            Some((n, a)) => (n, Some(a)),
            None => (raw, None),
        };
        let format = match (name, arg) {
            ("table", None) => Format::Table,
            ("wide", None) => Format::Wide,
            ("name", None) => Format::Name,
            ("json", None) => Format::Json,
            ("yaml", None) => Format::Yaml,
            ("jsonpath", Some(t)) => Format::JsonPath(parse_template(t)?),
            ("custom-columns", Some(spec)) => Format::CustomColumns(parse_columns(spec)?),
            ("jsonpath" | "custom-columns", None) => {
                return Err(CliError::new(2, format!("-o {name} needs an argument: -o {name}=…")));
            }
            _ => {
                return Err(CliError::new(
                    2,
                    format!("-o {raw}: unknown output format; `{command}` prints {}", list(allowed)),
                ))
            }
        };
        if !allowed.contains(&format.name()) {
            return Err(CliError::new(
                2,
                format!("-o {name}: `{command}` cannot print it; it prints {}", list(allowed)),
            ));
        }
        Ok(format)
    }
}

fn list(names: &[&str]) -> String {
    match names {
        [] => String::new(),
        [one] => (*one).to_owned(),
        [init @ .., last] => format!("{} or {last}", init.join(", ")),
    }
}

/// The formats of commands that print a report (a table for people, or the same as data).
pub const REPORT: &[&str] = &["table", "json", "yaml"];

/// Prints a report as JSON (one line or pretty) or YAML.
pub fn print_data(format: &Format, v: &Value, pretty: bool) -> CliResult {
    match format {
        Format::Yaml => outp!("{}", yaml(v)?),
        _ if pretty => outln!("{}", serde_json::to_string_pretty(v).unwrap_or_else(|_| v.to_string())),
        _ => outln!("{v}"),
    }
}

/// YAML through a maintained serializer. It quotes the strings a YAML 1.2 reader would take
/// for another type (`True`, `0x1F`, `~`, `null`, `1e3`, `010`); the strings only a YAML 1.1
/// reader would (`yes`, `on`, `n`, `2026-01-01`, `1:20`: Go's yaml.v2 behind kubectl, PyYAML)
/// it prints plain, so those go through it as placeholders and come out single-quoted.
pub fn yaml(v: &Value) -> CliResult<String> {
    let text = v.to_string();
    // A marker the document does not contain, so a placeholder cannot meet real text.
    let mut nonce = String::from("qdiq");
    while text.contains(&nonce) {
        nonce.push('q');
    }
    let mut quoted = Vec::new();
    let masked = mask_yaml11(v, &nonce, &mut quoted);
    let out = serde_norway::to_string(&masked).map_err(|e| CliError::runtime(format!("cannot write YAML: {e}")))?;
    if quoted.is_empty() {
        return Ok(out);
    }
    // Placeholders are `{nonce}{index}{nonce}`, emitted plain by the serializer.
    let mut result = String::with_capacity(out.len());
    let mut rest = out.as_str();
    while let Some(at) = rest.find(&nonce) {
        result.push_str(&rest[..at]);
        let after = &rest[at + nonce.len()..];
        let digits = after.chars().take_while(char::is_ascii_digit).count();
        let index = after[..digits].parse::<usize>().ok();
        match (
            index.and_then(|i| quoted.get(i)),
            after[digits..].strip_prefix(nonce.as_str()),
        ) {
            (Some(original), Some(tail)) => {
                result.push('\'');
                result.push_str(&original.replace('\'', "''"));
                result.push('\'');
                rest = tail;
            }
            _ => {
                result.push_str(&nonce);
                rest = after;
            }
        }
    }
    result.push_str(rest);
    Ok(result)
}

/// `v` with every string a YAML 1.1 reader would resolve to a non-string replaced by a
/// placeholder (the originals go to `quoted`, by index).
fn mask_yaml11(v: &Value, nonce: &str, quoted: &mut Vec<String>) -> Value {
    let mut mask = |s: &str| -> String {
        if yaml11_not_a_string(s) {
            quoted.push(s.to_owned());
            format!("{nonce}{}{nonce}", quoted.len() - 1)
        } else {
            s.to_owned()
        }
    };
    match v {
        Value::String(s) => Value::String(mask(s)),
        Value::Array(a) => Value::Array(a.iter().map(|x| mask_yaml11(x, nonce, quoted)).collect()),
        Value::Object(o) => {
            let mut out = serde_json::Map::new();
            for (k, x) in o {
                let key = if yaml11_not_a_string(k) {
                    quoted.push(k.clone());
                    format!("{nonce}{}{nonce}", quoted.len() - 1)
                } else {
                    k.clone()
                };
                out.insert(key, mask_yaml11(x, nonce, quoted));
            }
            Value::Object(out)
        }
        other => other.clone(),
    }
}

/// Whether a plain scalar `s` is a bool, timestamp, base-60 or underscored number, merge key
/// or value key under YAML 1.1's implicit types (the cases YAML 1.2 dropped).
fn yaml11_not_a_string(s: &str) -> bool {
    const BOOLS: &[&str] = &[
        "y", "Y", "yes", "Yes", "YES", "n", "N", "no", "No", "NO", "on", "On", "ON", "off", "Off", "OFF",
    ];
    if BOOLS.contains(&s) || s == "<<" || s == "=" {
        return true;
    }
    let b = s.as_bytes();
    // Timestamps: `2026-01-01`, `2026-1-1T10:00:00Z`…
    if b.len() >= 8 && b[..4].iter().all(u8::is_ascii_digit) && b[4] == b'-' && b[5].is_ascii_digit() {
        return true;
    }
    let unsigned = s.strip_prefix(['-', '+']).unwrap_or(s);
    // Binary `0b101`, base 60 `1:20`, `1:20.5`, and `1_000` / `1_000.5`.
    if let Some(bits) = unsigned.strip_prefix("0b") {
        return !bits.is_empty() && bits.bytes().all(|c| matches!(c, b'0' | b'1' | b'_'));
    }
    let numeric = !unsigned.is_empty()
        && unsigned.as_bytes()[0].is_ascii_digit()
        && unsigned
            .bytes()
            .all(|c| c.is_ascii_digit() || matches!(c, b'_' | b':' | b'.'))
        && unsigned.bytes().filter(|c| *c == b'.').count() <= 1;
    numeric && (unsigned.contains(':') || unsigned.contains('_'))
}

/// One piece of a kubectl JSONPath template.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Node {
    /// Text printed as it is (outside braces, or a `{"…"}` literal).
    Text(String),
    /// An expression (`{.metadata.name}`), as an RFC 9535 query (`$.metadata.name`).
    Expr(String),
    /// `{range EXPR}…{end}`: the body once per result, with that result as the root.
    Range(String, Vec<Node>),
}

/// kubectl writes paths relative to the object (`.metadata.name`, `metadata.name`, `@.x`);
/// the JSONPath crate wants a query rooted at `$`.
fn to_query(expr: &str) -> String {
    let expr = expr.trim();
    if expr.starts_with('$') {
        expr.to_owned()
    } else if let Some(rest) = expr.strip_prefix('@') {
        format!("${rest}")
    } else if expr.starts_with('.') || expr.starts_with('[') {
        format!("${expr}")
    } else {
        format!("$.{expr}")
    }
}

fn bad_template(t: &str, why: &str) -> CliError {
    CliError::new(2, format!("bad jsonpath template {t:?}: {why}"))
}

/// Parses kubectl's template syntax: literal text, `{EXPR}`, `{"literal"}`,
/// `{range EXPR}…{end}`.
pub fn parse_template(t: &str) -> CliResult<Vec<Node>> {
    // A stack of open ranges: (expr, body so far); the bottom is the template itself.
    let mut stack: Vec<(String, Vec<Node>)> = vec![(String::new(), Vec::new())];
    let mut rest = t;
    while !rest.is_empty() {
        let Some(open) = rest.find('{') else {
            push(&mut stack, Node::Text(rest.to_owned()));
            break;
        };
        if open > 0 {
            push(&mut stack, Node::Text(rest[..open].to_owned()));
        }
        let inner_start = &rest[open + 1..];
        // A `}` inside a quoted literal does not close the braces.
        let close = closing_brace(inner_start).ok_or_else(|| bad_template(t, "unclosed {"))?;
        let inner = inner_start[..close].trim();
        rest = &inner_start[close + 1..];
        if inner.starts_with('"') {
            let text: String =
                serde_json::from_str(inner).map_err(|_| bad_template(t, &format!("bad string literal {inner}")))?;
            push(&mut stack, Node::Text(text));
        } else if let Some(expr) = inner.strip_prefix("range ") {
            let query = to_query(expr);
            check_query(t, &query)?;
            stack.push((query, Vec::new()));
        } else if inner == "end" {
            if stack.len() < 2 {
                return Err(bad_template(t, "{end} without {range}"));
            }
            if let Some((expr, body)) = stack.pop() {
                push(&mut stack, Node::Range(expr, body));
            }
        } else if inner.is_empty() {
            return Err(bad_template(t, "empty {}"));
        } else {
            let query = to_query(inner);
            check_query(t, &query)?;
            push(&mut stack, Node::Expr(query));
        }
    }
    if stack.len() != 1 {
        return Err(bad_template(t, "{range} without {end}"));
    }
    Ok(stack.pop().map(|(_, nodes)| nodes).unwrap_or_default())
}

fn push(stack: &mut [(String, Vec<Node>)], node: Node) {
    if let Some((_, body)) = stack.last_mut() {
        body.push(node);
    }
}

fn closing_brace(s: &str) -> Option<usize> {
    let mut quote: Option<char> = None;
    let mut escaped = false;
    for (i, c) in s.char_indices() {
        match quote {
            Some(_) if escaped => escaped = false,
            Some(_) if c == '\\' => escaped = true,
            Some(q) if c == q => quote = None,
            Some(_) => {}
            None if c == '"' || c == '\'' => quote = Some(c),
            None if c == '}' => return Some(i),
            None => {}
        }
    }
    None
}

/// Rejects a query the crate cannot parse now, before anything is printed.
fn check_query(t: &str, query: &str) -> CliResult {
    Value::Null
        .query(query)
        .map(|_| ())
        .map_err(|e| bad_template(t, &format!("{query}: {e}")))
}

/// How kubectl prints one JSONPath result: strings bare, everything else as JSON.
fn scalar_text(v: &Value) -> String {
    match v {
        Value::String(s) => s.clone(),
        other => other.to_string(),
    }
}

/// Renders a parsed template against `root`.
pub fn render_template(nodes: &[Node], root: &Value) -> String {
    let mut out = String::new();
    for node in nodes {
        match node {
            Node::Text(s) => out.push_str(s),
            Node::Expr(q) => {
                let found = root.query(q).unwrap_or_default();
                let texts: Vec<String> = found.into_iter().map(scalar_text).collect();
                out.push_str(&texts.join(" "));
            }
            Node::Range(q, body) => {
                for item in root.query(q).unwrap_or_default() {
                    out.push_str(&render_template(body, item));
                }
            }
        }
    }
    out
}

/// Parses `HEADER:PATH,HEADER:PATH` (a path with or without braces).
pub fn parse_columns(spec: &str) -> CliResult<Vec<(String, String)>> {
    let mut columns = Vec::new();
    for part in spec.split(',') {
        let Some((header, path)) = part.split_once(':') else {
            return Err(CliError::new(
                2,
                format!("bad custom-columns {spec:?}: {part:?} is not HEADER:PATH (e.g. NAME:.metadata.name)"),
            ));
        };
        let path = path.trim();
        let path = path.strip_prefix('{').and_then(|p| p.strip_suffix('}')).unwrap_or(path);
        if header.is_empty() || path.is_empty() {
            return Err(CliError::new(
                2,
                format!("bad custom-columns {spec:?}: {part:?} needs both a header and a path"),
            ));
        }
        let query = to_query(path);
        Value::Null
            .query(&query)
            .map_err(|e| CliError::new(2, format!("bad custom-columns path {path:?}: {e}")))?;
        columns.push((header.to_owned(), query));
    }
    Ok(columns)
}

/// One custom-columns cell: several results joined by commas, none as `<none>` (as kubectl).
pub fn column_cell(query: &str, object: &Value) -> String {
    let found = object.query(query).unwrap_or_default();
    if found.is_empty() {
        return "<none>".into();
    }
    found.into_iter().map(scalar_text).collect::<Vec<_>>().join(",")
}

/// Prints rows aligned in columns three spaces apart (kubectl's tab writer).
pub fn print_table(rows: &[Vec<String>]) -> CliResult {
    let cols = rows.iter().map(Vec::len).max().unwrap_or(0);
    let widths: Vec<usize> = (0..cols)
        .map(|c| {
            rows.iter()
                .filter_map(|r| r.get(c))
                .map(|s| s.chars().count())
                .max()
                .unwrap_or(0)
        })
        .collect();
    for r in rows {
        let line: Vec<String> = r
            .iter()
            .enumerate()
            .map(|(i, s)| {
                if i + 1 == r.len() {
                    s.clone()
                } else {
                    format!("{s:<w$}", w = widths[i])
                }
            })
            .collect();
        outln!("{}", line.join("   ").trim_end())?;
    }
    Ok(())
}

/// The `AGE` of an object created at `created` (RFC 3339), in kubectl's short form.
pub fn age(created: Option<&str>) -> String {
    let Some(ts) = created.and_then(|c| c.parse::<k8s_openapi::jiff::Timestamp>().ok()) else {
        return "<unknown>".into();
    };
    let now = k8s_openapi::jiff::Timestamp::now();
    human_duration(now.as_second() - ts.as_second())
}

/// kubectl's `HumanDuration`: exact up to two minutes, then two units while the first is
/// small and one unit after that.
pub fn human_duration(seconds: i64) -> String {
    if seconds < -1 {
        // More than the clock skew tolerated: a creation time in the future.
        return "<invalid>".into();
    }
    if seconds < 0 {
        return "0s".into();
    }
    if seconds < 60 * 2 {
        return format!("{seconds}s");
    }
    let minutes = seconds / 60;
    if minutes < 10 {
        let s = seconds % 60;
        return if s == 0 {
            format!("{minutes}m")
        } else {
            format!("{minutes}m{s}s")
        };
    }
    if minutes < 60 * 3 {
        return format!("{minutes}m");
    }
    let hours = minutes / 60;
    if hours < 8 {
        let m = minutes % 60;
        return if m == 0 {
            format!("{hours}h")
        } else {
            format!("{hours}h{m}m")
        };
    }
    if hours < 48 {
        return format!("{hours}h");
    }
    if hours < 24 * 8 {
        let h = hours % 24;
        return if h == 0 {
            format!("{}d", hours / 24)
        } else {
            format!("{}d{h}h", hours / 24)
        };
    }
    if hours < 24 * 365 * 2 {
        return format!("{}d", hours / 24);
    }
    if hours < 24 * 365 * 8 {
        let d = (hours / 24) % 365;
        return if d == 0 {
            format!("{}y", hours / 24 / 365)
        } else {
            format!("{}y{d}d", hours / 24 / 365)
        };
    }
    format!("{}y", hours / 24 / 365)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn human_duration_follows_kubectl() {
        for (s, want) in [
            (-5, "<invalid>"),
            (-1, "0s"),
            (5, "5s"),
            (119, "119s"),
            (120, "2m"),
            (185, "3m5s"),
            (600, "10m"),
            (3 * 3600 + 60, "3h1m"),
            (8 * 3600, "8h"),
            (2 * 86400, "2d"),
            (3 * 86400 + 3600, "3d1h"),
            (30 * 86400, "30d"),
            (3 * 365 * 86400, "3y"),
            (3 * 365 * 86400 + 86400, "3y1d"),
            (9 * 365 * 86400, "9y"),
        ] {
            assert_eq!(human_duration(s), want, "{s}s");
        }
    }

    #[test]
    fn templates_render_like_kubectl() {
        let list = json!({"items": [{"metadata": {"name": "a"}}, {"metadata": {"name": "b"}}]});
        let t = parse_template("{.items[*].metadata.name}").unwrap();
        assert_eq!(render_template(&t, &list), "a b");
        let t = parse_template(r#"{range .items[*]}name={.metadata.name}{"\n"}{end}"#).unwrap();
        assert_eq!(render_template(&t, &list), "name=a\nname=b\n");
        assert!(parse_template("{range .items[*]}").is_err());
        assert!(parse_template("{.a").is_err());
        assert!(parse_template("{end}").is_err());
    }

    #[test]
    fn yaml_quotes_what_yaml_1_1_reads_as_another_type() {
        let v = json!({"yes": ["yes", "on", "N", "2026-01-01", "1:20", "1_000", "0b11", "it's", "web-1", "10.0.0.1"]});
        let text = yaml(&v).unwrap();
        assert_eq!(
            text,
            "'yes':\n- 'yes'\n- 'on'\n- 'N'\n- '2026-01-01'\n- '1:20'\n- '1_000'\n- '0b11'\n- it's\n- web-1\n- 10.0.0.1\n"
        );
        let back: Value = serde_norway::from_str(&text).unwrap();
        assert_eq!(back, v);
    }
}
