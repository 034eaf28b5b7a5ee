//! The consistent-hash ring over a ring's live shards, and the key an object is hashed by.
//!
//! Each shard puts `tokens_per_shard` virtual nodes on a 64-bit circle at `xxh64(shard + i)`; a
//! key belongs to the shard of the first token at or after `xxh64(key)`, wrapping at the top.
//! That is the construction of timebertt's sharder (XXH64, 100 tokens per shard), so adding a
//! shard takes over about `1/n` of the keys, all of them for the new shard, and removing one
//! hands only its own keys to the others.

use xxhash_rust::xxh64::xxh64;

/// Virtual nodes per shard unless told otherwise (timebertt's default).
///
/// ```
/// use durable_informer::sharding::{HashRing, DEFAULT_TOKENS_PER_SHARD};
/// assert_eq!(HashRing::new(["a"]), HashRing::with_tokens(["a"], DEFAULT_TOKENS_PER_SHARD));
/// ```
pub const DEFAULT_TOKENS_PER_SHARD: usize = 100;

/// A consistent-hash ring over shard ids. Deterministic: the same shards (in any order, with
/// duplicates) give the same ring, and the same key the same shard.
///
/// ```
/// use durable_informer::sharding::HashRing;
/// let ring = HashRing::new(["shard-a", "shard-b", "shard-c"]);
/// let owner = ring.shard_for("apps/Deployment/prod/web").expect("a shard");
/// assert!(["shard-a", "shard-b", "shard-c"].contains(&owner));
/// // Same shards, another order: the same answer.
/// let again = HashRing::new(["shard-c", "shard-a", "shard-b"]);
/// assert_eq!(again.shard_for("apps/Deployment/prod/web"), Some(owner));
/// assert_eq!(HashRing::new(Vec::<String>::new()).shard_for("x"), None);
/// ```
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct HashRing {
    /// Sorted by token, then shard index, so a (rare) token collision is decided by name.
    tokens: Vec<(u64, usize)>,
    /// Sorted and deduplicated.
    shards: Vec<String>,
}

impl HashRing {
    /// A ring over `shards` with [`DEFAULT_TOKENS_PER_SHARD`] virtual nodes each.
    pub fn new<S: AsRef<str>>(shards: impl IntoIterator<Item = S>) -> Self {
        Self::with_tokens(shards, DEFAULT_TOKENS_PER_SHARD)
    }

    /// A ring over `shards` with `tokens_per_shard` virtual nodes each (at least 1): more
    /// tokens spread the keys more evenly, at the cost of a larger ring.
    pub fn with_tokens<S: AsRef<str>>(shards: impl IntoIterator<Item = S>, tokens_per_shard: usize) -> Self {
        let mut names: Vec<String> = shards.into_iter().map(|s| s.as_ref().to_owned()).collect();
        names.sort();
        names.dedup();
        let per = tokens_per_shard.max(1);
        let mut tokens = Vec::with_capacity(names.len() * per);
        for (i, name) in names.iter().enumerate() {
            for t in 0..per {
                tokens.push((xxh64(format!("{name}{t}").as_bytes(), 0), i));
            }
        }
        tokens.sort_unstable();
        Self { tokens, shards: names }
    }

    /// The shard `key` belongs to; `None` when the ring has no shard.
    #[must_use]
    pub fn shard_for(&self, key: &str) -> Option<&str> {
        let h = xxh64(key.as_bytes(), 0);
        let i = self.tokens.partition_point(|&(t, _)| t < h);
        let (_, shard) = self.tokens.get(i).or_else(|| self.tokens.first())?;
        self.shards.get(*shard).map(String::as_str)
    }

    /// The shards on the ring, sorted.
    #[must_use]
    pub fn shards(&self) -> &[String] {
        &self.shards
    }

    /// Whether the ring has no shard.
    #[must_use]
    pub fn is_empty(&self) -> bool {
        self.shards.is_empty()
    }
}

/// The ring key of an object: `group/kind/namespace/name` (the group is empty for the core API,
/// the namespace for cluster-scoped objects).
///
/// ```
/// use durable_informer::sharding::ring_key;
/// assert_eq!(ring_key("apps", "Deployment", Some("prod"), "web"), "apps/Deployment/prod/web");
/// assert_eq!(ring_key("", "Namespace", None, "prod"), "/Namespace//prod");
/// ```
#[must_use]
pub fn ring_key(group: &str, kind: &str, namespace: Option<&str>, name: &str) -> String {
    format!("{group}/{kind}/{}/{name}", namespace.unwrap_or(""))
}

/// The ring key of an object's controller (its owner reference with `controller: true`), so an
/// owned object lands on its owner's shard; `None` without a controller or with a malformed
/// reference.
///
/// ```
/// use durable_informer::sharding::controller_ring_key;
/// use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, OwnerReference};
/// let rs = ObjectMeta {
///     namespace: Some("prod".into()),
///     owner_references: Some(vec![OwnerReference {
///         api_version: "apps/v1".into(),
///         kind: "Deployment".into(),
///         name: "web".into(),
///         controller: Some(true),
///         ..Default::default()
///     }]),
///     ..Default::default()
/// };
/// assert_eq!(controller_ring_key(&rs).as_deref(), Some("apps/Deployment/prod/web"));
/// assert_eq!(controller_ring_key(&ObjectMeta::default()), None);
/// ```
#[must_use]
pub fn controller_ring_key(meta: &kube::core::ObjectMeta) -> Option<String> {
    let owner = meta
        .owner_references
        .iter()
        .flatten()
        .find(|o| o.controller == Some(true))?;
    if owner.kind.is_empty() || owner.name.is_empty() || owner.api_version.is_empty() {
        return None;
    }
    // `apiVersion` is `group/version`, or `version` alone for the core group.
    let group = owner.api_version.rsplit_once('/').map_or("", |(g, _)| g);
    Some(ring_key(group, &owner.kind, meta.namespace.as_deref(), &owner.name))
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use proptest::prelude::*;

    use super::*;

    fn keys(n: usize, seed: u64) -> Vec<String> {
        (0..n)
            .map(|i| ring_key("", "ConfigMap", Some("ns"), &format!("cm-{seed}-{i}")))
            .collect()
    }

    fn assign<'a>(ring: &'a HashRing, keys: &'a [String]) -> BTreeMap<&'a str, &'a str> {
        keys.iter()
            .map(|k| (k.as_str(), ring.shard_for(k).expect("a non-empty ring")))
            .collect()
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(64))]

        #[test]
        fn every_key_maps_to_exactly_one_of_the_shards_and_always_the_same(
            n in 1usize..12, seed in any::<u64>(), salt in any::<u32>(),
        ) {
            let shards: Vec<String> = (0..n).map(|i| format!("shard-{salt}-{i}")).collect();
            let ring = HashRing::new(&shards);
            let mut reversed = shards.clone();
            reversed.reverse();
            reversed.push(shards[0].clone());
            let again = HashRing::new(&reversed);
            prop_assert_eq!(&ring, &again);
            for k in keys(200, seed) {
                let owner = ring.shard_for(&k).expect("non-empty");
                prop_assert!(shards.iter().any(|s| s == owner));
                prop_assert_eq!(again.shard_for(&k), Some(owner));
            }
        }

        #[test]
        fn a_shard_joining_takes_about_one_nth_of_the_keys_and_only_for_itself(
            n in 2usize..10, seed in any::<u64>(), salt in any::<u32>(),
        ) {
            let shards: Vec<String> = (0..n).map(|i| format!("s{salt}-{i}")).collect();
            let before = HashRing::new(&shards);
            let new = format!("s{salt}-new");
            let after = HashRing::new(shards.iter().chain(std::iter::once(&new)));
            let ks = keys(4000, seed);
            let (a, b) = (assign(&before, &ks), assign(&after, &ks));
            let moved: Vec<&str> = ks.iter().map(String::as_str).filter(|k| a[k] != b[k]).collect();
            for k in &moved {
                prop_assert_eq!(b[k], new.as_str(), "a key moved between old shards");
            }
            // Ideal 1/(n+1); 100 tokens keep a shard's share within about ±35% of it.
            let ideal = ks.len() as f64 / (n + 1) as f64;
            let m = moved.len() as f64;
            prop_assert!(m <= ideal * 1.6 && m >= ideal * 0.4, "moved {} of {}, ideal {:.0}", m, ks.len(), ideal);
        }

        #[test]
        fn a_shard_leaving_hands_over_only_its_own_keys(
            n in 2usize..10, seed in any::<u64>(), gone in any::<prop::sample::Index>(),
        ) {
            let shards: Vec<String> = (0..n).map(|i| format!("shard-{i}")).collect();
            let gone = &shards[gone.index(n)];
            let before = HashRing::new(&shards);
            let after = HashRing::new(shards.iter().filter(|s| *s != gone));
            let ks = keys(2000, seed);
            let (a, b) = (assign(&before, &ks), assign(&after, &ks));
            for k in &ks {
                if a[k.as_str()] != gone.as_str() {
                    prop_assert_eq!(a[k.as_str()], b[k.as_str()]);
                } else {
                    prop_assert_ne!(b[k.as_str()], gone.as_str());
                }
            }
        }
    }

    #[test]
    fn one_hundred_tokens_spread_keys_within_a_third_of_an_even_share() {
        let ring = HashRing::new(["a", "b", "c", "d"]);
        let ks = keys(20_000, 1);
        let mut count: BTreeMap<&str, usize> = BTreeMap::new();
        for k in &ks {
            *count.entry(ring.shard_for(k).unwrap()).or_default() += 1;
        }
        assert_eq!(count.len(), 4);
        for (shard, c) in count {
            let share = c as f64 / ks.len() as f64;
            assert!((0.25 * 0.67..0.25 * 1.33).contains(&share), "{shard}: {share}");
        }
    }

    #[test]
    fn one_token_per_shard_still_assigns_every_key() {
        let ring = HashRing::with_tokens(["a", "b"], 0);
        assert_eq!(ring.tokens.len(), 2);
        assert!(keys(50, 3).iter().all(|k| ring.shard_for(k).is_some()));
    }
}
