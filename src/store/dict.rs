//! Per-scope zstd dictionaries: training on the writer, prepared dictionaries cached for
//! compression (writer) and decompression (every reader), and the one-shot (de)compression
//! calls with reused thread-local contexts.
//!
//! A dictionary row in `dicts` is keyed by (scope, dict id) and is **never rewritten or
//! deleted**: a blob tagged [`Compression::Dict`] names the row it needs, so blobs written before
//! a newer dictionary stay readable, and caching a prepared dictionary by its key is always
//! valid. (Ids are allocated inside the writer's transaction; a dictionary trained in a group
//! that rolls back is dropped from the writer's cache, so an id is never cached for two
//! different dictionaries.)

use std::cell::RefCell;
use std::collections::HashMap;
use std::sync::{Arc, RwLock};

use bytes::Bytes;
use zstd::zstd_safe::{self, CDict, DDict};

use super::codec::{CodecError, Compression};
use super::StoreError;
use crate::util::RwLocked;

/// Objects a scope's first dictionary is trained on.
pub(crate) const TRAIN_SAMPLES: usize = 256;
/// Target size of a trained dictionary.
pub(crate) const DICT_BYTES: usize = 64 << 10;
/// Decompressed sizes above this are refused (a damaged frame header must not allocate
/// gigabytes); Kubernetes objects are limited to a few MiB.
const MAX_OBJECT_BYTES: u64 = 1 << 30;
/// Most bytes one zstd block holds (the format's Block_Maximum_Size).
const BLOCK_MAX: u64 = 128 << 10;
/// The first output buffer of a decompression: this many times the compressed size, at least
/// [`FIRST_OUT_MIN`]. Grown only when zstd says it is too small, so a damaged frame that declares
/// a huge size fails before the reader allocates it.
const FIRST_OUT_RATIO: usize = 64;
const FIRST_OUT_MIN: usize = 64 << 10;
/// zstd's "destination buffer is too small" as its functions return it.
const DST_TOO_SMALL: usize = (zstd_safe::zstd_sys::ZSTD_ErrorCode::ZSTD_error_dstSize_tooSmall as usize).wrapping_neg();

thread_local! {
    static CCTX: RefCell<zstd_safe::CCtx<'static>> = RefCell::new(zstd_safe::CCtx::create());
    static DCTX: RefCell<zstd_safe::DCtx<'static>> = RefCell::new(zstd_safe::DCtx::create());
}

fn zerr(code: usize) -> CodecError {
    CodecError::Decompress(std::io::Error::other(zstd_safe::get_error_name(code)))
}

/// A dictionary prepared for compression on the writer.
pub(crate) struct EncDict {
    pub(crate) scope: u32,
    pub(crate) id: u32,
    cdict: CDict<'static>,
    /// The same dictionary for decompression, handed with each blob to the informers' caches.
    ddict: Arc<DDict<'static>>,
}

impl EncDict {
    /// Prepares dictionary `id` of `scope`; an error when zstd refuses its bytes (a damaged
    /// row: its entropy tables do not load).
    pub(crate) fn new(scope: u32, id: u32, bytes: &[u8], level: i32) -> Result<Self, CodecError> {
        let cdict = CDict::try_create(bytes, level).ok_or_else(|| damaged_dict(scope, id))?;
        let ddict = Arc::new(DDict::try_create(bytes).ok_or_else(|| damaged_dict(scope, id))?);
        Ok(Self {
            scope,
            id,
            cdict,
            ddict,
        })
    }

    /// `blob`, tagged `tag` by [`pack`] or [`pack_with`] with this dictionary (or with none), as
    /// a [`Packed`]; `None` for one stored as received or with another dictionary.
    pub(crate) fn packed(this: Option<&Self>, blob: &Bytes, tag: Compression, json_len: usize) -> Option<Packed> {
        let dict = match tag {
            Compression::Zstd(_) => None,
            Compression::Dict { scope, dict } => Some(this.filter(|d| d.scope == scope && d.id == dict)?.ddict.clone()),
            Compression::None | Compression::ZstdDict(_) => return None,
        };
        Some(Packed {
            bytes: blob.clone(),
            dict,
            json_len,
        })
    }
}

/// An object's JSON as the store compressed it, with the dictionary that decompresses it: what
/// an informer's cache keeps in place of the JSON, a fraction of its size. Decompressing takes
/// a microsecond or two against tens for decoding the JSON.
#[derive(Clone)]
pub(crate) struct Packed {
    bytes: Bytes,
    dict: Option<Arc<DDict<'static>>>,
    json_len: usize,
}

impl Packed {
    /// The JSON.
    pub(crate) fn json(&self) -> Result<Bytes, CodecError> {
        let json = decompress_with(self.dict.as_deref(), &self.bytes)?;
        debug_assert_eq!(json.len(), self.json_len, "a blob packed from other JSON");
        Ok(json)
    }

    /// Its compressed size.
    pub(crate) fn len(&self) -> usize {
        self.bytes.len()
    }

    /// The size of its JSON.
    pub(crate) fn json_len(&self) -> usize {
        self.json_len
    }
}

impl std::fmt::Debug for Packed {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Packed")
            .field("len", &self.bytes.len())
            .field("json_len", &self.json_len)
            .field("dict", &self.dict.is_some())
            .finish()
    }
}

/// The error for a dictionary row zstd refuses.
fn damaged_dict(scope: u32, id: u32) -> CodecError {
    CodecError::Decompress(std::io::Error::other(format!(
        "dictionary {id} of scope {scope} is damaged"
    )))
}

/// Compresses `bytes` as the setting `setting` asks, with `dict` when the setting is
/// [`Compression::ZstdDict`] and the scope has one. Returns the bytes to store and their tag.
pub(crate) fn pack(
    setting: Compression,
    dict: Option<&EncDict>,
    bytes: &Bytes,
) -> Result<(Bytes, Compression), CodecError> {
    let (level, dict) = match setting {
        Compression::None | Compression::Dict { .. } => return Ok((bytes.clone(), Compression::None)),
        Compression::Zstd(level) => (level, None),
        Compression::ZstdDict(level) => (level, dict),
    };
    let mut out: Vec<u8> = Vec::with_capacity(zstd_safe::compress_bound(bytes.len()));
    CCTX.with(|c| {
        let mut c = c.borrow_mut();
        match dict {
            Some(d) => c.compress_using_cdict(&mut out, bytes, &d.cdict),
            None => c.compress(&mut out, bytes, level),
        }
    })
    .map_err(zerr)?;
    // Caches keep the blob: without this it would hold the whole bound's allocation.
    out.shrink_to_fit();
    let tag = match dict {
        Some(d) => Compression::Dict {
            scope: d.scope,
            dict: d.id,
        },
        None => Compression::Zstd(level),
    };
    Ok((Bytes::from(out), tag))
}

/// Compresses `bytes` with `dict` (a committed dictionary): the same bytes [`pack`] gives for
/// it, computed on any thread.
pub(crate) fn pack_with(dict: &EncDict, bytes: &Bytes) -> Result<Bytes, CodecError> {
    let mut out: Vec<u8> = Vec::with_capacity(zstd_safe::compress_bound(bytes.len()));
    CCTX.with(|c| c.borrow_mut().compress_using_cdict(&mut out, bytes, &dict.cdict))
        .map_err(zerr)?;
    out.shrink_to_fit();
    Ok(Bytes::from(out))
}

/// Compresses many objects, on two threads when there are enough of them: the writer thread
/// then spends its time on redb work rather than zstd.
pub(crate) fn pack_all(
    setting: Compression,
    dict: Option<&EncDict>,
    objects: &[&Bytes],
) -> Result<Vec<(Bytes, Compression)>, CodecError> {
    let run = |chunk: &[&Bytes]| {
        chunk
            .iter()
            .map(|b| pack(setting, dict, b))
            .collect::<Result<Vec<_>, _>>()
    };
    if matches!(setting, Compression::None) || objects.len() < 32 {
        return run(objects);
    }
    let (a, b) = objects.split_at(objects.len() / 2);
    std::thread::scope(|s| {
        let other = s.spawn(|| run(b));
        let mut first = run(a)?;
        let second = other.join().unwrap_or_else(|p| std::panic::resume_unwind(p))?;
        first.extend(second);
        Ok(first)
    })
}

/// Trains a dictionary on `samples`; `None` when zstd cannot (too few or too similar samples).
pub(crate) fn train(samples: &[Bytes]) -> Option<Vec<u8>> {
    match zstd::dict::from_samples(samples, DICT_BYTES) {
        Ok(d) => Some(d),
        Err(e) => {
            tracing::warn!(error = %e, samples = samples.len(), "zstd dictionary training failed; objects stay compressed without one");
            None
        }
    }
}

/// Prepared decompression dictionaries by (scope, dict id), shared by every reader.
#[derive(Default)]
pub(crate) struct DictCache {
    decoders: RwLock<HashMap<(u32, u32), Arc<DDict<'static>>>>,
}

/// Loads a dictionary row: `Ok(None)` when it does not exist.
pub(crate) type LoadDict<'a> = &'a dyn Fn(u32, u32) -> Result<Option<Vec<u8>>, StoreError>;

impl DictCache {
    fn decoder(&self, scope: u32, id: u32, load: LoadDict<'_>) -> Result<Option<Arc<DDict<'static>>>, StoreError> {
        if let Some(d) = self.decoders.reading().get(&(scope, id)) {
            return Ok(Some(d.clone()));
        }
        let Some(bytes) = load(scope, id)? else { return Ok(None) };
        // zstd refuses a damaged dictionary whose entropy tables do not load.
        let d = Arc::new(DDict::try_create(&bytes).ok_or_else(|| damaged_dict(scope, id))?);
        self.decoders.writing().insert((scope, id), d.clone());
        Ok(Some(d))
    }

    /// Decompresses stored bytes tagged `compression`, loading the dictionary it names if needed.
    pub(crate) fn unpack(
        &self,
        compression: Compression,
        bytes: &[u8],
        load: LoadDict<'_>,
    ) -> Result<Bytes, StoreError> {
        let (scope, dict) = match compression {
            Compression::Dict { scope, dict } => (scope, dict),
            Compression::Zstd(_) | Compression::ZstdDict(_) => return Ok(decompress_with(None, bytes)?),
            Compression::None => return Ok(Bytes::copy_from_slice(bytes)),
        };
        let Some(d) = self.decoder(scope, dict, load)? else {
            return Err(StoreError::Codec(CodecError::Decompress(std::io::Error::other(
                format!("dictionary {dict} of scope {scope} is missing"),
            ))));
        };
        Ok(decompress_with(Some(&d), bytes)?)
    }
}

/// One-shot decompression with a reused context (a fresh context per object costs more than the
/// decompression). Every frame this store writes holds its content size; one without is refused.
fn decompress_with(dict: Option<&DDict<'_>>, src: &[u8]) -> Result<Bytes, CodecError> {
    let bad = |what: &str| CodecError::Decompress(std::io::Error::other(what.to_owned()));
    let most = blocks_hold(src)
        .ok_or_else(|| bad("damaged zstd block header"))?
        .min(MAX_OBJECT_BYTES);
    let size = match zstd_safe::get_frame_content_size(src) {
        Ok(Some(n)) if n <= most => n as usize,
        Ok(None) => return Err(bad("zstd frame without a content size")),
        _ => return Err(bad("bad zstd frame header")),
    };
    let mut cap = size.min(src.len().saturating_mul(FIRST_OUT_RATIO).max(FIRST_OUT_MIN));
    loop {
        let mut out: Vec<u8> = Vec::with_capacity(cap);
        let done = DCTX.with(|c| {
            let mut c = c.borrow_mut();
            match dict {
                Some(d) => c.decompress_using_ddict(&mut out, src, d),
                None => c.decompress(&mut out, src),
            }
        });
        match done {
            Ok(_) if out.len() == size => return Ok(Bytes::from(out)),
            Ok(_) => return Err(bad("zstd frame size mismatch")),
            Err(DST_TOO_SMALL) if cap < size => cap = size.min(cap.saturating_mul(4)),
            Err(code) => return Err(zerr(code)),
        }
    }
}

/// The most bytes the blocks of the zstd frame at the start of `src` can hold, or `None` when a
/// header does not fit the format (a block over 128 KiB, which zstd's one-shot decoder would
/// still fill, or a frame cut short): what a damaged frame header may declare is checked
/// against it before anything is allocated.
fn blocks_hold(src: &[u8]) -> Option<u64> {
    let descriptor = *src.get(4)?;
    let single_segment = descriptor & 0x20 != 0;
    let dict_id = [0, 1, 2, 4][usize::from(descriptor & 3)];
    let content_size = match descriptor >> 6 {
        0 => usize::from(single_segment),
        1 => 2,
        2 => 4,
        _ => 8,
    };
    let mut at = 5 + usize::from(!single_segment) + dict_id + content_size;
    let mut total = 0u64;
    loop {
        let h = src.get(at..at + 3)?;
        let h = u32::from_le_bytes([h[0], h[1], h[2], 0]);
        let size = u64::from(h >> 3);
        if size > BLOCK_MAX {
            return None;
        }
        // Raw: `size` bytes follow; RLE: one byte repeated `size` times; compressed: `size`
        // bytes that hold up to a block.
        let (follows, holds) = match (h >> 1) & 3 {
            0 => (size, size),
            1 => (1, size),
            2 => (size, BLOCK_MAX),
            _ => return None,
        };
        at = at.checked_add(3 + usize::try_from(follows).ok()?)?;
        total += holds;
        if at > src.len() {
            return None;
        }
        if h & 1 == 1 {
            return Some(total);
        }
    }
}

impl Compression {
    /// Decompresses `bytes` stored with this tag the way a reader does, with `dict` as the row
    /// of the dictionary a [`Compression::Dict`] tag names (`None`: the row is missing). The
    /// entry point of the damaged-row fuzz targets and tests; exposed for fuzzing only.
    #[doc(hidden)]
    pub fn check_unpack(self, bytes: &[u8], dict: Option<&[u8]>) -> Result<Bytes, StoreError> {
        DictCache::default().unpack(self, bytes, &|_, _| Ok(dict.map(<[u8]>::to_vec)))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample(i: usize) -> Bytes {
        Bytes::from(format!(
            r#"{{"kind":"Pod","metadata":{{"name":"web-{i}","namespace":"ns-{}","labels":{{"app":"a{}"}}}},"spec":{{"containers":[{{"name":"c","image":"img:{}"}}]}},"status":{{"phase":"Running","podIP":"10.0.{}.{}"}}}}"#,
            i % 7,
            i % 11,
            i % 5,
            i % 250,
            i / 250
        ))
    }

    #[test]
    fn dictionary_blobs_round_trip_and_name_their_dictionary() {
        let samples: Vec<Bytes> = (0..TRAIN_SAMPLES).map(sample).collect();
        let raw = train(&samples).expect("trains");
        let enc = EncDict::new(4, 2, &raw, 3).unwrap();
        let obj = sample(10_001);
        let (packed, tag) = pack(Compression::ZstdDict(3), Some(&enc), &obj).unwrap();
        assert_eq!(tag, Compression::Dict { scope: 4, dict: 2 });
        assert!(packed.len() < obj.len() / 2, "{} vs {}", packed.len(), obj.len());
        let cache = DictCache::default();
        let load = |s: u32, d: u32| Ok(((s, d) == (4, 2)).then(|| raw.clone()));
        assert_eq!(cache.unpack(tag, &packed, &load).unwrap(), obj);
        // Missing dictionary and damaged bytes are errors, not panics.
        let other = Compression::Dict { scope: 4, dict: 3 };
        assert!(cache.unpack(other, &packed, &load).is_err());
        assert!(cache.unpack(tag, &packed[..packed.len() / 2], &load).is_err());
        assert!(cache.unpack(tag, b"garbage", &load).is_err());
        // Without a dictionary the setting falls back to plain zstd, readable without one.
        let (plain, tag) = pack(Compression::ZstdDict(3), None, &obj).unwrap();
        assert_eq!(tag, Compression::Zstd(3));
        assert_eq!(cache.unpack(tag, &plain, &load).unwrap(), obj);
    }

    #[test]
    fn a_packed_blob_holds_only_its_compressed_bytes_and_gives_back_the_json() {
        let samples: Vec<Bytes> = (0..TRAIN_SAMPLES).map(sample).collect();
        let raw = train(&samples).expect("trains");
        let enc = EncDict::new(4, 2, &raw, 3).unwrap();
        let obj = sample(10_001);
        let (blob, tag) = pack(Compression::ZstdDict(3), Some(&enc), &obj).unwrap();
        // What a cache keeps is the blob's allocation: not compress_bound's. (A unique `Bytes`
        // gives its allocation back whole.)
        let held = Vec::from(pack(Compression::ZstdDict(3), Some(&enc), &obj).unwrap().0).capacity();
        assert!(held < obj.len() / 2, "{held} bytes held for {} of JSON", obj.len());
        let p = EncDict::packed(Some(&enc), &blob, tag, obj.len()).expect("a dictionary blob");
        assert_eq!((p.len(), p.json_len()), (blob.len(), obj.len()));
        assert_eq!(p.json().unwrap(), obj);
        // Plain zstd needs no dictionary; bytes stored as received are not a blob.
        let (plain, ztag) = pack(Compression::Zstd(1), None, &obj).unwrap();
        let p = EncDict::packed(None, &plain, ztag, obj.len()).expect("a zstd blob");
        assert_eq!(p.json().unwrap(), obj);
        let (same, none) = pack(Compression::None, None, &obj).unwrap();
        assert!(EncDict::packed(Some(&enc), &same, none, obj.len()).is_none());
        // A blob of another dictionary (or with none at hand) is not given one that cannot
        // read it.
        let other = EncDict::new(4, 3, &raw, 3).unwrap();
        assert!(EncDict::packed(Some(&other), &blob, tag, obj.len()).is_none());
        assert!(EncDict::packed(None, &blob, tag, obj.len()).is_none());
    }

    #[test]
    fn pack_all_keeps_order_across_threads() {
        let objs: Vec<Bytes> = (0..100).map(sample).collect();
        let refs: Vec<&Bytes> = objs.iter().collect();
        let packed = pack_all(Compression::Zstd(1), None, &refs).unwrap();
        let cache = DictCache::default();
        let load = |_: u32, _: u32| Ok(None);
        for (o, (p, t)) in objs.iter().zip(packed) {
            assert_eq!(&cache.unpack(t, &p, &load).unwrap(), o);
        }
    }
}
