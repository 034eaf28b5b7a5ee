//! Small helpers of the simulated server: base64, RFC 3339 time, query-string decoding, UIDs.

use std::time::{SystemTime, UNIX_EPOCH};

const B64: &[u8; 64] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_";

/// base64 with the URL-safe alphabet and no padding (Go's `base64.RawURLEncoding`).
pub(crate) fn b64_encode(data: &[u8]) -> String {
    let mut out = String::with_capacity(data.len().div_ceil(3) * 4);
    for chunk in data.chunks(3) {
        let b = [chunk[0], *chunk.get(1).unwrap_or(&0), *chunk.get(2).unwrap_or(&0)];
        let n = (u32::from(b[0]) << 16) | (u32::from(b[1]) << 8) | u32::from(b[2]);
        let chars = chunk.len() + 1;
        for i in 0..chars {
            out.push(char::from(B64[((n >> (18 - 6 * i)) & 63) as usize]));
        }
    }
    out
}

/// Decode base64 in either alphabet, padding optional. `None` on any garbage (never panics).
pub(crate) fn b64_decode(s: &str) -> Option<Vec<u8>> {
    let s = s.trim_end_matches('=');
    let mut out = Vec::with_capacity(s.len() * 3 / 4);
    let mut acc: u32 = 0;
    let mut bits = 0;
    for c in s.bytes() {
        let v = match c {
            b'A'..=b'Z' => c - b'A',
            b'a'..=b'z' => c - b'a' + 26,
            b'0'..=b'9' => c - b'0' + 52,
            b'-' | b'+' => 62,
            b'_' | b'/' => 63,
            _ => return None,
        };
        acc = (acc << 6) | u32::from(v);
        bits += 6;
        if bits >= 8 {
            bits -= 8;
            out.push(((acc >> bits) & 0xff) as u8);
        }
    }
    if bits >= 6 {
        return None;
    }
    Some(out)
}

/// The current time as RFC 3339 with second precision, e.g. `2026-11-22T09:07:28Z`.
pub(crate) fn now_rfc3339() -> String {
    let secs = SystemTime::now().duration_since(UNIX_EPOCH).map_or(0, |d| d.as_secs());
    rfc3339(secs)
}

/// Format seconds since the epoch as RFC 3339 (UTC), e.g. `2026-11-22T09:07:28Z`.
pub(crate) fn rfc3339(secs: u64) -> String {
    let t = i64::try_from(secs)
        .ok()
        .and_then(|s| chrono::DateTime::from_timestamp(s, 0))
        .unwrap_or_default();
    t.to_rfc3339_opts(chrono::SecondsFormat::Secs, true)
}

/// A random UUID (version 4 layout).
pub(crate) fn new_uid() -> String {
    let n: u128 = rand::random();
    let n = (n & !(0xf << 76) | (0x4 << 76)) & !(0x3 << 62) | (0x2 << 62);
    let h = format!("{n:032x}");
    format!(
        "{}-{}-{}-{}-{}",
        &h[0..8],
        &h[8..12],
        &h[12..16],
        &h[16..20],
        &h[20..32]
    )
}

/// Decode one `application/x-www-form-urlencoded` component (`+` is a space).
/// Invalid escapes are kept literally; invalid UTF-8 is replaced.
pub(crate) fn percent_decode(s: &str) -> String {
    let bytes = s.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        match bytes[i] {
            b'+' => out.push(b' '),
            b'%' if i + 2 < bytes.len() => {
                let hex = std::str::from_utf8(&bytes[i + 1..i + 3]).ok();
                match hex.and_then(|h| u8::from_str_radix(h, 16).ok()) {
                    Some(b) => {
                        out.push(b);
                        i += 2;
                    }
                    None => out.push(b'%'),
                }
            }
            b => out.push(b),
        }
        i += 1;
    }
    String::from_utf8_lossy(&out).into_owned()
}

/// Parse a query string into (name, value) pairs, decoded.
pub(crate) fn parse_query(q: Option<&str>) -> Vec<(String, String)> {
    q.unwrap_or("")
        .split('&')
        .filter(|p| !p.is_empty())
        .map(|p| match p.split_once('=') {
            Some((k, v)) => (percent_decode(k), percent_decode(v)),
            None => (percent_decode(p), String::new()),
        })
        .collect()
}

/// [`Value::pointer`] without its allocations: it unescapes every token (`~1`, `~0`) into a
/// new `String`, which made it a tenth of the test harness's CPU. Paths with a `~` still go
/// through it.
pub(crate) trait JsonAt {
    /// The value at a JSON pointer (RFC 6901), as [`Value::pointer`].
    fn at(&self, path: &str) -> Option<&serde_json::Value>;
    /// The value at a JSON pointer, mutably, as [`Value::pointer_mut`].
    #[cfg_attr(not(feature = "testing"), allow(dead_code))] // the harness's
    fn at_mut(&mut self, path: &str) -> Option<&mut serde_json::Value>;
}

/// An array index token as RFC 6901 reads it: digits, no sign, no leading zero.
fn index_token(token: &str) -> Option<usize> {
    if token.starts_with('+') || (token.len() > 1 && token.starts_with('0')) {
        return None;
    }
    token.parse().ok()
}

/// One pointer token's step into `v`.
fn child<'a>(v: &'a serde_json::Value, token: &str) -> Option<&'a serde_json::Value> {
    match v {
        serde_json::Value::Object(m) => m.get(token),
        serde_json::Value::Array(a) => index_token(token).and_then(|i| a.get(i)),
        _ => None,
    }
}

/// The value at a field path (`spec.nodeName`): the pointer's tokens, split at dots.
pub(crate) fn at_dotted<'a>(v: &'a serde_json::Value, path: &str) -> Option<&'a serde_json::Value> {
    path.split('.').try_fold(v, child)
}

impl JsonAt for serde_json::Value {
    fn at(&self, path: &str) -> Option<&serde_json::Value> {
        if path.contains('~') {
            return self.pointer(path);
        }
        if path.is_empty() {
            return Some(self);
        }
        path.strip_prefix('/')?.split('/').try_fold(self, child)
    }

    fn at_mut(&mut self, path: &str) -> Option<&mut serde_json::Value> {
        if path.contains('~') {
            return self.pointer_mut(path);
        }
        if path.is_empty() {
            return Some(self);
        }
        path.strip_prefix('/')?.split('/').try_fold(self, |v, token| match v {
            serde_json::Value::Object(m) => m.get_mut(token),
            serde_json::Value::Array(a) => index_token(token).and_then(|i| a.get_mut(i)),
            _ => None,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn base64_round_trips_and_matches_the_recorded_token() {
        let token = "eyJ2IjoibWV0YS5rOHMuaW8vdjEiLCJydiI6MzQ3LCJzdGFydCI6InJlYy1jbS0xMlx1MDAwMCJ9";
        let raw = b64_decode(token).expect("valid");
        assert_eq!(
            std::str::from_utf8(&raw).expect("utf8"),
            r#"{"v":"meta.k8s.io/v1","rv":347,"start":"rec-cm-12\u0000"}"#
        );
        assert_eq!(b64_encode(&raw), token);
        for n in 0..20 {
            let data: Vec<u8> = (0..n).map(|i| (i * 37 + 11) as u8).collect();
            assert_eq!(b64_decode(&b64_encode(&data)).as_deref(), Some(&data[..]));
        }
        assert_eq!(b64_decode("a"), None);
        assert_eq!(b64_decode("ab!c"), None);
    }

    #[test]
    fn time_and_query_helpers() {
        assert_eq!(rfc3339(0), "1970-01-01T00:00:00Z");
        assert_eq!(rfc3339(1_795_338_448), "2026-11-22T09:07:28Z");
        assert_eq!(percent_decode("app%3Dweb+x%2"), "app=web x%2");
        assert_eq!(
            parse_query(Some("a=1&labelSelector=x%20in%20(a%2Cb)&w")),
            vec![
                ("a".into(), "1".into()),
                ("labelSelector".into(), "x in (a,b)".into()),
                ("w".into(), String::new())
            ]
        );
        let uid = new_uid();
        assert_eq!(uid.len(), 36);
        assert_eq!(&uid[14..15], "4");
    }

    proptest::proptest! {
        /// `at` and `at_mut` answer what `Value::pointer` does, escapes, indexes and all.
        #[test]
        fn at_agrees_with_pointer(
            tokens in proptest::collection::vec(
                proptest::sample::select(vec!["", "a", "b", "0", "1", "01", "+1", "a~1b", "c~0", "~2", "10"]),
                0..4,
            ),
            slash in proptest::bool::ANY,
        ) {
            let mut v = serde_json::json!({
                "a": {"b": [1, {"a": 2}], "0": "zero", "": {"": 3}},
                "a/b": {"c~": [4, 5]},
                "": [{"1": 6}, 7],
                "b": [[8], [9, {"c~": 10}]],
            });
            let mut path: String = tokens.iter().map(|t| format!("/{t}")).collect();
            if !slash {
                path = path.trim_start_matches('/').to_string();
            }
            let want = v.pointer(&path).cloned();
            proptest::prop_assert_eq!(v.at(&path).cloned(), want.clone());
            proptest::prop_assert_eq!(v.at_mut(&path).map(|x| x.clone()), want);
        }
    }
}
