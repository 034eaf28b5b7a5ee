//! Damaged stored rows through every decoder of the store: bit flips, truncations, inserted
//! bytes and corrupted lengths in object rows, log rows, scope / shard / index / backfill
//! records, keys, compressed object bytes and dictionaries. Each decoder returns `Ok` or `Err`,
//! never panics, never aborts, and never asks the allocator for more than a bound tied to the
//! damaged input (review finding F15: a length of 2^50 aborted the process).
//!
//! The rows are real: the golden schema-v4 database, migrated by this build, relisted and given
//! a shard range (`fuzz/store_rows.rs`, which also writes the fuzz targets' seeds). Tests that decode damaged bytes
//! run in a child process ([`isolated`]), so a decoder that aborts fails its test instead of
//! ending the suite, and so the allocation counts see only that test. `PROPTEST_CASES` raises
//! the number of cases (default here: 512 per property).

use std::os::unix::fs::PermissionsExt;
use std::path::Path;
use std::process::Command;
use std::sync::OnceLock;

use std::sync::{Arc, Mutex};

use common::fake::Fake;
use durable_informer::informer::{
    handler_fn, watcher_stream, Event, HandlerOptions, HandlerProblem, Informer, InformerIssue,
};
use durable_informer::object::{ObjectKey, ScopeSpec};
use durable_informer::store::{CodecError, Compression, DurableStore, ScopeId, Seq, StoreConfig, StoreError};
use k8s_openapi::api::core::v1::ConfigMap;
use proptest::prelude::*;
use redb::{ReadableDatabase, ReadableTable, TableDefinition};

mod common;

#[path = "../fuzz/store_rows.rs"]
mod store_rows;

/// The counting allocator and the allocation bound the fuzz targets check.
#[path = "../fuzz/fuzz_targets/store_common.rs"]
mod store_common;

use store_common::{asked as allocated, bound};

const CHILD: &str = "DURABLE_INFORMER_DAMAGED_ROWS_CHILD";
const GOLDEN: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/golden/schema-v4.redb");

/// Runs `body` in a child process that runs only the test `name`: a decoder that aborts (an
/// allocation of 2^50 bytes does) fails that test, with the child's output, and the suite goes
/// on.
fn isolated(name: &str, body: impl FnOnce()) {
    if std::env::var_os(CHILD).is_some() {
        body();
        return;
    }
    let out = Command::new(std::env::current_exe().expect("test binary path"))
        .args([
            name,
            "--exact",
            "--include-ignored",
            "--nocapture",
            "--test-threads",
            "1",
        ])
        .env(CHILD, "1")
        .output()
        .expect("runs the test binary");
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        out.status.success() && stdout.contains("1 passed"),
        "{name} failed in its child process ({}):\n{stdout}\n{stderr}",
        out.status
    );
}

fn rows() -> &'static store_rows::Rows {
    static ROWS: OnceLock<store_rows::Rows> = OnceLock::new();
    ROWS.get_or_init(|| {
        let dir = tempfile::tempdir().expect("temp dir");
        store_rows::from_golden(Path::new(GOLDEN), dir.path()).expect("rows of the golden database")
    })
}

/// The dictionary a tag names, as a reader would load it.
fn dict_for(tag: Compression) -> Option<&'static [u8]> {
    let Compression::Dict { scope, dict } = tag else {
        return None;
    };
    rows()
        .dicts
        .iter()
        .find(|(k, _)| *k == (scope, dict))
        .map(|(_, d)| d.as_slice())
}

/// A bincode varint, as the codec writes lengths.
fn varint(n: u64) -> Vec<u8> {
    match n {
        0..=250 => vec![n as u8],
        251..=0xffff => [&[0xfb][..], &(n as u16).to_le_bytes()].concat(),
        0x1_0000..=0xffff_ffff => [&[0xfc][..], &(n as u32).to_le_bytes()].concat(),
        _ => [&[0xfd][..], &n.to_le_bytes()].concat(),
    }
}

/// One way a stored value gets damaged.
#[derive(Debug, Clone)]
enum Damage {
    /// Flip one bit (`at` is taken modulo the length).
    Flip { at: usize, bit: u8 },
    /// Overwrite one byte.
    Set { at: usize, byte: u8 },
    /// Cut the value short.
    Truncate { at: usize },
    /// Replace one byte with a length varint (most often a huge one).
    Length { at: usize, len: u64 },
    /// Insert bytes.
    Insert { at: usize, bytes: Vec<u8> },
    /// Overwrite the envelope's header length (bytes 1..5).
    HeadLen { len: u32 },
}

fn damage() -> impl Strategy<Value = Damage> {
    let huge = prop_oneof![
        Just(1u64 << 50),
        Just(u64::MAX),
        Just(1 << 31),
        Just(1 << 32),
        Just(isize::MAX as u64),
        251u64..(1 << 24),
        any::<u64>(),
    ];
    prop_oneof![
        (any::<usize>(), 0u8..8).prop_map(|(at, bit)| Damage::Flip { at, bit }),
        (any::<usize>(), any::<u8>()).prop_map(|(at, byte)| Damage::Set { at, byte }),
        any::<usize>().prop_map(|at| Damage::Truncate { at }),
        (any::<usize>(), huge).prop_map(|(at, len)| Damage::Length { at, len }),
        (any::<usize>(), proptest::collection::vec(any::<u8>(), 1..9))
            .prop_map(|(at, bytes)| Damage::Insert { at, bytes }),
        prop_oneof![Just(u32::MAX), Just(0), any::<u32>()].prop_map(|len| Damage::HeadLen { len }),
    ]
}

fn apply(value: &mut Vec<u8>, damage: &Damage) {
    let at = |i: usize| if value.is_empty() { 0 } else { i % value.len() };
    match damage {
        Damage::Flip { at: i, bit } if !value.is_empty() => {
            let i = at(*i);
            value[i] ^= 1 << bit;
        }
        Damage::Set { at: i, byte } if !value.is_empty() => {
            let i = at(*i);
            value[i] = *byte;
        }
        Damage::Truncate { at: i } => {
            let i = at(*i);
            value.truncate(i);
        }
        Damage::Length { at: i, len } if !value.is_empty() => {
            let i = at(*i);
            value.splice(i..=i, varint(*len));
        }
        Damage::Insert { at: i, bytes } => {
            let i = at(*i);
            value.splice(i..i, bytes.iter().copied());
        }
        Damage::HeadLen { len } if value.len() >= 5 => value[1..5].copy_from_slice(&len.to_le_bytes()),
        _ => {}
    }
}

/// `PROPTEST_CASES` cases (default 512); a failure prints its shrunk case, nothing is persisted.
fn config() -> ProptestConfig {
    let cases = std::env::var("PROPTEST_CASES")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(512);
    ProptestConfig {
        cases,
        failure_persistence: None,
        ..ProptestConfig::default()
    }
}

/// Decodes a (damaged) value of `table` as the store reads it: the row, then the object bytes
/// it carries with the dictionaries they name. A row that decodes must encode to bytes that
/// decode to the same thing.
fn read_value(table: &str, value: &[u8]) -> Result<(), String> {
    let (canonical, blobs) = match CodecError::check_row(table, value) {
        Ok(ok) => ok,
        Err(e) => return Err(e.to_string()),
    };
    let (again, _) =
        CodecError::check_row(table, &canonical).map_err(|e| format!("re-encoded row does not decode: {e}"))?;
    assert_eq!(
        again, canonical,
        "a decoded {table} row encodes differently after a round trip"
    );
    for (tag, bytes) in blobs {
        let _ = tag.check_unpack(bytes, dict_for(tag));
    }
    Ok(())
}

fn value_index() -> impl Strategy<Value = usize> {
    0..rows().values.len()
}

#[test]
fn damaged_values_decode_or_fail_within_the_allocation_bound() {
    isolated("damaged_values_decode_or_fail_within_the_allocation_bound", || {
        // Every kind of row is among the rows damaged.
        for table in [
            "objects",
            "log",
            "scopes",
            "scope_shards",
            "index_rev",
            "index_backfill",
        ] {
            let (_, value) = rows().values.iter().find(|(t, _)| *t == table).expect(table);
            read_value(table, value).unwrap_or_else(|e| panic!("an undamaged {table} row: {e}"));
        }
        let config = config();
        proptest!(config, |(i in value_index(), damages in proptest::collection::vec(damage(), 1..4))| {
            let (table, value) = &rows().values[i];
            let mut value = value.clone();
            for d in &damages {
                apply(&mut value, d);
            }
            // The reader copies a dictionary it loads (up to two per row here).
            let dict_len = 2 * rows().dicts.iter().map(|(_, d)| d.len()).max().unwrap_or(0);
            let (_, bytes) = allocated(|| read_value(table, &value));
            prop_assert!(
                bytes <= bound(value.len()) + dict_len,
                "decoding a damaged {} row of {} bytes asked for {} bytes",
                table,
                value.len(),
                bytes
            );
        });
    });
}

#[test]
fn damaged_keys_decode_exactly_or_fail() {
    isolated("damaged_keys_decode_exactly_or_fail", || {
        let config = config();
        let n = rows().keys.len();
        proptest!(config, |(i in 0..n, damages in proptest::collection::vec(damage(), 1..4))| {
            let (table, key) = &rows().keys[i];
            let mut key = key.clone();
            for d in &damages {
                apply(&mut key, d);
            }
            let (decoded, bytes) = allocated(|| ScopeId::check_key(table, &key));
            if let Ok(encoded) = decoded {
                prop_assert_eq!(encoded, key.clone(), "a decoded {} key encodes to other bytes", table);
            }
            prop_assert!(bytes <= bound(key.len()), "a damaged {} key of {} bytes asked for {} bytes", table, key.len(), bytes);
        });
    });
}

/// Every compressed blob of the rows, with its tag.
fn blobs() -> Vec<(Compression, Vec<u8>)> {
    rows()
        .values
        .iter()
        .filter_map(|(table, value)| CodecError::check_row(table, value).ok())
        .flat_map(|(_, blobs)| blobs.into_iter().map(|(c, b)| (c, b.to_vec())))
        .filter(|(c, _)| *c != Compression::None)
        .collect()
}

#[test]
fn damaged_compressed_bytes_and_dictionaries_decompress_or_fail() {
    isolated("damaged_compressed_bytes_and_dictionaries_decompress_or_fail", || {
        let blobs = blobs();
        assert!(
            blobs.iter().any(|(c, _)| matches!(c, Compression::Dict { .. })),
            "the golden rows hold dictionary-compressed bytes"
        );
        for (tag, blob) in &blobs {
            tag.check_unpack(blob, dict_for(*tag))
                .expect("an undamaged blob decompresses");
        }
        let config = config();
        let n = blobs.len();
        proptest!(config, |(
            i in 0..n,
            blob_damage in proptest::collection::vec(damage(), 0..3),
            dict_damage in proptest::collection::vec(damage(), 0..3),
        )| {
            let (tag, blob) = &blobs[i];
            let mut blob = blob.clone();
            for d in &blob_damage {
                apply(&mut blob, d);
            }
            let mut dict = dict_for(*tag).map(<[u8]>::to_vec);
            if let Some(dict) = &mut dict {
                for d in &dict_damage {
                    apply(dict, d);
                }
            }
            // The reader copies the dictionary it loads.
            let dict_len = dict.as_ref().map_or(0, Vec::len);
            let (_, bytes) = allocated(|| tag.check_unpack(&blob, dict.as_deref()));
            prop_assert!(
                bytes <= bound(blob.len()) + dict_len,
                "decompressing {} damaged bytes asked for {} bytes",
                blob.len(),
                bytes
            );
        });
    });
}

/// An envelope around a hand-written bincode header.
fn envelope(header: &[u8]) -> Vec<u8> {
    let len = u32::try_from(header.len()).expect("small header");
    [&[1u8][..], &len.to_le_bytes(), header].concat()
}

/// A header whose first string (after `before`) says it is 2^50 bytes long.
fn huge_string_after(before: &[u8]) -> Vec<u8> {
    envelope(&[before, &varint(1 << 50), b"tail"].concat())
}

/// F15: a length of 2^50 read from a damaged row is an error, not an allocation of 2^50 bytes.
fn huge_length_is_an_error(table: &str, before: &[u8]) {
    let row = huge_string_after(before);
    let (decoded, bytes) = allocated(|| CodecError::check_row(table, &row).map(|_| ()));
    match decoded {
        Err(CodecError::Decode(_)) => {}
        other => panic!("{table}: expected a decode error, got {other:?}"),
    }
    assert!(bytes <= bound(row.len()), "{table}: asked for {bytes} bytes");
}

#[test]
fn a_huge_length_in_a_scope_record_is_an_error() {
    // `spec` is the record's first field.
    isolated("a_huge_length_in_a_scope_record_is_an_error", || {
        huge_length_is_an_error("scopes", &[])
    });
}

#[test]
fn a_huge_length_in_an_object_header_is_an_error() {
    // `meta.namespace`: Some(…).
    isolated("a_huge_length_in_an_object_header_is_an_error", || {
        huge_length_is_an_error("objects", &[1])
    });
}

#[test]
fn a_huge_length_in_a_log_header_is_an_error() {
    // Scope 0, `Added`, then the key's namespace: Some(…).
    isolated("a_huge_length_in_a_log_header_is_an_error", || {
        huge_length_is_an_error("log", &[0, 0, 1])
    });
}

#[test]
fn a_huge_length_in_a_shard_record_is_an_error() {
    // `range`: Some(…).
    isolated("a_huge_length_in_a_shard_record_is_an_error", || {
        huge_length_is_an_error("scope_shards", &[1])
    });
}

#[test]
fn a_huge_length_in_index_values_is_an_error() {
    // One value.
    isolated("a_huge_length_in_index_values_is_an_error", || {
        huge_length_is_an_error("index_rev", &[1])
    });
}

#[test]
fn a_huge_length_in_a_backfill_record_is_an_error() {
    // `after`: Some(key), its namespace Some(…).
    isolated("a_huge_length_in_a_backfill_record_is_an_error", || {
        huge_length_is_an_error("index_backfill", &[1, 1])
    });
}

/// A zstd frame of `payload` (70,000 bytes: its header holds a 4-byte content size).
fn frame(payload: &[u8]) -> Vec<u8> {
    zstd::bulk::compress(payload, 3).expect("compresses")
}

/// Bytes that do not compress.
fn noise(n: usize) -> Vec<u8> {
    let mut x = 0x9e37_79b9_7f4a_7c15u64;
    (0..n)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x as u8
        })
        .collect()
}

#[test]
fn a_frame_declaring_a_huge_size_allocates_little() {
    isolated("a_frame_declaring_a_huge_size_allocates_little", || {
        let payload = noise(70_000);
        let mut f = frame(&payload);
        // Magic (4 bytes), frame header descriptor: single segment, a 4-byte content size next.
        assert_eq!(f[4] & 0xe0, 0xa0, "frame header descriptor {:#x}", f[4]);
        assert_eq!(u32::from_le_bytes([f[5], f[6], f[7], f[8]]), 70_000);
        f[5..9].copy_from_slice(&((1u32 << 30) - 1).to_le_bytes());
        let (decoded, bytes) = allocated(|| Compression::Zstd(3).check_unpack(&f, None));
        assert!(decoded.is_err(), "a frame whose size does not match decompresses");
        assert!(bytes <= bound(f.len()), "asked for {bytes} bytes");
    });
}

/// A zstd frame without a content size: `blocks` RLE blocks of 128 KiB each.
fn rle_bomb(blocks: usize) -> Vec<u8> {
    // Magic; no single segment, no content size; a 128 KiB window.
    let mut f = vec![0x28, 0xb5, 0x2f, 0xfd, 0x00, (17 - 10) << 3];
    for i in 0..blocks {
        let last = u32::from(i + 1 == blocks);
        let header = ((128u32 << 10) << 3) | (1 << 1) | last;
        f.extend_from_slice(&header.to_le_bytes()[..3]);
        f.push(b'x');
    }
    f
}

#[test]
fn a_frame_without_a_content_size_is_refused() {
    isolated("a_frame_without_a_content_size_is_refused", || {
        // 40 KB that would expand to 1.25 GiB; no build ever wrote a frame without its size.
        let f = rle_bomb(10_000);
        let (decoded, bytes) = allocated(|| Compression::Zstd(3).check_unpack(&f, None));
        assert!(decoded.is_err(), "decompressed {:?} bytes", decoded.map(|b| b.len()));
        assert!(bytes <= bound(f.len()), "asked for {bytes} bytes");
    });
}

/// A frame declaring 4 MiB, held by two RLE blocks of 2 MiB each (zstd's one-shot decoder
/// accepts blocks over the format's 128 KiB), and bytes after it that are no frame: found by the
/// `store_unpack` fuzz target.
fn oversized_blocks() -> Vec<u8> {
    let block = |last: u32| ((((2u32 << 20) - 1) << 3) | (1 << 1) | last).to_le_bytes();
    let mut f = vec![0x28, 0xb5, 0x2f, 0xfd, 0x80, 0x56];
    f.extend_from_slice(&((4u32 << 20) - 2).to_le_bytes());
    for last in [0, 1] {
        f.extend_from_slice(&block(last)[..3]);
        f.push(b'x');
    }
    f.extend_from_slice(&[0x0a; 320]);
    f
}

#[test]
fn a_frame_with_oversized_blocks_allocates_little() {
    isolated("a_frame_with_oversized_blocks_allocates_little", || {
        let f = oversized_blocks();
        let (decoded, bytes) = allocated(|| Compression::Zstd(3).check_unpack(&f, None));
        assert!(decoded.is_err(), "decompressed {:?} bytes", decoded.map(|b| b.len()));
        assert!(bytes <= bound(f.len()), "asked for {bytes} bytes");
    });
}

#[test]
fn a_damaged_dictionary_is_an_error() {
    isolated("a_damaged_dictionary_is_an_error", || {
        let (tag, blob) = blobs()
            .into_iter()
            .find(|(c, _)| matches!(c, Compression::Dict { .. }))
            .expect("a dictionary-compressed blob");
        let dict = dict_for(tag).expect("its dictionary").to_vec();
        // A trained dictionary starts with its magic and id, then entropy tables: damage those.
        let mut failed = 0;
        for at in 8..64 {
            let mut damaged = dict.clone();
            damaged[at] ^= 0xff;
            if tag.check_unpack(&blob, Some(&damaged)).is_err() {
                failed += 1;
            }
        }
        assert!(failed > 0, "no damaged dictionary was noticed");
    });
}

// ---- Damaged rows through the public API ----

fn spec() -> ScopeSpec {
    ScopeSpec::new("", "v1", "configmaps")
}

/// Rewrites one value of a `&[u8]`-valued table of the closed database at `path`.
fn damage_on_disk<K: redb::Key + 'static>(path: &Path, table: &str, key: K::SelfType<'_>, value: &[u8]) {
    let db = redb::Database::open(path).expect("opens");
    let txn = db.begin_write().expect("write txn");
    txn.open_table(TableDefinition::<K, &[u8]>::new(table))
        .expect("table")
        .insert(key, value)
        .expect("insert");
    txn.commit().expect("commit");
}

/// A copy of the golden v4 database, opened once by this build (migrated) and closed.
fn golden_db(dir: &Path) -> std::path::PathBuf {
    let path = dir.join("damaged.redb");
    std::fs::copy(GOLDEN, &path).expect("copy");
    std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o600)).expect("mode");
    DurableStore::open(StoreConfig::new(&path))
        .expect("opens")
        .close()
        .expect("closes");
    path
}

fn assert_codec_error<T: std::fmt::Debug>(what: &str, r: Result<T, StoreError>) {
    match r {
        Err(StoreError::Codec(e)) => assert!(!e.to_string().is_empty(), "{what}"),
        other => panic!("{what}: expected a codec error, got {other:?}"),
    }
}

#[test]
fn damaged_rows_on_disk_give_errors_through_the_public_api() {
    isolated("damaged_rows_on_disk_give_errors_through_the_public_api", || {
        let dir = tempfile::tempdir().expect("temp dir");
        let path = golden_db(dir.path());
        let key = ObjectKey::namespaced("default", "d299");
        let huge_object = huge_string_after(&[1]);
        {
            let db = redb::Database::open(&path).expect("opens");
            let txn = db.begin_read().expect("txn");
            let objects = txn
                .open_table(TableDefinition::<&[u8], &[u8]>::new("objects"))
                .expect("objects");
            let row = objects
                .iter()
                .expect("iter")
                .map(|r| r.expect("row").0.value().to_vec())
                .find(|k| k.ends_with(b"default\0d299"))
                .expect("the row of default/d299");
            drop(objects);
            drop(txn);
            drop(db);
            damage_on_disk::<&[u8]>(&path, "objects", &row, &huge_object);
        }
        let last_seq = {
            let db = DurableStore::open(StoreConfig::new(&path)).expect("opens");
            let last = db.log().bounds().expect("bounds").expect("a log").1;
            db.close().expect("closes");
            last
        };
        damage_on_disk::<u64>(&path, "log", last_seq.0, &huge_string_after(&[0, 0, 1]));

        let db = DurableStore::open(StoreConfig::new(&path)).expect("a damaged database still opens");
        let scope = db.writer().register_scope_blocking(&spec()).expect("scope");
        let store = db.store(scope);
        assert_codec_error("get", store.get(&key));
        assert_codec_error("list", store.list());
        // Undamaged rows still read.
        assert!(store
            .get(&ObjectKey::namespaced("default", "a"))
            .expect("get a")
            .is_some());
        assert_codec_error("log", db.log().read_after(Seq(last_seq.0 - 1), 10, None));
        let report = db.check().expect("check reports problems instead of failing");
        assert!(
            report
                .problems
                .iter()
                .any(|p| p.contains("d299") && p.contains("does not decode")),
            "{:?}",
            report.problems
        );
        assert!(
            report
                .problems
                .iter()
                .any(|p| p.contains(&format!("log entry {}", last_seq.0))),
            "{:?}",
            report.problems
        );
        db.close().expect("closes");

        // A damaged scope record.
        damage_on_disk::<u32>(&path, "scopes", scope.0, &huge_string_after(&[]));
        let db = DurableStore::open(StoreConfig::new(&path)).expect("opens");
        assert_codec_error("scopes", db.scopes());
        assert_codec_error("record", db.store(scope).record());
        let report = db.check().expect("check");
        assert!(
            report.problems.iter().any(|p| p.contains("record does not decode")),
            "{:?}",
            report.problems
        );
    });
}

#[test]
fn a_damaged_dictionary_on_disk_gives_errors_through_the_public_api() {
    isolated(
        "a_damaged_dictionary_on_disk_gives_errors_through_the_public_api",
        || {
            let dir = tempfile::tempdir().expect("temp dir");
            let path = golden_db(dir.path());
            let (id, dict) = rows().dicts.first().cloned().expect("the golden file has a dictionary");
            let mut damaged = dict;
            for b in &mut damaged[8..64] {
                *b ^= 0xff;
            }
            damage_on_disk::<(u32, u32)>(&path, "dicts", id, &damaged);
            let db = DurableStore::open(StoreConfig::new(&path)).expect("opens");
            let scope = db.writer().register_scope_blocking(&spec()).expect("scope");
            // d299 was stored after the dictionary was trained.
            assert_codec_error("get", db.store(scope).get(&ObjectKey::namespaced("default", "d299")));
            let records = db.log().read_after(Seq(0), 1000, None);
            assert_codec_error("log", records);
        },
    );
}

#[test]
fn a_damaged_dictionary_on_disk_fails_the_writer_with_an_error() {
    use durable_informer::object::RawObject;
    use durable_informer::store::{Batch, DeltaKind};
    isolated("a_damaged_dictionary_on_disk_fails_the_writer_with_an_error", || {
        let dir = tempfile::tempdir().expect("temp dir");
        let path = golden_db(dir.path());
        let (id, mut damaged) = rows().dicts.first().cloned().expect("the golden file has a dictionary");
        for b in &mut damaged[8..64] {
            *b ^= 0xff;
        }
        damage_on_disk::<(u32, u32)>(&path, "dicts", id, &damaged);
        let db = DurableStore::open(StoreConfig::new(&path).compression(Compression::ZstdDict(3))).expect("opens");
        let scope = db.writer().register_scope_blocking(&spec()).expect("scope");
        let obj = RawObject::from_json(
            br#"{"metadata":{"name":"new","namespace":"default","resourceVersion":"500"}}"#.to_vec(),
        )
        .expect("object");
        let applied = db
            .writer()
            .apply_blocking(Batch::new(scope).delta(DeltaKind::Added, obj).rv("500"));
        let (scope_id, dict_id) = id;
        let named = format!("dictionary {dict_id} of scope {scope_id}");
        assert!(
            applied.as_ref().is_err_and(|e| e.to_string().contains(&named)),
            "the error names {named}: {applied:?}"
        );
        assert_codec_error("apply", applied);
        // The writer is still there for the next batch.
        assert!(db.writer().flush_blocking().is_ok());
    });
}

/// The encoded `objects` key of `default/<name>` in the closed database at `path`.
fn object_row_key(path: &Path, name: &str) -> Vec<u8> {
    let db = redb::Database::open(path).expect("opens");
    let txn = db.begin_read().expect("txn");
    let objects = txn
        .open_table(TableDefinition::<&[u8], &[u8]>::new("objects"))
        .expect("objects");
    let suffix = format!("default\0{name}");
    let key = objects
        .iter()
        .expect("iter")
        .map(|r| r.expect("row").0.value().to_vec())
        .find(|k| k.ends_with(suffix.as_bytes()))
        .expect("the object's row");
    key
}

fn configmap(name: &str, rv: &str, v: &str) -> durable_informer::object::RawObject {
    durable_informer::object::RawObject::from_json(
        format!(
            r#"{{"metadata":{{"name":"{name}","namespace":"default","resourceVersion":"{rv}"}},"data":{{"v":"{v}"}}}}"#
        )
        .into_bytes(),
    )
    .expect("object")
}

/// The golden database with the object rows of d299 and d298 damaged, opened, and its scope.
fn golden_with_damaged_d299_and_d298(dir: &Path) -> (DurableStore, ScopeId) {
    let path = golden_db(dir);
    for name in ["d299", "d298"] {
        damage_on_disk::<&[u8]>(&path, "objects", &object_row_key(&path, name), &huge_string_after(&[1]));
    }
    let db = DurableStore::open(StoreConfig::new(&path)).expect("opens");
    let scope = db.writer().register_scope_blocking(&spec()).expect("scope");
    (db, scope)
}

/// `check` finds nothing wrong with d299 and d298 any more.
fn assert_d299_and_d298_healed(db: &DurableStore) {
    let report = db.check().expect("check");
    assert!(
        !report.problems.iter().any(|p| p.contains("d299") || p.contains("d298")),
        "the damaged rows were replaced: {:?}",
        report.problems
    );
}

/// Review finding F8 at the writer: the stored row of the version an update replaces does not
/// decode. The update is written with no previous state (`old: None`) and counted, and the
/// other deltas of the group commit; a delete of a damaged row removes it.
#[test]
fn a_damaged_old_object_row_does_not_fail_the_update() {
    use durable_informer::store::{Batch, DeltaKind};
    isolated("a_damaged_old_object_row_does_not_fail_the_update", || {
        let dir = tempfile::tempdir().expect("temp dir");
        let (db, scope) = golden_with_damaged_d299_and_d298(dir.path());
        let store = db.store(scope);
        let before = store.list_keys().expect("keys").len();
        assert_eq!(db.damaged_rows_skipped(), 0);
        let committed = db
            .writer()
            .apply_blocking(
                Batch::new(scope)
                    .delta(DeltaKind::Updated, configmap("d299", "900", "new"))
                    .delta(DeltaKind::Added, configmap("fresh", "901", "1"))
                    .rv("901"),
            )
            .expect("the update of a damaged row commits");
        assert_eq!(committed.entries, 2);
        let now = store
            .get(&ObjectKey::namespaced("default", "d299"))
            .expect("reads again")
            .expect("stored");
        assert_eq!(now.meta.resource_version.as_str(), "900");
        let log = db.log().read_after(Seq(committed.seq.0 - 2), 10, None).expect("log");
        assert_eq!(log.len(), 2, "{log:?}");
        assert_eq!(log[0].kind, DeltaKind::Updated, "the key was stored: an update");
        assert_eq!(log[0].old, None, "its previous state does not decode");
        assert_eq!(log[1].kind, DeltaKind::Added);
        assert_eq!(db.damaged_rows_skipped(), 1, "the damaged previous state is counted");
        assert_eq!(
            store.list_keys().expect("keys").len(),
            before + 1,
            "d299 was replaced, not added"
        );

        // A delete of the other damaged row removes it.
        let committed = db
            .writer()
            .apply_blocking(
                Batch::new(scope)
                    .delta(DeltaKind::Deleted, configmap("d298", "902", ""))
                    .rv("902"),
            )
            .expect("the delete of a damaged row commits");
        assert_eq!(committed.entries, 1);
        assert_eq!(store.get(&ObjectKey::namespaced("default", "d298")).expect("get"), None);
        let log = db.log().read_after(Seq(committed.seq.0 - 1), 10, None).expect("log");
        assert_eq!(log[0].kind, DeltaKind::Deleted);
        assert_eq!(log[0].old, None);
        assert_eq!(db.damaged_rows_skipped(), 2);
        assert_eq!(store.list_keys().expect("keys").len(), before);
        assert_d299_and_d298_healed(&db);
    });
}

/// A relist over damaged object rows heals them: a listed one is replaced whatever its RV
/// (never counted unchanged), an unlisted one is deleted.
#[test]
fn a_relist_replaces_damaged_object_rows() {
    isolated("a_relist_replaces_damaged_object_rows", || {
        let dir = tempfile::tempdir().expect("temp dir");
        let (db, scope) = golden_with_damaged_d299_and_d298(dir.path());
        let store = db.store(scope);
        let keys = store.list_keys().expect("keys");
        // Everything is listed again with the same RV, but d298 is gone and d299's row was damaged.
        let listed: Vec<_> = keys
            .iter()
            .filter(|k| k.name != "d298")
            .map(|k| match store.get(k) {
                Ok(Some(o)) => durable_informer::object::RawObject::from_json(o.bytes.to_vec()).expect("object"),
                _ => configmap(&k.name, "1", "relisted"),
            })
            .collect();
        db.writer().stage_relist_blocking(scope, listed).expect("stages");
        let summary = db
            .writer()
            .finish_relist_blocking(scope, "9999".into(), "test")
            .expect("a relist over damaged rows commits");
        assert_eq!((summary.updated, summary.deleted), (1, 1), "{summary:?}");
        assert_eq!(summary.unchanged as usize, keys.len() - 2);
        let d299 = store
            .get(&ObjectKey::namespaced("default", "d299"))
            .expect("reads again")
            .expect("stored");
        assert_eq!(d299.meta.resource_version.as_str(), "1");
        assert_eq!(db.damaged_rows_skipped(), 2);
        assert_d299_and_d298_healed(&db);
    });
}

/// `check` decompresses every stored state: compressed bytes that no longer decompress are
/// found (in the log entry and in the object whose current state it is), though every row's
/// header still decodes.
#[test]
fn check_finds_compressed_bytes_that_do_not_decompress() {
    use durable_informer::store::{Batch, DeltaKind};
    let dir = tempfile::tempdir().expect("temp dir");
    let path = dir.path().join("db.redb");
    let config = || StoreConfig::new(&path).compression(Compression::Zstd(3));
    let db = DurableStore::open(config()).expect("opens");
    let scope = db.writer().register_scope_blocking(&spec()).expect("scope");
    let committed = db
        .writer()
        .apply_blocking(
            Batch::new(scope)
                .delta(DeltaKind::Added, configmap("x", "10", "1"))
                .delta(DeltaKind::Added, configmap("y", "11", "1"))
                .rv("11"),
        )
        .expect("applies");
    let x_seq = committed.seq.0 - 1;
    assert!(db.check().expect("check").is_ok(), "an undamaged database");
    db.close().expect("closes");
    damage_log_data(&path, x_seq);
    let db = DurableStore::open(config()).expect("opens");
    let report = db.check().expect("check");
    let log_problem = format!("log entry {x_seq}");
    assert!(
        report
            .problems
            .iter()
            .any(|p| p.starts_with(&log_problem) && p.contains("decompress")),
        "{:?}",
        report.problems
    );
    assert!(
        report
            .problems
            .iter()
            .any(|p| p.contains("object default/x") && p.contains("decompress")),
        "{:?}",
        report.problems
    );
    assert!(
        !report.problems.iter().any(|p| p.contains("default/y")),
        "{:?}",
        report.problems
    );
}

// ---- Damaged log entries and durable handlers ----

fn describe(ev: &Event<ConfigMap>) -> String {
    let name = |c: &ConfigMap| c.metadata.name.clone().unwrap_or_default();
    let val = |c: &ConfigMap| c.data.as_ref().and_then(|d| d.get("v").cloned()).unwrap_or_default();
    match ev {
        Event::Add { object, .. } => format!("add {} {}", name(object), val(object)),
        Event::Update { old, new, resync } => format!(
            "update {} {}->{}{}",
            name(new),
            val(old),
            val(new),
            if *resync { " (resync)" } else { "" }
        ),
        Event::Delete { object, .. } => format!("delete {}", name(object)),
    }
}

type Seen = Arc<Mutex<Vec<String>>>;

fn recorder(seen: &Seen) -> impl durable_informer::informer::EventHandler<ConfigMap> {
    let seen = seen.clone();
    handler_fn(move |ev: Event<ConfigMap>| -> Result<(), std::convert::Infallible> {
        seen.lock().expect("seen").push(describe(&ev));
        Ok(())
    })
}

async fn wait_for(what: &str, mut done: impl FnMut() -> bool) {
    for _ in 0..1000 {
        if done() {
            return;
        }
        tokio::time::sleep(std::time::Duration::from_millis(10)).await;
    }
    panic!("timed out waiting for {what}");
}

/// Runs an informer of `db` against `fake`, with the durable handler `audit` when `seen` is
/// given, until `until` holds; then shuts it down.
async fn run_informer(
    db: &DurableStore,
    fake: &Fake,
    seen: Option<&Seen>,
    until: impl FnMut() -> bool,
) -> Vec<durable_informer::informer::InformerIssue> {
    let inf = Informer::<ConfigMap>::builder(db, fake.clone())
        .build()
        .await
        .expect("informer");
    if let Some(seen) = seen {
        inf.add_event_handler(recorder(seen), HandlerOptions::durable("audit"));
    }
    inf.start();
    inf.wait_for_sync().await.expect("synced");
    wait_for("the informer", until).await;
    let issues = inf.issues();
    inf.shutdown().await.expect("shuts down");
    issues
}

/// Overwrites the first bytes of a log row's object bytes (its zstd magic): the header still
/// decodes, the state does not.
fn damage_log_data(path: &Path, seq: u64) {
    let db = redb::Database::open(path).expect("opens");
    let mut row = {
        let txn = db.begin_read().expect("txn");
        let log = txn.open_table(TableDefinition::<u64, &[u8]>::new("log")).expect("log");
        let row = log.get(seq).expect("get").expect("the entry").value().to_vec();
        row
    };
    let header = u32::from_le_bytes([row[1], row[2], row[3], row[4]]) as usize;
    row[5 + header..9 + header].copy_from_slice(&[0, 0, 0, 0]);
    drop(db);
    damage_on_disk::<u64>(path, "log", seq, &row);
}

/// A damaged log entry does not stop a durable handler's cursor: it is skipped and reported,
/// and what the handler may have missed is told again as resync updates (the key's current
/// state when the entry's header names it, every object when it does not). An entry whose
/// previous state alone is damaged is delivered with `old` = `new`.
#[test]
fn a_damaged_log_entry_is_skipped_reported_and_resynced_for_a_durable_handler() {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("runtime");
    rt.block_on(async {
        let dir = tempfile::tempdir().expect("temp dir");
        let path = dir.path().join("db.redb");
        let config = || StoreConfig::new(&path).compression(Compression::Zstd(3));
        let fake = Fake::new();
        for n in ["a", "b", "c"] {
            fake.upsert(n, "1");
        }
        // The handler hears of a, b and c and persists its cursor.
        let db = DurableStore::open(config()).expect("opens");
        let seen = Seen::default();
        run_informer(&db, &fake, Some(&seen), || seen.lock().expect("seen").len() >= 3).await;
        let (scope, _) = db.scopes().expect("scopes").into_iter().next().expect("a scope");
        let cursor = db.log().cursor(scope, "audit").expect("cursor").expect("persisted");
        // Without the handler: four changes it has not read.
        fake.upsert("a", "2");
        fake.upsert("a", "3");
        fake.upsert("d", "1");
        fake.delete("b");
        let store = db.store(scope);
        run_informer(&db, &fake, None, || {
            store.get(&ObjectKey::namespaced("ns", "b")).is_ok_and(|b| b.is_none())
        })
        .await;
        let entries = db.log().read_after(cursor, 100, Some(scope)).expect("log");
        let seqs: Vec<(String, u64)> = entries.iter().map(|r| (r.key.name.clone(), r.seq.0)).collect();
        assert_eq!(
            seqs.iter().map(|(n, _)| n.as_str()).collect::<Vec<_>>(),
            ["a", "a", "d", "b"],
            "{seqs:?}"
        );
        let last = seqs[3].1;
        drop(store);
        db.close().expect("closes");
        // a=2 loses its state (so a=3 loses its previous state); the delete of b its header.
        damage_log_data(&path, seqs[0].1);
        damage_on_disk::<u64>(&path, "log", last, &huge_string_after(&[0, 0, 1]));

        let db = DurableStore::open(config()).expect("a damaged database opens");
        let seen = Seen::default();
        let issues = run_informer(&db, &fake, Some(&seen), || seen.lock().expect("seen").len() >= 6).await;
        assert_eq!(
            *seen.lock().expect("seen"),
            [
                // a=2 is damaged: a's current state instead.
                "update a 3->3 (resync)",
                // a=3 without its previous state.
                "update a 3->3",
                "add d 1",
                // The delete of b names no key: every object, as a resync (b's delete is lost).
                "update a 3->3 (resync)",
                "update c 1->1 (resync)",
                "update d 1->1 (resync)",
            ]
        );
        let damaged: Vec<(u64, Option<String>)> = issues
            .iter()
            .filter_map(|i| match i {
                InformerIssue::Handler {
                    problem: HandlerProblem::DamagedLogEntry { seq, key, .. },
                    ..
                } => Some((seq.0, key.as_ref().map(|k| k.name.clone()))),
                _ => None,
            })
            .collect();
        assert_eq!(
            damaged,
            [
                (seqs[0].1, Some("a".to_owned())),
                (seqs[1].1, Some("a".to_owned())),
                (last, None)
            ],
            "{issues:?}"
        );
        assert!(
            db.log()
                .cursor(scope, "audit")
                .expect("cursor")
                .is_some_and(|c| c.0 >= last),
            "the cursor moved past the damaged entries"
        );
        db.close().expect("closes");
    });
}

/// The value of `durable_informer_damaged_rows_skipped_total` for the golden copy's file.
#[cfg(feature = "metrics")]
fn damaged_rows_skipped_metric() -> u64 {
    let text = durable_informer::metrics::encode();
    text.lines()
        .find(|l| l.starts_with("durable_informer_damaged_rows_skipped_total{database=\"damaged.redb\"}"))
        .and_then(|l| l.rsplit(' ').next())
        .and_then(|v| v.parse::<f64>().ok())
        .map_or(0, |v| v as u64)
}

/// H2's leftovers: one damaged object row stopped a durable handler's initial adds (and its
/// resyncs) and a watcher stream's initial list for ever (`Snapshot::list_after` failed the
/// whole page, retried for ever). Now each damaged row is skipped, reported (an issue naming
/// the key; an `Err` item of the stream) and counted, as damaged log entries are; the handler
/// hears of the object once the reflector writes it again.
#[test]
fn damaged_object_rows_are_skipped_by_initial_adds_resyncs_and_watcher_streams() {
    use futures::StreamExt;
    use kube::runtime::watcher;
    isolated(
        "damaged_object_rows_are_skipped_by_initial_adds_resyncs_and_watcher_streams",
        || {
            let dir = tempfile::tempdir().expect("temp dir");
            let (db, scope) = golden_with_damaged_d299_and_d298(dir.path());
            let keys = db.store(scope).list_keys().expect("keys");
            let damaged = ["d298", "d299"];
            let mut whole: Vec<String> = keys
                .iter()
                .map(|k| k.name.clone())
                .filter(|n| !damaged.contains(&n.as_str()))
                .collect();
            whole.sort();
            assert_eq!(whole.len() + 2, keys.len(), "both damaged rows are in the scope");
            let rt = tokio::runtime::Builder::new_multi_thread()
                .worker_threads(2)
                .enable_all()
                .build()
                .expect("runtime");
            rt.block_on(async {
                // Never started: the handlers and the stream read the store as it is.
                let inf = Informer::<ConfigMap>::builder(&db, Fake::new())
                    .build()
                    .await
                    .expect("informer");
                let seen = Seen::default();
                let _reg = inf.add_event_handler(
                    recorder(&seen),
                    HandlerOptions::durable("audit").resync(std::time::Duration::from_millis(200)),
                );
                wait_for("the initial adds' cursor", || {
                    db.log().cursor(scope, "audit").is_ok_and(|c| c.is_some())
                })
                .await;
                let names = |prefix: &str| -> Vec<String> {
                    let mut v: Vec<String> = seen
                        .lock()
                        .expect("seen")
                        .iter()
                        .filter_map(|l| l.strip_prefix(prefix))
                        .filter_map(|l| l.split(' ').next().map(str::to_owned))
                        .collect();
                    v.sort();
                    v.dedup();
                    v
                };
                assert_eq!(names("add "), whole, "the initial adds: every whole object");
                let issues = inf.issues();
                for name in damaged {
                    assert!(
                        issues.iter().any(|i| matches!(i,
                            InformerIssue::Handler { problem: HandlerProblem::Undecodable { key, message, .. }, .. }
                                if key.name == name && message.contains("damaged"))),
                        "{name} is reported: {issues:?}"
                    );
                }
                #[cfg(feature = "metrics")]
                assert_eq!(damaged_rows_skipped_metric(), 2, "each skipped row is counted");
                // A resync goes past them too.
                wait_for("a resync", || names("update ").len() == whole.len()).await;
                assert_eq!(names("update "), whole, "the resync: every whole object");

                // A watcher stream's initial list: an Err item in place of each damaged row.
                let items: Vec<_> = watcher_stream(&inf)
                    .take_while(|i| futures::future::ready(!matches!(i, Ok(watcher::Event::InitDone))))
                    .collect()
                    .await;
                let mut applied: Vec<String> = items
                    .iter()
                    .filter_map(|i| match i {
                        Ok(watcher::Event::InitApply(c)) => c.metadata.name.clone(),
                        _ => None,
                    })
                    .collect();
                applied.sort();
                assert_eq!(applied, whole, "the stream's initial list: every whole object");
                let errors: Vec<String> = items
                    .iter()
                    .filter_map(|i| i.as_ref().err().map(ToString::to_string))
                    .collect();
                assert_eq!(errors.len(), 2, "{errors:?}");
                for name in damaged {
                    assert!(
                        errors.iter().any(|e| e.contains(name) && e.contains("damaged")),
                        "{errors:?}"
                    );
                }
            });
        },
    );
}

#[test]
#[ignore = "writes the store fuzz targets' seeds (fuzz/seed-corpora.sh --store runs it)"]
fn write_fuzz_seeds() {
    let out = std::env::var_os("STORE_SEEDS_DIR").expect("STORE_SEEDS_DIR names the seeds directory");
    let out = Path::new(&out);
    store_rows::write_seeds(rows(), out).expect("writes the seeds");
    for target in [
        "store_object_row",
        "store_log_row",
        "store_record",
        "store_key",
        "store_unpack",
    ] {
        let n = std::fs::read_dir(out.join(target)).map_or(0, Iterator::count);
        assert!(n > 0, "no seeds for {target}");
        println!("{target}: {n} seeds");
    }
}
