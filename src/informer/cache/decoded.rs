//! What a decoded object takes on the heap, estimated while it is decoded.
//!
//! The budget charges a cache entry for its decoded form, and that form's size depends on the
//! Rust type far more than on the JSON: k8s-openapi's structs hold every optional field inline,
//! so a decoded `Pod` is about eight times its JSON where a `ConfigMap` is about two and a half
//! (`benches/memory.rs`). A decode goes through [`Meter`], a transparent wrapper of the JSON
//! deserializer that sees which collections the type allocates: a sequence decoded as a
//! sequence (a `Vec`), a map decoded as a map (a `BTreeMap`, a JSON `Value`'s object), each
//! string; not a struct's fields, which sit inline in their parent. Each element is counted at
//! its Rust size (`size_of` of the type the target decodes into), so nested structs are
//! counted whole.

use std::cell::Cell;
use std::fmt;
use std::mem::size_of;

use serde::de::{self, DeserializeOwned, DeserializeSeed, Deserializer, Visitor};

use crate::store::memory::ALLOC;

/// `json` decoded as `K`, and the estimated heap it takes: `K` itself in an `Arc`, and what
/// it allocates.
pub(crate) fn decode_sized<K: DeserializeOwned>(json: &[u8]) -> Result<(K, usize), serde_json::Error> {
    let bytes = Cell::new(0);
    let mut de = serde_json::Deserializer::from_slice(json);
    let k = K::deserialize(Meter {
        de: &mut de,
        bytes: &bytes,
    })?;
    de.end()?;
    Ok((k, size_of::<K>() + 2 * size_of::<usize>() + ALLOC + bytes.get()))
}

/// A `Vec` of `len` elements of `size` bytes, grown one push at a time as serde's does when
/// the format gives no length: doubling from 4 (1 for elements over 1 KiB).
fn vec_bytes(len: usize, size: usize) -> usize {
    if len == 0 {
        return 0;
    }
    let first = if size > 1024 { 1 } else { 4 };
    len.next_power_of_two().max(first) * size + ALLOC
}

/// A B-tree map of `len` entries of `size` bytes: leaves of eleven, about two-thirds full
/// past the first, and their parents.
fn map_bytes(len: usize, size: usize) -> usize {
    if len == 0 {
        return 0;
    }
    let leaves = if len <= 11 { 1 } else { len.div_ceil(7) };
    let internal = if leaves > 1 { leaves.div_ceil(7) } else { 0 };
    let leaf = 11 * size + 16;
    leaves * (leaf + ALLOC) + internal * (leaf + 12 * size_of::<usize>() + ALLOC)
}

/// How the value being decoded holds what it contains.
#[derive(Clone, Copy)]
enum Holds {
    /// A collection on the heap: its elements count.
    Heap,
    /// A struct, tuple or enum: its fields sit inline in it.
    Inline,
    /// A struct field's name: nothing is kept.
    Name,
}

struct Meter<'a, D> {
    de: D,
    bytes: &'a Cell<usize>,
}

impl<'a, D> Meter<'a, D> {
    fn wrap<V>(&self, v: V, holds: Holds) -> Counted<'a, V> {
        Counted {
            v,
            bytes: self.bytes,
            holds,
        }
    }
}

macro_rules! forward {
    ($($method:ident),*) => {$(
        fn $method<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value, Self::Error> {
            let v = self.wrap(visitor, Holds::Heap);
            self.de.$method(v)
        }
    )*};
}

impl<'de, D: Deserializer<'de>> Deserializer<'de> for Meter<'_, D> {
    type Error = D::Error;

    forward!(
        deserialize_any,
        deserialize_bool,
        deserialize_i8,
        deserialize_i16,
        deserialize_i32,
        deserialize_i64,
        deserialize_i128,
        deserialize_u8,
        deserialize_u16,
        deserialize_u32,
        deserialize_u64,
        deserialize_u128,
        deserialize_f32,
        deserialize_f64,
        deserialize_char,
        deserialize_str,
        deserialize_string,
        deserialize_bytes,
        deserialize_byte_buf,
        deserialize_option,
        deserialize_unit,
        deserialize_seq,
        deserialize_map
    );

    fn deserialize_unit_struct<V: Visitor<'de>>(self, name: &'static str, visitor: V) -> Result<V::Value, Self::Error> {
        let v = self.wrap(visitor, Holds::Inline);
        self.de.deserialize_unit_struct(name, v)
    }

    fn deserialize_newtype_struct<V: Visitor<'de>>(
        self,
        name: &'static str,
        visitor: V,
    ) -> Result<V::Value, Self::Error> {
        let v = self.wrap(visitor, Holds::Inline);
        self.de.deserialize_newtype_struct(name, v)
    }

    fn deserialize_tuple<V: Visitor<'de>>(self, len: usize, visitor: V) -> Result<V::Value, Self::Error> {
        let v = self.wrap(visitor, Holds::Inline);
        self.de.deserialize_tuple(len, v)
    }

    fn deserialize_tuple_struct<V: Visitor<'de>>(
        self,
        name: &'static str,
        len: usize,
        visitor: V,
    ) -> Result<V::Value, Self::Error> {
        let v = self.wrap(visitor, Holds::Inline);
        self.de.deserialize_tuple_struct(name, len, v)
    }

    fn deserialize_struct<V: Visitor<'de>>(
        self,
        name: &'static str,
        fields: &'static [&'static str],
        visitor: V,
    ) -> Result<V::Value, Self::Error> {
        let v = self.wrap(visitor, Holds::Inline);
        self.de.deserialize_struct(name, fields, v)
    }

    fn deserialize_enum<V: Visitor<'de>>(
        self,
        name: &'static str,
        variants: &'static [&'static str],
        visitor: V,
    ) -> Result<V::Value, Self::Error> {
        let v = self.wrap(visitor, Holds::Inline);
        self.de.deserialize_enum(name, variants, v)
    }

    fn deserialize_identifier<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value, Self::Error> {
        let v = self.wrap(visitor, Holds::Name);
        self.de.deserialize_identifier(v)
    }

    fn deserialize_ignored_any<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value, Self::Error> {
        // Skipped: nothing is kept.
        self.de.deserialize_ignored_any(visitor)
    }

    fn is_human_readable(&self) -> bool {
        self.de.is_human_readable()
    }
}

/// A visitor that counts what its value allocates, then does what the wrapped one does.
struct Counted<'a, V> {
    v: V,
    bytes: &'a Cell<usize>,
    holds: Holds,
}

impl<V> Counted<'_, V> {
    fn string(&self, len: usize) {
        if !matches!(self.holds, Holds::Name) && len > 0 {
            self.bytes.set(self.bytes.get() + len + ALLOC);
        }
    }
}

macro_rules! pass {
    ($($method:ident($t:ty)),*) => {$(
        fn $method<E: de::Error>(self, v: $t) -> Result<Self::Value, E> {
            self.v.$method(v)
        }
    )*};
}

impl<'de, V: Visitor<'de>> Visitor<'de> for Counted<'_, V> {
    type Value = V::Value;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.v.expecting(f)
    }

    pass!(
        visit_bool(bool),
        visit_i8(i8),
        visit_i16(i16),
        visit_i32(i32),
        visit_i64(i64),
        visit_i128(i128),
        visit_u8(u8),
        visit_u16(u16),
        visit_u32(u32),
        visit_u64(u64),
        visit_u128(u128),
        visit_f32(f32),
        visit_f64(f64),
        visit_char(char)
    );

    fn visit_str<E: de::Error>(self, v: &str) -> Result<Self::Value, E> {
        self.string(v.len());
        self.v.visit_str(v)
    }

    fn visit_borrowed_str<E: de::Error>(self, v: &'de str) -> Result<Self::Value, E> {
        self.string(v.len());
        self.v.visit_borrowed_str(v)
    }

    fn visit_string<E: de::Error>(self, v: String) -> Result<Self::Value, E> {
        self.string(v.len());
        self.v.visit_string(v)
    }

    fn visit_bytes<E: de::Error>(self, v: &[u8]) -> Result<Self::Value, E> {
        self.string(v.len());
        self.v.visit_bytes(v)
    }

    fn visit_borrowed_bytes<E: de::Error>(self, v: &'de [u8]) -> Result<Self::Value, E> {
        self.string(v.len());
        self.v.visit_borrowed_bytes(v)
    }

    fn visit_byte_buf<E: de::Error>(self, v: Vec<u8>) -> Result<Self::Value, E> {
        self.string(v.len());
        self.v.visit_byte_buf(v)
    }

    fn visit_none<E: de::Error>(self) -> Result<Self::Value, E> {
        self.v.visit_none()
    }

    fn visit_some<D: Deserializer<'de>>(self, de: D) -> Result<Self::Value, D::Error> {
        self.v.visit_some(Meter { de, bytes: self.bytes })
    }

    fn visit_unit<E: de::Error>(self) -> Result<Self::Value, E> {
        self.v.visit_unit()
    }

    fn visit_newtype_struct<D: Deserializer<'de>>(self, de: D) -> Result<Self::Value, D::Error> {
        self.v.visit_newtype_struct(Meter { de, bytes: self.bytes })
    }

    fn visit_seq<A: de::SeqAccess<'de>>(self, seq: A) -> Result<Self::Value, A::Error> {
        let mut s = Seq {
            seq,
            bytes: self.bytes,
            heap: matches!(self.holds, Holds::Heap),
            len: 0,
            size: 0,
        };
        let value = self.v.visit_seq(&mut s)?;
        s.finish();
        Ok(value)
    }

    fn visit_map<A: de::MapAccess<'de>>(self, map: A) -> Result<Self::Value, A::Error> {
        let mut m = Map {
            map,
            bytes: self.bytes,
            heap: matches!(self.holds, Holds::Heap),
            len: 0,
            size: 0,
        };
        let value = self.v.visit_map(&mut m)?;
        m.finish();
        Ok(value)
    }

    fn visit_enum<A: de::EnumAccess<'de>>(self, data: A) -> Result<Self::Value, A::Error> {
        self.v.visit_enum(Enum {
            data,
            bytes: self.bytes,
        })
    }
}

/// A seed that decodes through [`Meter`] and says the size of what it decodes.
struct Seed<'a, S> {
    seed: S,
    bytes: &'a Cell<usize>,
}

impl<'de, S: DeserializeSeed<'de>> DeserializeSeed<'de> for Seed<'_, S> {
    type Value = S::Value;

    fn deserialize<D: Deserializer<'de>>(self, de: D) -> Result<Self::Value, D::Error> {
        self.seed.deserialize(Meter { de, bytes: self.bytes })
    }
}

struct Seq<'a, A> {
    seq: A,
    bytes: &'a Cell<usize>,
    heap: bool,
    len: usize,
    size: usize,
}

impl<A> Seq<'_, A> {
    fn finish(&self) {
        if self.heap {
            self.bytes.set(self.bytes.get() + vec_bytes(self.len, self.size));
        }
    }
}

impl<'de, A: de::SeqAccess<'de>> de::SeqAccess<'de> for &mut Seq<'_, A> {
    type Error = A::Error;

    fn next_element_seed<T: DeserializeSeed<'de>>(&mut self, seed: T) -> Result<Option<T::Value>, A::Error> {
        let next = self.seq.next_element_seed(Seed {
            seed,
            bytes: self.bytes,
        })?;
        if next.is_some() {
            self.len += 1;
            self.size = size_of::<T::Value>();
        }
        Ok(next)
    }

    fn size_hint(&self) -> Option<usize> {
        self.seq.size_hint()
    }
}

struct Map<'a, A> {
    map: A,
    bytes: &'a Cell<usize>,
    heap: bool,
    len: usize,
    size: usize,
}

impl<A> Map<'_, A> {
    fn finish(&self) {
        if self.heap {
            self.bytes.set(self.bytes.get() + map_bytes(self.len, self.size));
        }
    }
}

impl<'de, A: de::MapAccess<'de>> de::MapAccess<'de> for &mut Map<'_, A> {
    type Error = A::Error;

    fn next_key_seed<K: DeserializeSeed<'de>>(&mut self, seed: K) -> Result<Option<K::Value>, A::Error> {
        // A struct's field names decode as identifiers, which keep nothing.
        let key = self.map.next_key_seed(Seed {
            seed,
            bytes: self.bytes,
        })?;
        if key.is_some() {
            self.len += 1;
            self.size = size_of::<K::Value>();
        }
        Ok(key)
    }

    fn next_value_seed<V: DeserializeSeed<'de>>(&mut self, seed: V) -> Result<V::Value, A::Error> {
        self.size += size_of::<V::Value>();
        self.map.next_value_seed(Seed {
            seed,
            bytes: self.bytes,
        })
    }

    fn size_hint(&self) -> Option<usize> {
        self.map.size_hint()
    }
}

struct Enum<'a, A> {
    data: A,
    bytes: &'a Cell<usize>,
}

impl<'a, 'de, A: de::EnumAccess<'de>> de::EnumAccess<'de> for Enum<'a, A> {
    type Error = A::Error;
    type Variant = Variant<'a, A::Variant>;

    fn variant_seed<V: DeserializeSeed<'de>>(self, seed: V) -> Result<(V::Value, Self::Variant), A::Error> {
        let (v, variant) = self.data.variant_seed(seed)?;
        Ok((
            v,
            Variant {
                variant,
                bytes: self.bytes,
            },
        ))
    }
}

struct Variant<'a, A> {
    variant: A,
    bytes: &'a Cell<usize>,
}

impl<'de, A: de::VariantAccess<'de>> de::VariantAccess<'de> for Variant<'_, A> {
    type Error = A::Error;

    fn unit_variant(self) -> Result<(), A::Error> {
        self.variant.unit_variant()
    }

    fn newtype_variant_seed<T: DeserializeSeed<'de>>(self, seed: T) -> Result<T::Value, A::Error> {
        self.variant.newtype_variant_seed(Seed {
            seed,
            bytes: self.bytes,
        })
    }

    fn tuple_variant<V: Visitor<'de>>(self, len: usize, visitor: V) -> Result<V::Value, A::Error> {
        let v = Counted {
            v: visitor,
            bytes: self.bytes,
            holds: Holds::Inline,
        };
        self.variant.tuple_variant(len, v)
    }

    fn struct_variant<V: Visitor<'de>>(
        self,
        fields: &'static [&'static str],
        visitor: V,
    ) -> Result<V::Value, A::Error> {
        let v = Counted {
            v: visitor,
            bytes: self.bytes,
            holds: Holds::Inline,
        };
        self.variant.struct_variant(fields, v)
    }
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use super::*;

    #[derive(serde::Deserialize, PartialEq, Debug)]
    struct Outer {
        name: String,
        items: Vec<Inner>,
        labels: BTreeMap<String, String>,
        maybe: Option<Inner>,
    }

    #[derive(serde::Deserialize, PartialEq, Debug)]
    struct Inner {
        a: u64,
        b: [u64; 8],
    }

    #[test]
    fn counts_what_the_type_allocates_and_decodes_the_same() {
        let json = br#"{"name":"abcdefghij","items":[{"a":1,"b":[0,0,0,0,0,0,0,0]},{"a":2,"b":[0,0,0,0,0,0,0,0]},{"a":3,"b":[0,0,0,0,0,0,0,0]}],"labels":{"k1":"v1","k2":"v22"},"maybe":{"a":4,"b":[1,1,1,1,1,1,1,1]},"unknown":{"x":[1,2,3]}}"#;
        let (o, bytes) = decode_sized::<Outer>(json).unwrap();
        assert_eq!(o, serde_json::from_slice::<Outer>(json).unwrap());
        let inner = size_of::<Inner>();
        let want = size_of::<Outer>() + 2 * size_of::<usize>() + ALLOC // the Arc'd value
            + 10 + ALLOC // its name
            + 4 * inner + ALLOC // three items: a Vec grown to 4
            + (11 * 2 * size_of::<String>() + 16 + ALLOC) // one map leaf
            + 3 * (2 + ALLOC) + (3 + ALLOC); // its keys and values
                                             // The inline option, the fields' names and the unknown field cost nothing.
        assert_eq!(bytes, want);
        assert!(decode_sized::<Outer>(b"{\"name\":1}").is_err());
        assert!(decode_sized::<Outer>(&json[..json.len() - 1]).is_err());
    }

    #[test]
    fn vectors_grow_and_maps_split_as_std_does() {
        assert_eq!(vec_bytes(0, 8), 0);
        assert_eq!(vec_bytes(1, 8), 4 * 8 + ALLOC);
        assert_eq!(vec_bytes(5, 8), 8 * 8 + ALLOC);
        assert_eq!(vec_bytes(3, 2000), 4 * 2000 + ALLOC);
        assert_eq!(vec_bytes(1, 2000), 2000 + ALLOC);
        assert_eq!(map_bytes(0, 48), 0);
        assert_eq!(map_bytes(11, 48), 11 * 48 + 16 + ALLOC);
        assert!(map_bytes(100, 48) > 100 * 48);
    }
}
