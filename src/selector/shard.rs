//! Shard selectors (KEP-5866): `shardRange(object.metadata.uid, '0x…', '0x…')` terms joined by
//! `||`, keeping the objects whose 64-bit FNV-1a hash of the field falls in one of the ranges.

use std::fmt;
use std::hash::Hasher;
use std::str::FromStr;

use super::{Result, SelectorError};

/// One past the largest 64-bit hash: the exclusive end of a range that reaches the top.
pub const HASH_SPACE_END: u128 = 1 << 64;

/// The 64-bit FNV-1a hash of `bytes`, the hash KEP-5866 specifies for shard ranges.
///
/// ```
/// use durable_informer::selector::fnv1a_64;
/// assert_eq!(fnv1a_64(b""), 0xcbf2_9ce4_8422_2325);
/// assert_eq!(fnv1a_64(b"a"), 0xaf63_dc4c_8601_ec8c);
/// ```
#[must_use]
pub fn fnv1a_64(bytes: &[u8]) -> u64 {
    // `write`, not `Hash::hash`: a `str`'s `Hash` appends a 0xff byte.
    let mut h = fnv::FnvHasher::default();
    h.write(bytes);
    h.finish()
}

/// The object field a shard range hashes (the two paths KEP-5866 supports).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum ShardField {
    /// `object.metadata.uid`: spreads objects evenly; an object never changes shard.
    Uid,
    /// `object.metadata.namespace`: keeps a namespace on one shard (cluster-scoped objects
    /// hash the empty string).
    Namespace,
}

impl ShardField {
    /// The CEL-style path of the field, as written in a selector.
    #[must_use]
    pub fn path(self) -> &'static str {
        match self {
            ShardField::Uid => "object.metadata.uid",
            ShardField::Namespace => "object.metadata.namespace",
        }
    }
}

impl fmt::Display for ShardField {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.path())
    }
}

/// One `shardRange(field, start, end)` term: hashes in `[start, end)`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
struct Term {
    field: ShardField,
    start: u64,
    /// Exclusive; at most [`HASH_SPACE_END`].
    end: u128,
}

impl Term {
    fn contains(&self, hash: u64) -> bool {
        hash >= self.start && u128::from(hash) < self.end
    }
}

fn hex(v: u128) -> String {
    format!("'0x{v:016x}'")
}

/// A parsed shard selector: the union of hash ranges over object fields. Kept normalized
/// (terms sorted, overlapping or adjacent ranges of one field merged), so two selectors that
/// keep the same objects compare equal and print the same.
///
/// ```
/// use durable_informer::selector::{ShardField, ShardSelector};
///
/// // The second of three equal shards by UID.
/// let shard = ShardSelector::by_uid(1, 3)?;
/// assert_eq!(
///     shard.to_string(),
///     "shardRange(object.metadata.uid, '0x5555555555555555', '0xaaaaaaaaaaaaaaaa')"
/// );
/// // What a server accepts parses back to the same selector.
/// let parsed: ShardSelector = shard.to_string().parse()?;
/// assert_eq!(parsed, shard);
/// // An object belongs to the shard when the FNV-1a hash of its UID is in the range.
/// let uid = "0b6e7c4e-8a66-4c1b-9f1e-2d3c4b5a6978";
/// let hash = durable_informer::selector::fnv1a_64(uid.as_bytes());
/// let inside = (0x5555_5555_5555_5555..0xaaaa_aaaa_aaaa_aaaa).contains(&hash);
/// assert_eq!(shard.matches(|field| (field == ShardField::Uid).then_some(uid)), inside);
/// # Ok::<(), durable_informer::selector::SelectorError>(())
/// ```
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct ShardSelector {
    terms: Vec<Term>,
}

impl ShardSelector {
    /// Shard `index` of `count` equal shards of the hash of `field` (the last one reaches the
    /// top of the space, so the shards cover it without gap or overlap).
    pub fn by_field(field: ShardField, index: u32, count: u32) -> Result<Self> {
        if count == 0 || index >= count {
            return Err(SelectorError::Shard {
                selector: format!("shard {index} of {count}"),
                reason: "the index must be less than a non-zero count".into(),
            });
        }
        let bound = |i: u32| HASH_SPACE_END * u128::from(i) / u128::from(count);
        Self::range(field, u64::try_from(bound(index)).unwrap_or(u64::MAX), bound(index + 1))
    }

    /// Shard `index` of `count` by `object.metadata.uid`.
    pub fn by_uid(index: u32, count: u32) -> Result<Self> {
        Self::by_field(ShardField::Uid, index, count)
    }

    /// Shard `index` of `count` by `object.metadata.namespace`.
    pub fn by_namespace(index: u32, count: u32) -> Result<Self> {
        Self::by_field(ShardField::Namespace, index, count)
    }

    /// Hashes of `field` in `[start, end)`; `end` may be [`HASH_SPACE_END`] (2^64).
    pub fn range(field: ShardField, start: u64, end: u128) -> Result<Self> {
        let term = Term { field, start, end };
        check_term(&term).map_err(|reason| SelectorError::Shard {
            selector: term_string(&term),
            reason,
        })?;
        Ok(Self { terms: vec![term] })
    }

    /// The whole hash space of `field`: every object.
    #[must_use]
    pub fn everything() -> Self {
        Self {
            terms: vec![Term {
                field: ShardField::Uid,
                start: 0,
                end: HASH_SPACE_END,
            }],
        }
    }

    /// Whether the selector keeps every object (some term covers the whole space).
    #[must_use]
    pub fn is_everything(&self) -> bool {
        self.terms.iter().any(|t| t.start == 0 && t.end == HASH_SPACE_END)
    }

    /// Whether an object with these field values is kept (a missing value hashes as `""`).
    pub fn matches<'a>(&self, value: impl Fn(ShardField) -> Option<&'a str>) -> bool {
        let mut hashes: [Option<u64>; 2] = [None, None];
        self.terms.iter().any(|t| {
            let slot = &mut hashes[t.field as usize];
            let h = *slot.get_or_insert_with(|| fnv1a_64(value(t.field).unwrap_or("").as_bytes()));
            t.contains(h)
        })
    }

    /// The fields the terms hash.
    pub fn fields(&self) -> impl Iterator<Item = ShardField> + '_ {
        let mut seen = Vec::new();
        self.terms.iter().filter_map(move |t| {
            if seen.contains(&t.field) {
                None
            } else {
                seen.push(t.field);
                Some(t.field)
            }
        })
    }

    /// The single field of a selector over one field, with its ranges (`None` when it mixes
    /// fields). A selector of the whole space counts as any field's.
    fn single_field(&self) -> Option<(ShardField, Vec<(u128, u128)>)> {
        let mut fields = self.fields();
        let field = fields.next()?;
        if fields.next().is_some() {
            return None;
        }
        Some((field, self.terms.iter().map(|t| (u128::from(t.start), t.end)).collect()))
    }

    /// What `self` keeps that `held` does not, as a selector over `self`'s field (`None`: nothing
    /// more). `held: None` means everything is held. When the two hash different fields, the
    /// answer is `self` whole: fetching what is already held is harmless, missing objects is not.
    #[must_use]
    pub fn beyond(&self, held: Option<&ShardSelector>) -> Option<ShardSelector> {
        let held = held?;
        if held.is_everything() {
            return None;
        }
        match (self.single_field(), held.single_field()) {
            (Some((f, mine)), Some((g, theirs))) if f == g => from_ranges(f, &subtract(&mine, &theirs)),
            (_, Some((g, theirs))) if self.is_everything() => {
                from_ranges(g, &subtract(&[(0, HASH_SPACE_END)], &theirs))
            }
            _ => Some(self.clone()),
        }
    }

    /// The union of two selectors over one field (`None` if they hash different fields).
    #[must_use]
    pub fn union(&self, other: &ShardSelector) -> Option<ShardSelector> {
        if self.is_everything() || other.is_everything() {
            return Some(Self::everything());
        }
        let (f, mut a) = self.single_field()?;
        let (g, b) = other.single_field()?;
        if f != g {
            return None;
        }
        a.extend(b);
        from_ranges(f, &merge(a))
    }

    /// What both keep (`None`: nothing). Selectors over different fields cannot be intersected
    /// as ranges: the answer is then `self` whole, a superset.
    #[must_use]
    pub fn intersect(&self, other: &ShardSelector) -> Option<ShardSelector> {
        if other.is_everything() {
            return Some(self.clone());
        }
        if self.is_everything() {
            return Some(other.clone());
        }
        match (self.single_field(), other.single_field()) {
            (Some((f, a)), Some((g, b))) if f == g => {
                let outside = subtract(&[(0, HASH_SPACE_END)], &b);
                from_ranges(f, &subtract(&a, &outside))
            }
            _ => Some(self.clone()),
        }
    }

    fn normalize(mut terms: Vec<Term>) -> Self {
        terms.sort_by_key(|t| (t.field, t.start, t.end));
        let mut out: Vec<Term> = Vec::with_capacity(terms.len());
        for t in terms {
            match out.last_mut() {
                Some(last) if last.field == t.field && u128::from(t.start) <= last.end => {
                    last.end = last.end.max(t.end);
                }
                _ => out.push(t),
            }
        }
        Self { terms: out }
    }
}

/// Sorted, merged ranges.
fn merge(mut ranges: Vec<(u128, u128)>) -> Vec<(u128, u128)> {
    ranges.sort_unstable();
    let mut out: Vec<(u128, u128)> = Vec::with_capacity(ranges.len());
    for (s, e) in ranges.into_iter().filter(|(s, e)| s < e) {
        match out.last_mut() {
            Some(last) if s <= last.1 => last.1 = last.1.max(e),
            _ => out.push((s, e)),
        }
    }
    out
}

/// `a` minus `b`, both as sets of half-open ranges.
fn subtract(a: &[(u128, u128)], b: &[(u128, u128)]) -> Vec<(u128, u128)> {
    let b = merge(b.to_vec());
    let mut out = Vec::new();
    for &(mut s, e) in &merge(a.to_vec()) {
        for &(bs, be) in &b {
            if be <= s || bs >= e {
                continue;
            }
            if bs > s {
                out.push((s, bs));
            }
            s = s.max(be);
            if s >= e {
                break;
            }
        }
        if s < e {
            out.push((s, e));
        }
    }
    out
}

fn from_ranges(field: ShardField, ranges: &[(u128, u128)]) -> Option<ShardSelector> {
    let terms: Vec<Term> = ranges
        .iter()
        .filter(|(s, e)| s < e)
        .filter_map(|&(s, e)| {
            Some(Term {
                field,
                start: u64::try_from(s).ok()?,
                end: e,
            })
        })
        .collect();
    (!terms.is_empty()).then(|| ShardSelector::normalize(terms))
}

fn term_string(t: &Term) -> String {
    format!("shardRange({}, {}, {})", t.field, hex(u128::from(t.start)), hex(t.end))
}

fn check_term(t: &Term) -> std::result::Result<(), String> {
    if t.end > HASH_SPACE_END {
        return Err("the end is beyond 0x10000000000000000".into());
    }
    if u128::from(t.start) >= t.end {
        return Err("the start must be less than the end".into());
    }
    Ok(())
}

impl fmt::Display for ShardSelector {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for (i, t) in self.terms.iter().enumerate() {
            if i > 0 {
                f.write_str(" || ")?;
            }
            f.write_str(&term_string(t))?;
        }
        Ok(())
    }
}

impl FromStr for ShardSelector {
    type Err = SelectorError;

    /// Parses `shardRange(FIELD, 'HEX', 'HEX') [|| shardRange(…)]…`: FIELD is
    /// `object.metadata.uid` or `object.metadata.namespace`, bounds are quoted (`'` or `"`)
    /// `0x`-prefixed hex of at most 2^64.
    fn from_str(s: &str) -> Result<Self> {
        let bad = |reason: String| SelectorError::Shard {
            selector: s.to_owned(),
            reason,
        };
        if s.trim().is_empty() {
            return Err(bad("the selector is empty".into()));
        }
        let mut terms = Vec::new();
        for raw in s.split("||") {
            let term = parse_term(raw.trim()).map_err(&bad)?;
            check_term(&term).map_err(&bad)?;
            terms.push(term);
        }
        Ok(Self::normalize(terms))
    }
}

fn parse_term(s: &str) -> std::result::Result<Term, String> {
    let args = s
        .strip_prefix("shardRange")
        .map(str::trim_start)
        .and_then(|r| r.strip_prefix('('))
        .and_then(|r| r.strip_suffix(')'))
        .ok_or_else(|| format!("expected shardRange(field, 'start', 'end'), found {s:?}"))?;
    let parts: Vec<&str> = args.split(',').map(str::trim).collect();
    let [field, start, end] = parts.as_slice() else {
        return Err(format!("shardRange takes 3 arguments, found {}", parts.len()));
    };
    let field = match *field {
        "object.metadata.uid" => ShardField::Uid,
        "object.metadata.namespace" => ShardField::Namespace,
        other => {
            return Err(format!(
            "unsupported field path {other:?}: supported paths are object.metadata.uid and object.metadata.namespace"
        ))
        }
    };
    let start = parse_bound(start)?;
    let end = parse_bound(end)?;
    let start = u64::try_from(start).map_err(|_| "the start is beyond 0xffffffffffffffff".to_string())?;
    Ok(Term { field, start, end })
}

fn parse_bound(s: &str) -> std::result::Result<u128, String> {
    let unquoted = ['\'', '"']
        .iter()
        .find_map(|q| s.strip_prefix(*q).and_then(|r| r.strip_suffix(*q)))
        .ok_or_else(|| format!("the bound {s} must be a quoted string such as '0x8000000000000000'"))?;
    let digits = unquoted
        .strip_prefix("0x")
        .ok_or_else(|| format!("the bound {s} must start with 0x"))?;
    if digits.is_empty() || digits.len() > 17 || !digits.bytes().all(|b| b.is_ascii_hexdigit()) {
        return Err(format!("the bound {s} must be 1 to 17 hexadecimal digits after 0x"));
    }
    let v = u128::from_str_radix(digits, 16).map_err(|e| format!("the bound {s}: {e}"))?;
    if v > HASH_SPACE_END {
        return Err(format!("the bound {s} is beyond 0x10000000000000000"));
    }
    Ok(v)
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn fnv1a_64_matches_the_published_test_vectors() {
        // From the FNV reference test suite (Fowler, Noll, Vo).
        assert_eq!(fnv1a_64(b""), 0xcbf2_9ce4_8422_2325);
        assert_eq!(fnv1a_64(b"a"), 0xaf63_dc4c_8601_ec8c);
        assert_eq!(fnv1a_64(b"b"), 0xaf63_df4c_8601_f1a5);
        assert_eq!(fnv1a_64(b"foobar"), 0x8594_4171_f739_67e8);
    }

    #[test]
    fn parses_the_kep_examples_and_prints_them_canonically() {
        let s: ShardSelector = "shardRange(object.metadata.uid, '0x0000000000000000', '0x8000000000000000')"
            .parse()
            .unwrap();
        assert_eq!(s, ShardSelector::by_uid(0, 2).unwrap());
        let two: ShardSelector =
            "shardRange(object.metadata.uid, '0x0', '0x8000000000000000') || shardRange(object.metadata.uid, \"0x8000000000000000\", '0x10000000000000000')"
                .parse()
                .unwrap();
        assert!(two.is_everything());
        assert_eq!(
            two.to_string(),
            "shardRange(object.metadata.uid, '0x0000000000000000', '0x10000000000000000')"
        );
        let ns: ShardSelector = "shardRange( object.metadata.namespace ,'0x10','0x20' )"
            .parse()
            .unwrap();
        assert_eq!(ns.fields().collect::<Vec<_>>(), [ShardField::Namespace]);
    }

    #[test]
    fn malformed_selectors_say_why() {
        for (input, why) in [
            ("", "empty"),
            (
                "shardRange(object.metadata.name, '0x0', '0x1')",
                "unsupported field path",
            ),
            ("shardRange(object.metadata.uid, '0x0')", "3 arguments"),
            ("shardRange(object.metadata.uid, 0x0, '0x1')", "quoted"),
            ("shardRange(object.metadata.uid, '10', '0x1')", "0x"),
            ("shardRange(object.metadata.uid, '0xzz', '0x1')", "hexadecimal"),
            ("shardRange(object.metadata.uid, '0x2', '0x1')", "less than the end"),
            (
                "shardRange(object.metadata.uid, '0x0', '0x10000000000000001')",
                "beyond",
            ),
            (
                "shardRange(object.metadata.uid, '0x10000000000000000', '0x10000000000000000')",
                "beyond",
            ),
            ("range(object.metadata.uid, '0x0', '0x1')", "expected shardRange"),
            ("shardRange(object.metadata.uid, '0x0', '0x1') ||", "empty"),
        ] {
            let err = input.parse::<ShardSelector>().unwrap_err().to_string();
            assert!(
                err.contains(why) || (why == "empty" && err.contains("expected")),
                "{input:?}: {err}"
            );
            assert!(err.starts_with("invalid shardSelector"), "{err}");
        }
        assert!(ShardSelector::by_uid(3, 3).is_err());
        assert!(ShardSelector::by_uid(0, 0).is_err());
        assert!(ShardSelector::range(ShardField::Uid, 5, 5).is_err());
    }

    #[test]
    fn beyond_gives_the_added_ranges() {
        let third = |i| ShardSelector::by_uid(i, 3).unwrap();
        let quarter = |i| ShardSelector::by_uid(i, 4).unwrap();
        // Nothing more to fetch from an unsharded store.
        assert_eq!(quarter(0).beyond(None), None);
        // 1/4 ⊂ 1/3 for the first shard.
        assert_eq!(quarter(0).beyond(Some(&third(0))), None);
        // [1/4, 2/4) minus [1/3, 2/3) = [1/4, 1/3).
        let added = quarter(1).beyond(Some(&third(1))).unwrap();
        let expect = ShardSelector::range(ShardField::Uid, (HASH_SPACE_END / 4) as u64, HASH_SPACE_END / 3).unwrap();
        assert_eq!(added, expect);
        // A different field: all of it.
        let ns = ShardSelector::by_namespace(0, 2).unwrap();
        assert_eq!(ns.beyond(Some(&third(0))), Some(ns.clone()));
        // Growing back to everything: the complement.
        let rest = ShardSelector::everything().beyond(Some(&third(0))).unwrap();
        assert_eq!(
            rest,
            ShardSelector::range(ShardField::Uid, (HASH_SPACE_END / 3) as u64, HASH_SPACE_END).unwrap()
        );
    }

    fn uid(i: u32) -> String {
        format!("{:08x}-0000-4000-8000-{:012x}", i.wrapping_mul(2_654_435_761), i)
    }

    proptest! {
        #[test]
        fn equal_shards_partition_every_uid(count in 1u32..9, ids in proptest::collection::vec(any::<u32>(), 1..50)) {
            let shards: Vec<ShardSelector> = (0..count).map(|i| ShardSelector::by_uid(i, count).unwrap()).collect();
            for i in ids {
                let u = uid(i);
                let owners = shards.iter().filter(|s| s.matches(|_| Some(u.as_str()))).count();
                prop_assert_eq!(owners, 1);
            }
        }

        #[test]
        fn set_operations_agree_with_membership(
            a in (0u64..u64::MAX, 1u64..u64::MAX),
            b in (0u64..u64::MAX, 1u64..u64::MAX),
            hashes in proptest::collection::vec(any::<u64>(), 1..40),
        ) {
            let mk = |(s, len): (u64, u64)| ShardSelector::range(ShardField::Uid, s, (u128::from(s) + u128::from(len)).min(HASH_SPACE_END)).unwrap();
            let (a, b) = (mk(a), mk(b));
            let has = |s: &Option<ShardSelector>, h: u64| s.as_ref().is_some_and(|s| s.terms.iter().any(|t| t.contains(h)));
            let (sa, sb) = (Some(a.clone()), Some(b.clone()));
            for h in hashes.into_iter().chain([0, u64::MAX]) {
                prop_assert_eq!(has(&a.beyond(Some(&b)), h), has(&sa, h) && !has(&sb, h));
                prop_assert_eq!(has(&a.intersect(&b), h), has(&sa, h) && has(&sb, h));
                prop_assert_eq!(has(&a.union(&b), h), has(&sa, h) || has(&sb, h));
            }
            let back: ShardSelector = a.to_string().parse().unwrap();
            prop_assert_eq!(back, a);
        }
    }
}
