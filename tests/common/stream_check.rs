//! A reusable property checker for what a handler was delivered, against the server's event list.
//!
//! Properties (see [`check`]): per key, resourceVersions strictly increase (non-decreasing when a
//! crash allows at-least-once duplicates); no `(key, rv)` is delivered twice unless duplicates are
//! allowed; no gaps — every server event after `from_rv` was delivered, with its type; nothing was
//! delivered that the server never sent. [`assert_resumed_equals_uninterrupted`] compares a stream
//! resumed after restarts with an uninterrupted one.

#![allow(dead_code)]

use std::collections::{BTreeMap, BTreeSet};

/// The type of a delivered or server event.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Kind {
    /// ADDED / handler add.
    Add,
    /// MODIFIED / handler update.
    Update,
    /// DELETED / handler delete.
    Delete,
}

/// One event: object key, the RV of the object version it carries, and its type.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Ev {
    pub key: String,
    pub rv: u64,
    pub kind: Kind,
}

impl Ev {
    pub fn new(key: impl Into<String>, rv: u64, kind: Kind) -> Self {
        Self {
            key: key.into(),
            rv,
            kind,
        }
    }
}

/// What the checker may assume.
#[derive(Debug, Clone, Copy, Default)]
pub struct Opts {
    /// A crash happened: at-least-once delivery may repeat events (never reorder them per key).
    pub allow_duplicates: bool,
    /// Server events at or below this RV are not expected (delivered before the handler existed).
    pub from_rv: u64,
}

/// Checks `delivered` against `server` (the server's event list, in RV order).
pub fn check(delivered: &[Ev], server: &[Ev], opts: Opts) -> Result<(), String> {
    let mut last: BTreeMap<&str, u64> = BTreeMap::new();
    let mut seen: BTreeSet<(&str, u64)> = BTreeSet::new();
    for (i, e) in delivered.iter().enumerate() {
        let repeat = seen.contains(&(e.key.as_str(), e.rv));
        if repeat && !opts.allow_duplicates {
            return Err(format!("#{i} {e:?}: delivered twice"));
        }
        if let Some(&prev) = last.get(e.key.as_str()) {
            // A redelivery after a crash repeats an earlier event; anything else must move forward.
            if !(e.rv > prev || (opts.allow_duplicates && repeat)) {
                return Err(format!("#{i} {e:?}: RV not increasing for {} (previous {prev})", e.key));
            }
        }
        seen.insert((e.key.as_str(), e.rv));
        last.insert(e.key.as_str(), last.get(e.key.as_str()).copied().unwrap_or(0).max(e.rv));
    }
    let server_set: BTreeSet<&Ev> = server.iter().collect();
    for e in delivered {
        if !server_set.contains(e) {
            return Err(format!("{e:?} was delivered but the server never sent it"));
        }
    }
    let delivered_set: BTreeSet<&Ev> = delivered.iter().collect();
    let missing: Vec<&Ev> = server
        .iter()
        .filter(|e| e.rv > opts.from_rv && !delivered_set.contains(e))
        .collect();
    if !missing.is_empty() {
        return Err(format!(
            "gap: {} server events never delivered, first {:?}",
            missing.len(),
            missing[0]
        ));
    }
    Ok(())
}

/// Drops repeats of an already delivered `(key, rv, kind)` (at-least-once redelivery after a
/// crash), keeping the first occurrence.
pub fn dedup(delivered: &[Ev]) -> Vec<Ev> {
    let mut seen = BTreeSet::new();
    delivered
        .iter()
        .filter(|e| seen.insert((*e).clone()))
        .cloned()
        .collect()
}

/// A stream resumed after restarts (deduplicated) equals an uninterrupted one, per key and in
/// order; across keys, only the per-key order is a contract.
pub fn assert_resumed_equals_uninterrupted(resumed: &[Ev], uninterrupted: &[Ev]) {
    let per_key = |s: &[Ev]| {
        let mut m: BTreeMap<String, Vec<(u64, Kind)>> = BTreeMap::new();
        for e in s {
            m.entry(e.key.clone()).or_default().push((e.rv, e.kind));
        }
        m
    };
    assert_eq!(
        per_key(&dedup(resumed)),
        per_key(uninterrupted),
        "resumed stream differs from the uninterrupted one"
    );
}

/// Self-test of the checker on hand-made streams.
pub fn self_test() {
    let server = vec![
        Ev::new("a", 1, Kind::Add),
        Ev::new("b", 2, Kind::Add),
        Ev::new("a", 3, Kind::Update),
    ];
    assert!(check(&server, &server, Opts::default()).is_ok());
    assert!(check(&server[..2], &server, Opts::default())
        .unwrap_err()
        .contains("gap"));
    let reordered = vec![server[2].clone(), server[0].clone(), server[1].clone()];
    assert!(check(&reordered, &server, Opts::default())
        .unwrap_err()
        .contains("not increasing"));
    let dup = vec![
        server[0].clone(),
        server[1].clone(),
        server[1].clone(),
        server[2].clone(),
    ];
    assert!(check(&dup, &server, Opts::default()).unwrap_err().contains("twice"));
    assert!(check(
        &dup,
        &server,
        Opts {
            allow_duplicates: true,
            from_rv: 0
        }
    )
    .is_ok());
    let invented = vec![Ev::new("z", 9, Kind::Add)];
    assert!(check(
        &invented,
        &server,
        Opts {
            allow_duplicates: false,
            from_rv: 9
        }
    )
    .unwrap_err()
    .contains("never sent"));
}
