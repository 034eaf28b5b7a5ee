//! What a handler was told, replayed: every add, update and delete folded into key →
//! resourceVersion, the state a handler that keeps its own copy would hold. Shared by the
//! handler oracle and the crash harness (`#[path]`-included there), which compare it with the
//! server's LIST.
#![allow(dead_code)] // Each user takes a part.

use std::collections::{BTreeMap, BTreeSet};

use durable_informer::informer::Event;
use k8s_openapi::api::core::v1::ConfigMap;

/// key (`namespace/name`) → resourceVersion.
pub type State = BTreeMap<String, String>;

/// `namespace/name` of an object.
pub fn key_of(c: &ConfigMap) -> String {
    format!(
        "{}/{}",
        c.metadata.namespace.as_deref().unwrap_or(""),
        c.metadata.name.as_deref().unwrap_or("")
    )
}

/// The resourceVersion of an object ("" when it has none).
pub fn rv_of(c: &ConfigMap) -> String {
    c.metadata.resource_version.clone().unwrap_or_default()
}

/// One event reduced to what the fold needs: (`add`/`update`/`delete`, key, resourceVersion).
pub fn line(ev: &Event<ConfigMap>) -> (&'static str, String, String) {
    match ev {
        Event::Add { object, initial } => (if *initial { "initial" } else { "add" }, key_of(object), rv_of(object)),
        Event::Update { new, .. } => ("update", key_of(new), rv_of(new)),
        Event::Delete { object, .. } => ("delete", key_of(object), rv_of(object)),
    }
}

/// Applies one event to `state`: a delete removes the key, anything else sets its RV.
pub fn apply(state: &mut State, kind: &str, key: &str, rv: &str) {
    if kind.starts_with("delete") || kind.starts_with("DELETED") {
        state.remove(key);
    } else {
        state.insert(key.to_owned(), rv.to_owned());
    }
}

/// The keys on which `ours` and `theirs` differ, with both values.
pub fn diff(ours: &State, theirs: &State) -> Vec<(String, Option<String>, Option<String>)> {
    let keys: BTreeSet<&String> = ours.keys().chain(theirs.keys()).collect();
    keys.into_iter()
        .filter(|k| ours.get(*k) != theirs.get(*k))
        .map(|k| (k.clone(), ours.get(k).cloned(), theirs.get(k).cloned()))
        .collect()
}
