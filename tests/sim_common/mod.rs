//! Helpers shared by the `sim_*` integration tests: a tiny raw HTTP/1.1 client (so status
//! lines, headers and bodies are seen exactly as sent) and JSON shape comparison.
#![allow(dead_code)]

use std::collections::BTreeMap;
use std::time::Duration;

use serde_json::Value;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

/// A response as received.
#[derive(Debug)]
pub struct RawResponse {
    pub status: u16,
    pub headers: BTreeMap<String, String>,
    pub body: Vec<u8>,
}

impl RawResponse {
    pub fn json(&self) -> Value {
        serde_json::from_slice(&self.body)
            .unwrap_or_else(|e| panic!("body is not JSON ({e}): {}", String::from_utf8_lossy(&self.body)))
    }
    /// The body as watch events (one JSON object per line).
    pub fn events(&self) -> Vec<Value> {
        String::from_utf8_lossy(&self.body)
            .lines()
            .filter(|l| !l.trim().is_empty())
            .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("bad event line ({e}): {l}")))
            .collect()
    }
}

/// Send one request with `Connection: close` and read the whole response (for a watch: until
/// the server ends the stream). Panics after `deadline`.
pub async fn request(addr: std::net::SocketAddr, method: &str, path: &str, body: Option<(&str, &[u8])>) -> RawResponse {
    request_timeout(addr, method, path, body, Duration::from_secs(20)).await
}

pub async fn request_timeout(
    addr: std::net::SocketAddr,
    method: &str,
    path: &str,
    body: Option<(&str, &[u8])>,
    deadline: Duration,
) -> RawResponse {
    request_accept(addr, method, path, "application/json", body, deadline).await
}

/// Like [`request_timeout`], with this `Accept` header.
pub async fn request_accept(
    addr: std::net::SocketAddr,
    method: &str,
    path: &str,
    accept: &str,
    body: Option<(&str, &[u8])>,
    deadline: Duration,
) -> RawResponse {
    tokio::time::timeout(deadline, async {
        let mut s = TcpStream::connect(addr).await.expect("connect");
        let mut req = format!("{method} {path} HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\nAccept: {accept}\r\n");
        if let Some((ct, b)) = body {
            req.push_str(&format!("Content-Type: {ct}\r\nContent-Length: {}\r\n", b.len()));
        }
        req.push_str("\r\n");
        s.write_all(req.as_bytes()).await.expect("write");
        if let Some((_, b)) = body {
            s.write_all(b).await.expect("write body");
        }
        let mut raw = Vec::new();
        let _ = s.read_to_end(&mut raw).await;
        parse_response(&raw)
    })
    .await
    .unwrap_or_else(|_| panic!("{method} {path} did not finish within {deadline:?}"))
}

pub fn parse_response(raw: &[u8]) -> RawResponse {
    let split = raw.windows(4).position(|w| w == b"\r\n\r\n").expect("header end");
    let head = String::from_utf8_lossy(&raw[..split]).to_string();
    let mut lines = head.split("\r\n");
    let status_line = lines.next().expect("status line");
    let status = status_line
        .split(' ')
        .nth(1)
        .and_then(|s| s.parse().ok())
        .expect("status code");
    let headers: BTreeMap<String, String> = lines
        .filter_map(|l| l.split_once(':'))
        .map(|(k, v)| (k.trim().to_ascii_lowercase(), v.trim().to_string()))
        .collect();
    let rest = &raw[split + 4..];
    let body = if headers.get("transfer-encoding").is_some_and(|v| v.contains("chunked")) {
        dechunk(rest)
    } else {
        rest.to_vec()
    };
    RawResponse { status, headers, body }
}

/// Decode a chunked body; a truncated body gives what arrived.
pub fn dechunk(mut b: &[u8]) -> Vec<u8> {
    let mut out = Vec::new();
    while let Some(eol) = b.windows(2).position(|w| w == b"\r\n") {
        let size = usize::from_str_radix(String::from_utf8_lossy(&b[..eol]).trim(), 16).unwrap_or(0);
        if size == 0 {
            break;
        }
        let start = eol + 2;
        let end = (start + size).min(b.len());
        out.extend_from_slice(&b[start..end]);
        if end + 2 > b.len() {
            break;
        }
        b = &b[end + 2..];
    }
    out
}

/// Fields whose values differ between any two servers (identity and time).
pub const VOLATILE: &[&str] = &[
    "uid",
    "resourceVersion",
    "creationTimestamp",
    "deletionTimestamp",
    "time",
    "continue",
];

/// Compare two JSON values field by field: same keys and same types everywhere; same scalar
/// values except for the `VOLATILE` keys. Returns the differences as paths.
pub fn shape_diff(path: &str, a: &Value, b: &Value, out: &mut Vec<String>) {
    match (a, b) {
        (Value::Object(x), Value::Object(y)) => {
            for k in x.keys().chain(y.keys()) {
                let p = format!("{path}.{k}");
                match (x.get(k), y.get(k)) {
                    (Some(_), None) => out.push(format!("{p}: only in first")),
                    (None, Some(_)) => out.push(format!("{p}: only in second")),
                    (Some(va), Some(vb)) => {
                        if VOLATILE.contains(&k.as_str()) {
                            if std::mem::discriminant(va) != std::mem::discriminant(vb) {
                                out.push(format!("{p}: type differs"));
                            }
                        } else {
                            shape_diff(&p, va, vb, out);
                        }
                    }
                    (None, None) => {}
                }
            }
            out.dedup();
        }
        (Value::Array(x), Value::Array(y)) => {
            if x.len() != y.len() {
                out.push(format!("{path}: array length {} vs {}", x.len(), y.len()));
            }
            for (i, (va, vb)) in x.iter().zip(y).enumerate() {
                shape_diff(&format!("{path}[{i}]"), va, vb, out);
            }
        }
        _ => {
            if a != b {
                out.push(format!("{path}: {a} vs {b}"));
            }
        }
    }
}

pub fn assert_same_shape(what: &str, a: &Value, b: &Value) {
    let mut d = Vec::new();
    shape_diff("", a, b, &mut d);
    assert!(d.is_empty(), "{what}: differences:\n{}", d.join("\n"));
}

pub fn wire(name: &str) -> String {
    let p = format!("{}/tests/data/k8s-wire/{name}", env!("CARGO_MANIFEST_DIR"));
    std::fs::read_to_string(&p).unwrap_or_else(|e| panic!("read {p}: {e}"))
}

/// A recorded `.http` file: status code, headers, body.
pub fn wire_http(name: &str) -> RawResponse {
    let text = wire(name).replace("\r\n", "\n");
    let (head, body) = text.split_once("\n\n").expect("blank line after headers");
    let mut lines = head.lines();
    let status = lines
        .next()
        .and_then(|l| l.split_whitespace().nth(1))
        .and_then(|s| s.parse().ok())
        .expect("status");
    let headers = lines
        .filter_map(|l| l.split_once(':'))
        .map(|(k, v)| (k.trim().to_ascii_lowercase(), v.trim().to_string()))
        .collect();
    RawResponse {
        status,
        headers,
        body: body.trim().as_bytes().to_vec(),
    }
}

/// Strip what a server assigns, so a recorded object can be created again.
pub fn strip_server_fields(mut v: Value) -> Value {
    if let Some(m) = v.get_mut("metadata").and_then(Value::as_object_mut) {
        for k in ["uid", "resourceVersion", "creationTimestamp"] {
            m.remove(k);
        }
    }
    v
}

/// Decode a continue token (base64url JSON).
pub fn decode_token(t: &str) -> Value {
    const A: &str = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_";
    let mut bits = 0u32;
    let mut n = 0;
    let mut out = Vec::new();
    for c in t.trim_end_matches('=').chars() {
        let c = match c {
            '+' => '-',
            '/' => '_',
            c => c,
        };
        let v = A.find(c).expect("base64 char") as u32;
        bits = (bits << 6) | v;
        n += 6;
        if n >= 8 {
            n -= 8;
            out.push(((bits >> n) & 0xff) as u8);
        }
    }
    serde_json::from_slice(&out).expect("token JSON")
}

/// Apply watch events to a list of items keyed by namespace/name (the informer's view).
pub fn apply_events(items: &[Value], events: &[Value]) -> BTreeMap<String, Value> {
    let key = |o: &Value| {
        format!(
            "{}/{}",
            o.pointer("/metadata/namespace").and_then(Value::as_str).unwrap_or(""),
            o.pointer("/metadata/name").and_then(Value::as_str).unwrap_or("")
        )
    };
    let mut m: BTreeMap<String, Value> = items.iter().map(|o| (key(o), o.clone())).collect();
    for e in events {
        let obj = &e["object"];
        match e["type"].as_str() {
            Some("ADDED" | "MODIFIED") => {
                m.insert(key(obj), obj.clone());
            }
            Some("DELETED") => {
                m.remove(&key(obj));
            }
            _ => {}
        }
    }
    m
}

/// Items with `kind`/`apiVersion` removed (list items do not carry them).
pub fn without_type(v: &Value) -> Value {
    let mut v = v.clone();
    if let Some(o) = v.as_object_mut() {
        o.remove("kind");
        o.remove("apiVersion");
    }
    v
}
