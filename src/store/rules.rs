//! Rules the writer follows and [`check`](super::check) verifies alike, kept below both so
//! that neither imports the other.

use std::collections::BTreeSet;

use redb::ReadableTable;

use super::codec;
use super::schema::ScopeId;
use crate::object::{ObjectKey, ObjectMeta};
use crate::selector::{ShardField, ShardSelector};

/// Most log entries a resumed index backfill reads to find keys written since its last step;
/// beyond that it starts over instead.
pub(crate) const RESUME_SCAN: u64 = 10_000;

/// Whether a stored object belongs to `range` (the same hash of the same field as the server).
/// `selector` knows nothing of object metadata: it is shared with the simulated server.
pub(crate) fn in_shard(range: &ShardSelector, meta: &ObjectMeta) -> bool {
    range.matches(|f| match f {
        ShardField::Uid => meta.uid.as_deref(),
        ShardField::Namespace => meta.namespace.as_deref(),
    })
}

/// The keys of `scope` written after `since` up to `last`, which a resumed index backfill
/// repairs first. `None` when the resume starts over instead: the log no longer shows every
/// such write (compacted or damaged), or shows more than [`RESUME_SCAN`].
pub(crate) fn keys_written_since<T: ReadableTable<u64, &'static [u8]>>(
    log: &T,
    scope: ScopeId,
    since: u64,
    last: u64,
) -> Result<Option<BTreeSet<ObjectKey>>, redb::StorageError> {
    let mut keys = BTreeSet::new();
    if last <= since {
        return Ok(Some(keys));
    }
    let first = log.first()?.map_or(last + 1, |(k, _)| k.value());
    if first > since + 1 || last - since > RESUME_SCAN {
        return Ok(None);
    }
    for row in log.range(since + 1..=last)? {
        let (_, v) = row?;
        match codec::decode_log(v.value()) {
            Ok((h, _, _)) if h.scope == scope.0 => {
                keys.insert(h.key);
            }
            Ok(_) => {}
            Err(_) => return Ok(None),
        }
    }
    Ok(Some(keys))
}
