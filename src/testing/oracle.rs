//! The pure parts of the oracles: comparing states up to volatile fields, and telling a write
//! that overwrote a change its writer had not read.

use std::borrow::Cow;

use serde_json::{Map, Value};

/// Fields the server sets, which differ between two runs that did the same thing: never
/// compared. (`ownerReferences[*].uid` names a uid, which depends on creation order.)
pub(crate) const SERVER_FIELDS: &[&str] = &[
    "/metadata/resourceVersion",
    "/metadata/uid",
    "/metadata/creationTimestamp",
    "/metadata/managedFields",
    "/metadata/generation",
    "/metadata/deletionTimestamp",
    "/metadata/deletionGracePeriodSeconds",
    "/metadata/ownerReferences/*/uid",
];

/// Removes the value at a JSON pointer in which `*` matches every element of an array (or
/// every member of an object).
pub(crate) fn remove_path(v: &mut Value, path: &str) {
    let parts: Vec<Cow<'_, str>> = path.split('/').skip(1).map(unescape).collect();
    remove_parts(v, &parts);
}

/// A pointer token unescaped (copied only when it holds an escape).
fn unescape(t: &str) -> Cow<'_, str> {
    if t.contains('~') {
        Cow::Owned(t.replace("~1", "/").replace("~0", "~"))
    } else {
        Cow::Borrowed(t)
    }
}

fn remove_parts(v: &mut Value, parts: &[Cow<'_, str>]) {
    let Some((first, rest)) = parts.split_first() else {
        return;
    };
    let first: &str = first;
    if rest.is_empty() {
        match v {
            Value::Object(m) => {
                if first == "*" {
                    m.clear();
                } else {
                    m.remove(first);
                }
            }
            Value::Array(a) if first == "*" => a.clear(),
            Value::Array(a) => {
                if let Ok(i) = first.parse::<usize>() {
                    if i < a.len() {
                        a.remove(i);
                    }
                }
            }
            _ => {}
        }
        return;
    }
    match v {
        Value::Object(m) if first == "*" => m.values_mut().for_each(|c| remove_parts(c, rest)),
        Value::Object(m) => {
            if let Some(c) = m.get_mut(first) {
                remove_parts(c, rest);
            }
        }
        Value::Array(a) if first == "*" => a.iter_mut().for_each(|c| remove_parts(c, rest)),
        Value::Array(a) => {
            if let Some(c) = first.parse::<usize>().ok().and_then(|i| a.get_mut(i)) {
                remove_parts(c, rest);
            }
        }
        _ => {}
    }
}

/// An object without the server's fields and the user's volatile ones.
pub(crate) fn normalize(v: &Value, volatile: &[String]) -> Value {
    let mut v = v.clone();
    for p in SERVER_FIELDS {
        remove_path(&mut v, p);
    }
    for p in volatile {
        remove_path(&mut v, p);
    }
    v
}

// A JSON value is compared by its leaves: every value reached through non-empty objects that
// is not itself a non-empty object, named by its pointer. Arrays are leaves: their elements
// have no identity to compare by. The functions below walk two values side by side instead
// of listing their leaves (a string and a copy per leaf, on every write the oracle checks).

/// Pushes `key`, escaped as a pointer token, onto `at`.
fn push_token(at: &mut String, key: &str) {
    at.push('/');
    if key.contains(['~', '/']) {
        at.push_str(&key.replace('~', "~0").replace('/', "~1"));
    } else {
        at.push_str(key);
    }
}

fn is_branch(v: &Value) -> bool {
    matches!(v, Value::Object(m) if !m.is_empty())
}

/// Pushes the pointer of every leaf of `v` (at `at`) onto `out`.
fn all_leaves(v: &Value, at: &mut String, out: &mut Vec<String>) {
    match v {
        Value::Object(m) if !m.is_empty() => {
            for (k, c) in m {
                let len = at.len();
                push_token(at, k);
                all_leaves(c, at, out);
                at.truncate(len);
            }
        }
        _ => out.push(at.clone()),
    }
}

/// Pushes the pointers at which the leaves of `a` and `b` (either may be absent) differ.
fn diff(a: Option<&Value>, b: Option<&Value>, at: &mut String, out: &mut Vec<String>) {
    match (a, b) {
        (Some(Value::Object(ma)), Some(Value::Object(mb))) if !ma.is_empty() && !mb.is_empty() => {
            // Both maps are ordered by key: merge them.
            let (mut ia, mut ib) = (ma.iter().peekable(), mb.iter().peekable());
            loop {
                let (ka, kb) = (ia.peek().map(|(k, _)| *k), ib.peek().map(|(k, _)| *k));
                let (k, va, vb) = match (ka, kb) {
                    (None, None) => break,
                    (Some(x), Some(y)) if x == y => {
                        let (_, va) = ia.next().expect("peeked");
                        let (_, vb) = ib.next().expect("peeked");
                        (x, Some(va), Some(vb))
                    }
                    (Some(x), Some(y)) if x < y => (x, ia.next().map(|(_, v)| v), None),
                    (Some(x), None) => (x, ia.next().map(|(_, v)| v), None),
                    (_, Some(y)) => (y, None, ib.next().map(|(_, v)| v)),
                };
                let len = at.len();
                push_token(at, k);
                diff(va, vb, at, out);
                at.truncate(len);
            }
        }
        (Some(x), Some(y)) if !is_branch(x) && !is_branch(y) => {
            if x != y {
                out.push(at.clone());
            }
        }
        (x, y) => {
            // One side is a branch and the other a leaf or absent, or one side is absent:
            // every leaf of either differs.
            for v in [x, y].into_iter().flatten() {
                all_leaves(v, at, out);
            }
        }
    }
}

/// The pointers whose values differ between `a` and `b`.
pub(crate) fn differing(a: &Value, b: &Value) -> Vec<String> {
    let mut out = Vec::new();
    diff(Some(a), Some(b), &mut String::new(), &mut out);
    out.sort();
    out.dedup();
    out
}

/// The leaf of `v` at pointer `p` (see [`differing`]), or `None`.
fn leaf_at<'a>(v: &'a Value, p: &str) -> Option<&'a Value> {
    let mut v = v;
    for t in p.split('/').skip(1) {
        match v {
            Value::Object(m) if !m.is_empty() => v = m.get(unescape(t).as_ref())?,
            _ => return None,
        }
    }
    (!is_branch(v)).then_some(v)
}

/// Fields a write may change without having read them: the server moves them on every write.
fn server_moved(path: &str) -> bool {
    path.starts_with("/metadata/resourceVersion")
        || path.starts_with("/metadata/managedFields")
        || path.starts_with("/metadata/generation")
}

/// A lost update: the fields that changed between what the writer had read (`read`) and what
/// the server held before the write (`before`), which the write then changed again (`after`).
/// Disjoint changes (a merge patch of other fields) are no loss, and neither is overwriting a
/// value the writer itself wrote last (`own`: what its last write to the object left).
pub(crate) fn lost_update(read: &Value, before: &Value, after: &Value, own: Option<&Value>) -> Vec<String> {
    // Usually the writer read the version it writes over (often the very same value).
    if std::ptr::eq(read, before) || read == before {
        return Vec::new();
    }
    let changed_since_read: Vec<String> = differing(read, before)
        .into_iter()
        .filter(|p| !server_moved(p))
        .collect();
    if changed_since_read.is_empty() {
        return changed_since_read;
    }
    changed_since_read
        .into_iter()
        .filter(|p| own.is_none_or(|o| leaf_at(o, p) != leaf_at(before, p)))
        .filter(|p| leaf_at(before, p) != leaf_at(after, p))
        .collect()
}

/// A JSON merge patch (RFC 7386) taking `old` to `new`.
pub(crate) fn merge_diff(old: &Value, new: &Value) -> Option<Value> {
    match (old, new) {
        (Value::Object(o), Value::Object(n)) => {
            let mut patch = Map::new();
            for (k, nv) in n {
                match o.get(k) {
                    Some(ov) => {
                        if let Some(d) = merge_diff(ov, nv) {
                            patch.insert(k.clone(), d);
                        }
                    }
                    None => {
                        patch.insert(k.clone(), nv.clone());
                    }
                }
            }
            for k in o.keys() {
                if !n.contains_key(k) {
                    patch.insert(k.clone(), Value::Null);
                }
            }
            (!patch.is_empty()).then_some(Value::Object(patch))
        }
        _ if old == new => None,
        _ => Some(new.clone()),
    }
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use super::*;
    use proptest::prelude::*;
    use serde_json::json;

    #[test]
    fn normalize_drops_server_and_volatile_fields() {
        let v = json!({"metadata": {"name": "a", "uid": "u", "resourceVersion": "5",
            "ownerReferences": [{"name": "o", "uid": "x"}]}, "status": {"at": 1, "n": 2}});
        let n = normalize(&v, &["/status/at".to_string()]);
        assert_eq!(
            n,
            json!({"metadata": {"name": "a", "ownerReferences": [{"name": "o"}]}, "status": {"n": 2}})
        );
    }

    #[test]
    fn a_write_over_an_unread_change_is_a_lost_update() {
        let read = json!({"status": {"a": 1, "b": 1}});
        let before = json!({"status": {"a": 1, "b": 2}});
        // The writer puts back b=1: it overwrote b=2, which it never read.
        let after = json!({"status": {"a": 3, "b": 1}});
        assert_eq!(lost_update(&read, &before, &after, None), vec!["/status/b".to_string()]);
        // b=2 was the writer's own: overwriting it loses nobody's change.
        assert!(lost_update(&read, &before, &after, Some(&before)).is_empty());
        // Putting back what it read (b absent) over b=2 loses b=2 too.
        let after = json!({"status": {"a": 3}});
        assert_eq!(
            lost_update(&json!({"status": {"a": 1}}), &before, &after, None),
            vec!["/status/b".to_string()]
        );
        // A patch of `a` alone keeps b=2: no loss.
        let after = json!({"status": {"a": 3, "b": 2}});
        assert!(lost_update(&read, &before, &after, None).is_empty());
        // Having read b=2, writing b=5 loses nothing.
        assert!(lost_update(&before, &before, &json!({"status": {"a": 1, "b": 5}}), None).is_empty());
    }

    /// The leaves of a value by pointer, listed (the model the side-by-side walks follow).
    fn leaves(v: &Value) -> BTreeMap<String, Value> {
        fn walk(v: &Value, at: String, out: &mut BTreeMap<String, Value>) {
            match v {
                Value::Object(m) if !m.is_empty() => {
                    for (k, c) in m {
                        walk(c, format!("{at}/{}", k.replace('~', "~0").replace('/', "~1")), out);
                    }
                }
                _ => {
                    out.insert(at, v.clone());
                }
            }
        }
        let mut out = BTreeMap::new();
        walk(v, String::new(), &mut out);
        out
    }

    fn json() -> impl Strategy<Value = Value> {
        let leaf = prop_oneof![
            Just(Value::Null),
            any::<bool>().prop_map(Value::from),
            (0i64..3).prop_map(Value::from),
            Just(json!([1])),
            Just(json!({})),
        ];
        leaf.prop_recursive(4, 24, 4, |inner| {
            prop::collection::btree_map(prop::sample::select(vec!["a", "b", "c/d", "e~f", ""]), inner, 0..4)
                .prop_map(|m| Value::Object(m.into_iter().map(|(k, v)| (k.to_string(), v)).collect()))
        })
    }

    proptest! {
        #[test]
        fn differing_and_leaf_at_agree_with_the_listed_leaves(a in json(), b in json()) {
            let (la, lb) = (leaves(&a), leaves(&b));
            let mut want: Vec<String> = la.iter().filter(|(k, v)| lb.get(*k) != Some(*v)).map(|(k, _)| k.clone()).collect();
            want.extend(lb.keys().filter(|k| !la.contains_key(*k)).cloned());
            want.sort();
            want.dedup();
            let got = differing(&a, &b);
            prop_assert_eq!(&got, &want);
            for p in la.keys().chain(lb.keys()).chain(got.iter()) {
                prop_assert_eq!(leaf_at(&a, p), la.get(p));
                prop_assert_eq!(leaf_at(&b, p), lb.get(p));
            }
        }
    }

    #[test]
    fn merge_diff_round_trips() {
        let old = json!({"spec": {"a": 1, "b": [1], "c": {"d": 1}}, "x": 1});
        let new = json!({"spec": {"a": 2, "b": [1, 2]}, "y": 2});
        let p = merge_diff(&old, &new).expect("differs");
        let mut out = old.clone();
        json_patch::merge(&mut out, &p);
        assert_eq!(out, new);
        assert_eq!(merge_diff(&new, &new), None);
    }
}
