//! The fuzz targets of `fuzz/` as proptest cases that run in CI on stable: every parser that sees
//! bytes from the network or from disk gets arbitrary bytes and structured-but-mangled JSON, and
//! must return `Ok` or `Err` — never panic. Targets: the watch-line decoder, metadata
//! extraction, the LIST decoder, the recording parser, label and field selector parsing, and the
//! sim's continue-token decoder (directly, and over HTTP with mangled real tokens).
//!
//! `PROPTEST_CASES` raises the number of cases (default here: 512 per target).

use std::io::{Read, Write};

use durable_informer::object::extract_meta;
use durable_informer::reflector::Transform;
use durable_informer::replay::RecordingReader;
use durable_informer::selector::{FieldSelector, LabelSelector};
use durable_informer::source::{decode_list, decode_watch_line, WatchEvent};
use proptest::prelude::*;

fn cases() -> u32 {
    std::env::var("PROPTEST_CASES")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(512)
}

/// A plausible Kubernetes object: metadata with some fields present, some wrong-typed.
fn object_json() -> impl Strategy<Value = serde_json::Value> {
    let scalar = prop_oneof![
        Just(serde_json::Value::Null),
        any::<bool>().prop_map(serde_json::Value::Bool),
        any::<i64>().prop_map(|n| serde_json::json!(n)),
        any::<f64>().prop_map(|n| serde_json::json!(n)),
        ".{0,12}".prop_map(serde_json::Value::String),
        Just(serde_json::json!([])),
        Just(serde_json::json!({})),
    ];
    let field = prop_oneof![
        ".{0,12}".prop_map(serde_json::Value::String),
        "[0-9]{0,25}".prop_map(serde_json::Value::String),
        scalar.clone(),
    ];
    (
        proptest::option::of(field.clone()),
        proptest::option::of(field.clone()),
        proptest::option::of(field.clone()),
        proptest::option::of(field.clone()),
        proptest::option::of(prop_oneof![
            proptest::collection::btree_map(".{0,6}", ".{0,6}", 0..4).prop_map(|m| serde_json::json!(m)),
            scalar.clone()
        ]),
        proptest::option::of(scalar.clone()),
        proptest::option::of(prop_oneof![
            Just(serde_json::json!([{"manager": "kubectl", "fieldsV1": {"f:data": {".": {}}}}])),
            scalar,
        ]),
    )
        .prop_map(|(name, ns, rv, uid, labels, owners, managed)| {
            let mut meta = serde_json::Map::new();
            for (k, v) in [
                ("name", name),
                ("namespace", ns),
                ("resourceVersion", rv),
                ("uid", uid),
                ("labels", labels),
                ("ownerReferences", owners),
                ("managedFields", managed),
            ] {
                if let Some(v) = v {
                    meta.insert(k.to_owned(), v);
                }
            }
            serde_json::json!({"apiVersion": "v1", "kind": "ConfigMap", "metadata": meta})
        })
}

/// Mangles serialized JSON: truncates it, flips a byte, or splices in junk.
fn mangle(json: String) -> impl Strategy<Value = Vec<u8>> {
    let len = json.len();
    (
        0..=len,
        any::<u8>(),
        0usize..4,
        proptest::collection::vec(any::<u8>(), 0..8),
    )
        .prop_map(move |(at, byte, how, junk)| {
            let mut b = json.clone().into_bytes();
            match how {
                0 => b.truncate(at),
                1 if at < b.len() => b[at] = byte,
                2 => {
                    b.splice(at..at, junk);
                }
                _ => {}
            }
            b
        })
}

fn watch_line() -> impl Strategy<Value = Vec<u8>> {
    let kind = prop_oneof![
        Just("ADDED"),
        Just("MODIFIED"),
        Just("DELETED"),
        Just("BOOKMARK"),
        Just("ERROR"),
        Just("BOGUS")
    ];
    let status = (any::<u16>(), ".{0,10}").prop_map(|(code, reason)| {
        serde_json::json!({"kind": "Status", "apiVersion": "v1", "code": code, "reason": reason, "message": "m"})
    });
    (kind, prop_oneof![object_json(), status])
        .prop_map(|(k, o)| serde_json::json!({"type": k, "object": o}).to_string())
        .prop_flat_map(mangle)
}

fn list_body() -> impl Strategy<Value = Vec<u8>> {
    (
        proptest::collection::vec(object_json(), 0..4),
        proptest::option::of("[0-9]{0,20}"),
        proptest::option::of(".{0,16}"),
        proptest::option::of(any::<i64>()),
    )
        .prop_map(|(items, rv, cont, remaining)| {
            serde_json::json!({
                "kind": "ConfigMapList",
                "apiVersion": "v1",
                "metadata": {"resourceVersion": rv, "continue": cont, "remainingItemCount": remaining},
                "items": items,
            })
            .to_string()
        })
        .prop_flat_map(mangle)
}

fn recording() -> impl Strategy<Value = Vec<u8>> {
    proptest::collection::vec(
        prop_oneof![
            watch_line(),
            list_body(),
            proptest::collection::vec(any::<u8>(), 0..64),
            Just(b"{\"type\":\"ADDED\"".to_vec()),
        ],
        0..6,
    )
    .prop_map(|lines| lines.join(&b'\n'))
}

fn selector_text() -> impl Strategy<Value = String> {
    let token = prop_oneof![
        "[a-z0-9./-]{0,8}",
        Just("=".to_owned()),
        Just("==".to_owned()),
        Just("!=".to_owned()),
        Just("!".to_owned()),
        Just(" in ".to_owned()),
        Just(" notin ".to_owned()),
        Just("(".to_owned()),
        Just(")".to_owned()),
        Just(",".to_owned()),
        Just(">".to_owned()),
        Just("<".to_owned()),
        Just("\\".to_owned()),
        ".{0,3}",
    ];
    proptest::collection::vec(token, 0..10).prop_map(|t| t.concat())
}

/// Reads every event of a recording; a parser error ends the read (that is a valid outcome).
fn read_recording(bytes: Vec<u8>) {
    if let Ok(mut r) = RecordingReader::from_reader("fuzz.jsonl", std::io::Cursor::new(bytes)) {
        for _ in 0..10_000 {
            match r.next_event() {
                Ok(Some(_)) => {}
                Ok(None) | Err(_) => break,
            }
        }
        let _ = (r.skipped(), r.truncated_tail());
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: cases(), failure_persistence: None, ..ProptestConfig::default() })]

    #[test]
    fn watch_line_decoder_never_panics_on_bytes(bytes in proptest::collection::vec(any::<u8>(), 0..256)) {
        let _ = decode_watch_line(&bytes);
    }

    #[test]
    fn watch_line_decoder_never_panics_on_mangled_events(line in watch_line()) {
        let _ = decode_watch_line(&line);
    }

    /// Whatever a mangled line decodes to, dropping `managedFields` (a cut at the position the
    /// decoder's scan found) leaves the same JSON with only that member gone.
    #[test]
    fn the_managed_fields_cut_is_exact_on_mangled_events(line in watch_line()) {
        let Ok(WatchEvent::Added(obj) | WatchEvent::Modified(obj) | WatchEvent::Deleted(obj)) = decode_watch_line(&line) else {
            return Ok(());
        };
        let Ok(mut want) = serde_json::from_slice::<serde_json::Value>(&obj.bytes) else {
            return Ok(());
        };
        if let Some(meta) = want["metadata"].as_object_mut() {
            meta.remove("managedFields");
        }
        if let Ok(Some(out)) = Transform::default().apply(obj) {
            let got: serde_json::Value = serde_json::from_slice(&out.bytes).expect("the cut left valid JSON");
            prop_assert_eq!(got, want);
        }
    }

    #[test]
    fn extract_meta_never_panics(bytes in prop_oneof![
        proptest::collection::vec(any::<u8>(), 0..256),
        object_json().prop_map(|o| o.to_string()).prop_flat_map(mangle),
        object_json().prop_map(|o| o.to_string().into_bytes()),
    ]) {
        let _ = extract_meta(&bytes);
    }

    #[test]
    fn list_decoder_never_panics(bytes in prop_oneof![
        proptest::collection::vec(any::<u8>(), 0..256),
        list_body(),
    ]) {
        let _ = decode_list(&bytes);
    }

    #[test]
    fn recording_parser_never_panics(bytes in prop_oneof![
        proptest::collection::vec(any::<u8>(), 0..512),
        recording(),
    ]) {
        read_recording(bytes);
    }

    #[test]
    fn label_selector_parser_never_panics(s in prop_oneof![selector_text(), ".{0,40}"]) {
        if let Ok(sel) = LabelSelector::parse(&s) {
            let labels = std::collections::BTreeMap::from([("a".to_owned(), "b".to_owned())]);
            let _ = sel.matches(&labels);
        }
    }

    #[test]
    fn field_selector_parser_never_panics(s in prop_oneof![selector_text(), ".{0,40}"]) {
        if let Ok(sel) = FieldSelector::parse(&s) {
            let _ = sel.matches(|f| (f == "metadata.name").then(|| "x".to_owned()));
        }
    }
}

/// base64 (standard alphabet, no padding) of arbitrary bytes: gets past the decoder's base64 step.
fn b64(b: &[u8]) -> String {
    use std::fmt::Write as _;
    let mut s = String::new();
    for chunk in b.chunks(3) {
        let n = chunk.iter().fold(0u32, |a, &x| (a << 8) | u32::from(x)) << (8 * (3 - chunk.len()));
        for i in 0..=chunk.len() {
            let idx = (n >> (18 - 6 * i)) & 63;
            let _ =
                s.write_char(b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/"[idx as usize] as char);
        }
    }
    s
}

/// A raw GET to the sim; the status code (0 when there was no answer).
fn sim_get(addr: std::net::SocketAddr, path_and_query: &str) -> (u16, String) {
    let mut s = std::net::TcpStream::connect(addr).expect("connect");
    s.set_read_timeout(Some(std::time::Duration::from_secs(10)))
        .expect("timeout");
    write!(
        s,
        "GET {path_and_query} HTTP/1.1\r\nHost: sim\r\nConnection: close\r\n\r\n"
    )
    .expect("send");
    let mut out = String::new();
    let _ = s.read_to_string(&mut out);
    let code = out.split_whitespace().nth(1).and_then(|c| c.parse().ok()).unwrap_or(0);
    (code, out)
}

/// A sim with three ConfigMaps and a real continue token from its `limit=1` LIST.
fn sim_with_a_real_token() -> (durable_informer::sim::Sim, String) {
    use durable_informer::sim::{Sim, SimConfig};
    let sim = Sim::start(SimConfig::default()).expect("sim");
    for name in ["a", "b", "c"] {
        sim.create(
            "configmaps",
            Some("default"),
            serde_json::json!({"metadata": {"name": name, "namespace": "default"}}),
        )
        .expect("create");
    }
    let (code, raw) = sim_get(sim.addr(), "/api/v1/namespaces/default/configmaps?limit=1");
    assert_eq!(code, 200, "{raw}");
    let body = raw.split_once("\r\n\r\n").map_or("", |(_, b)| b);
    let start = body.find("\"continue\":\"").expect("a continue token") + "\"continue\":\"".len();
    let len = body[start..].find('"').expect("token end");
    let token = body[start..start + len].to_string();
    (sim, token)
}

/// Mangled versions of a real token: its base64 text mangled, or its JSON mangled and
/// re-encoded (structurally close to valid, so the JSON and field checks are reached).
fn mangled_token(real: String) -> impl Strategy<Value = String> {
    let (rv, start) = durable_informer::sim::decode_continue_token(&real).expect("the real token decodes");
    let json = serde_json::json!({"v": "meta.k8s.io/v1", "rv": rv, "start": start}).to_string();
    prop_oneof![
        mangle(real).prop_map(|b| String::from_utf8_lossy(&b).into_owned()),
        mangle(json).prop_map(|b| b64(&b)),
        (any::<i64>(), ".{0,12}").prop_map(|(rv, start)| b64(
            serde_json::json!({"v": "meta.k8s.io/v1", "rv": rv, "start": start})
                .to_string()
                .as_bytes()
        )),
    ]
}

/// The decoder called directly: mangled real tokens give `Ok` or `Err`, and what it accepts
/// survives a re-encode unchanged (the property of `fuzz/fuzz_targets/continue_token.rs`).
#[test]
fn sim_continue_token_decoder_never_panics_and_round_trips() {
    use durable_informer::sim::{decode_continue_token, encode_continue_token};
    let (_sim, real) = sim_with_a_real_token();
    let mut runner = proptest::test_runner::TestRunner::new(ProptestConfig {
        cases: cases(),
        failure_persistence: None,
        ..ProptestConfig::default()
    });
    let accepted = std::cell::Cell::new(0u32);
    runner
        .run(&prop_oneof![mangled_token(real.clone()), ".{0,40}"], |token| {
            if let Ok((rv, start)) = decode_continue_token(&token) {
                accepted.set(accepted.get() + 1);
                let again = encode_continue_token(rv, &start);
                prop_assert_eq!(decode_continue_token(&again), Ok((rv, start)));
            }
            Ok(())
        })
        .expect("continue tokens");
    // the mangling keeps some tokens valid, so the round trip was exercised
    assert!(accepted.get() > 0, "no mangled token was accepted");
    assert!(decode_continue_token("").is_err());
    assert!(decode_continue_token(&encode_continue_token(3, "../etc")).is_err());
}

/// Over HTTP: a LIST with a mangled `continue` answers with a status (200 / 400 / 410), never
/// crashes the server or hangs, and the server keeps serving.
#[test]
fn sim_continue_token_decoder_never_panics_over_http() {
    let (sim, real) = sim_with_a_real_token();
    let addr = sim.addr();
    let get = |token: &str| -> u16 {
        let enc: String = token.bytes().map(|b| format!("%{b:02X}")).collect();
        sim_get(
            addr,
            &format!("/api/v1/namespaces/default/configmaps?limit=1&continue={enc}"),
        )
        .0
    };
    // the real token pages on
    assert_eq!(get(&real), 200);
    let mut runner = proptest::test_runner::TestRunner::new(ProptestConfig {
        cases: cases().min(256),
        failure_persistence: None,
        ..ProptestConfig::default()
    });
    let strategy = prop_oneof![
        ".{0,40}",
        "[A-Za-z0-9+/=_-]{0,60}",
        proptest::collection::vec(any::<u8>(), 0..40).prop_map(|b| b64(&b)),
        mangled_token(real),
    ];
    runner
        .run(&strategy, |token| {
            let code = get(&token);
            prop_assert!(matches!(code, 200 | 400 | 410), "continue={token:?} gave HTTP {code}");
            Ok(())
        })
        .expect("continue tokens");
    // The server still serves.
    assert_eq!(get(""), 200);
}

/// Found by `field_selector_parser_never_panics` (minimal input `"¡"`): the field selector
/// parser sliced a `&str` inside a multi-byte character. Fixed in `selector::split_op`.
#[test]
fn field_selector_with_non_ascii_does_not_panic() {
    for s in ["¡", "a¡=b", "¡!=x", "\\¡=1", "é==ü", "metadata.name=ü"] {
        let _ = FieldSelector::parse(s);
        let _ = LabelSelector::parse(s);
    }
    assert_eq!(
        FieldSelector::parse("metadata.name=ü").unwrap().requirements()[0].value(),
        "ü"
    );
}
