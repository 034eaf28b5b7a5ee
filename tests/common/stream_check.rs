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
    /// A volatile handler told of changes before their commit: a commit that then failed is
    /// taken back, so the handler may be told an object went back to a state it had (an update
    /// to an older RV the server sent) or away (a delete carrying the state it was told), and
    /// then forward again.
    pub allow_rollbacks: bool,
}

/// An RV range `(lo, hi]` in which a list (the initial list or a relist after 410) may have
/// replaced the server's events with their net result: each object once at its RV as of the list
/// (an add even for an object the server modified after creating it), and a delete found by the
/// list carrying the last state the store knew rather than the deletion's RV.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ListWindow {
    /// Exclusive lower bound: the RV the informer had before the list.
    pub lo: u64,
    /// Inclusive upper bound: an RV at or above the list's RV.
    pub hi: u64,
}

impl ListWindow {
    fn contains(&self, rv: u64) -> bool {
        rv > self.lo && rv <= self.hi
    }
}

/// Checks `delivered` against `server` (the server's event list, in RV order).
pub fn check(delivered: &[Ev], server: &[Ev], opts: Opts) -> Result<(), String> {
    check_with_lists(delivered, server, opts, &[])
}

/// Like [`check`], except that inside the `lists` windows a list may have collapsed events (see
/// [`ListWindow`]); outside them every event must be delivered exactly as the server sent it.
pub fn check_with_lists(delivered: &[Ev], server: &[Ev], opts: Opts, lists: &[ListWindow]) -> Result<(), String> {
    let window_of = |rv: u64| lists.iter().find(|w| w.contains(rv));
    let mut by_key: BTreeMap<&str, Vec<(u64, Kind)>> = BTreeMap::new();
    for e in server {
        by_key.entry(e.key.as_str()).or_default().push((e.rv, e.kind));
    }
    let server_kind = |key: &str, rv: u64| {
        by_key
            .get(key)
            .and_then(|v| v.iter().find(|(r, _)| *r == rv).map(|(_, k)| *k))
    };
    // A delete reported by a list: the key had this version, then a delete inside a window.
    let listed_delete = |e: &Ev| {
        matches!(server_kind(&e.key, e.rv), Some(k) if k != Kind::Delete)
            && by_key.get(e.key.as_str()).is_some_and(|v| {
                v.iter()
                    .any(|(r, k)| *k == Kind::Delete && *r > e.rv && window_of(*r).is_some())
            })
    };
    let mut last: BTreeMap<&str, u64> = BTreeMap::new();
    let mut seen: BTreeSet<(&str, u64, Kind)> = BTreeSet::new();
    for (i, e) in delivered.iter().enumerate() {
        let exact = server_kind(&e.key, e.rv) == Some(e.kind);
        let listed_state = e.kind != Kind::Delete
            && server_kind(&e.key, e.rv).is_some_and(|k| k != Kind::Delete)
            && window_of(e.rv).is_some();
        let listed_del = e.kind == Kind::Delete && !exact && listed_delete(e);
        let prev = last.get(e.key.as_str()).copied();
        let taken_back = opts.allow_rollbacks
            && !exact
            && server_kind(&e.key, e.rv).is_some_and(|k| k != Kind::Delete)
            && match e.kind {
                Kind::Delete => prev.is_some_and(|p| e.rv <= p),
                _ => prev.is_some_and(|p| e.rv < p),
            };
        if !(exact || listed_state || listed_del || taken_back) {
            return Err(format!("#{i} {e:?} was delivered but the server never sent it"));
        }
        let repeat = seen.contains(&(e.key.as_str(), e.rv, e.kind));
        if repeat && !opts.allow_duplicates {
            return Err(format!("#{i} {e:?}: delivered twice"));
        }
        if let Some(&prev) = last.get(e.key.as_str()) {
            // A redelivery after a crash repeats an earlier event; a delete found by a list
            // carries the version delivered last; anything else must move forward.
            let ok = e.rv > prev || (opts.allow_duplicates && repeat) || (listed_del && e.rv == prev) || taken_back;
            if !ok {
                return Err(format!("#{i} {e:?}: RV not increasing for {} (previous {prev})", e.key));
            }
        }
        seen.insert((e.key.as_str(), e.rv, e.kind));
        // After a rollback the handler is told forward again from where it went back.
        let next = if taken_back { e.rv } else { prev.unwrap_or(0).max(e.rv) };
        last.insert(e.key.as_str(), next);
    }
    let delivered_rvs: BTreeSet<(&str, u64)> = delivered.iter().map(|e| (e.key.as_str(), e.rv)).collect();
    let delivered_keys: BTreeSet<&str> = delivered.iter().map(|e| e.key.as_str()).collect();
    let deleted_keys: BTreeSet<&str> = delivered
        .iter()
        .filter(|e| e.kind == Kind::Delete)
        .map(|e| e.key.as_str())
        .collect();
    let mut missing = Vec::new();
    for e in server.iter().filter(|e| e.rv > opts.from_rv) {
        if seen.contains(&(e.key.as_str(), e.rv, e.kind)) {
            continue;
        }
        let excused = window_of(e.rv).is_some_and(|w| {
            let superseded = by_key[e.key.as_str()].iter().any(|(r, _)| *r > e.rv && *r <= w.hi);
            let listed_as_other_kind = e.kind != Kind::Delete && delivered_rvs.contains(&(e.key.as_str(), e.rv));
            // A delete the list found is reported with the last known state, and an object
            // created and deleted while away is never reported at all.
            let delete_found = e.kind == Kind::Delete
                && (deleted_keys.contains(e.key.as_str()) || !delivered_keys.contains(e.key.as_str()));
            superseded || listed_as_other_kind || delete_found
        });
        if !excused {
            missing.push(e);
        }
    }
    if let Some(first) = missing.first() {
        return Err(format!(
            "gap: {} server events never delivered, first {first:?}",
            missing.len()
        ));
    }
    Ok(())
}

/// One uninterrupted stream from a watch: RVs never decrease, across keys too (the server sends
/// events in RV order and the informer logs and delivers them in that order).
pub fn check_globally_ordered(delivered: &[Ev]) -> Result<(), String> {
    for (i, w) in delivered.windows(2).enumerate() {
        if w[1].rv < w[0].rv {
            return Err(format!(
                "#{} {:?} after {:?}: RV went backwards across keys",
                i + 1,
                w[1],
                w[0]
            ));
        }
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
            ..Opts::default()
        }
    )
    .is_ok());
    let invented = vec![Ev::new("z", 9, Kind::Add)];
    assert!(check(
        &invented,
        &server,
        Opts {
            from_rv: 9,
            ..Opts::default()
        }
    )
    .unwrap_err()
    .contains("never sent"));
    assert!(check_globally_ordered(&server).is_ok());
    assert!(check_globally_ordered(&reordered).unwrap_err().contains("backwards"));

    // A list at RV 6 collapsed "c" (added at 4, updated at 5) into an add at 5, and found "a"
    // (deleted at 6) gone: the delete carries a's last known version, 3.
    let server = vec![
        Ev::new("a", 1, Kind::Add),
        Ev::new("a", 3, Kind::Update),
        Ev::new("c", 4, Kind::Add),
        Ev::new("c", 5, Kind::Update),
        Ev::new("a", 6, Kind::Delete),
        Ev::new("c", 7, Kind::Update),
    ];
    let listed = vec![
        server[0].clone(),
        server[1].clone(),
        Ev::new("c", 5, Kind::Add),
        Ev::new("a", 3, Kind::Delete),
        server[5].clone(),
    ];
    let window = [ListWindow { lo: 3, hi: 6 }];
    assert!(check_with_lists(&listed, &server, Opts::default(), &window).is_ok());
    // Without the window the same stream has gaps and inventions.
    assert!(check(&listed, &server, Opts::default()).is_err());
    // A window does not excuse a lost event outside it, nor a lost last state inside it.
    let lost_after = &listed[..4];
    assert!(check_with_lists(lost_after, &server, Opts::default(), &window)
        .unwrap_err()
        .contains("gap"));
    let lost_inside = vec![
        server[0].clone(),
        server[1].clone(),
        Ev::new("a", 3, Kind::Delete),
        server[5].clone(),
    ];
    assert!(check_with_lists(&lost_inside, &server, Opts::default(), &window)
        .unwrap_err()
        .contains("gap"));
    // The delete of a key that was delivered must be reported.
    let no_delete = vec![
        server[0].clone(),
        server[1].clone(),
        Ev::new("c", 5, Kind::Add),
        server[5].clone(),
    ];
    assert!(check_with_lists(&no_delete, &server, Opts::default(), &window)
        .unwrap_err()
        .contains("gap"));

    // A volatile handler told of "b" at 7 and "c" at 8 before their commit failed: "b" is
    // taken back to its state at 3, "c" deleted, then both told again from the refetch.
    let server2 = vec![
        Ev::new("b", 3, Kind::Add),
        Ev::new("b", 7, Kind::Update),
        Ev::new("c", 8, Kind::Add),
    ];
    let told = vec![
        Ev::new("b", 3, Kind::Add),
        Ev::new("b", 7, Kind::Update),
        Ev::new("c", 8, Kind::Add),
        Ev::new("b", 3, Kind::Update),
        Ev::new("c", 8, Kind::Delete),
        Ev::new("b", 7, Kind::Update),
        Ev::new("c", 8, Kind::Add),
    ];
    let rollbacks = Opts {
        allow_duplicates: true,
        allow_rollbacks: true,
        ..Opts::default()
    };
    assert!(
        check(&told, &server2, rollbacks).is_ok(),
        "{:?}",
        check(&told, &server2, rollbacks)
    );
    assert!(check(
        &told,
        &server2,
        Opts {
            allow_duplicates: true,
            ..Opts::default()
        }
    )
    .is_err());
    // Going back to a state the server never had is still an invention.
    let wrong = vec![
        Ev::new("b", 3, Kind::Add),
        Ev::new("b", 7, Kind::Update),
        Ev::new("b", 5, Kind::Update),
    ];
    assert!(check(&wrong, &server2, rollbacks).unwrap_err().contains("never sent"));
}
