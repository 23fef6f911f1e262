//! The broker's maps' hashers. Keys a client chooses (queue, exchange and
//! virtual host names) go in a [`NameMap`], hashed by std's SipHash with
//! keys drawn at random per map, so that no set of names can be chosen to
//! collide. Keys the broker chooses itself (connection ids) go in a
//! [`FastMap`], with a small, fast, non-cryptographic hasher (the Fx hash
//! of rustc).

use std::collections::hash_map::RandomState;
use std::collections::HashMap;
use std::hash::{BuildHasherDefault, Hasher};

/// A `HashMap` with [`FxHasher`], for keys no peer chooses.
pub(crate) type FastMap<K, V> = HashMap<K, V, BuildHasherDefault<FxHasher>>;

/// A `HashMap` for names a client chooses: seeded at random, per map.
pub(crate) type NameMap<K, V> = HashMap<K, V, RandomState>;

const SEED: u64 = 0x51_7c_c1_b7_27_22_0a_95;

#[derive(Debug, Default, Clone, Copy)]
pub(crate) struct FxHasher {
    hash: u64,
}

impl FxHasher {
    #[inline]
    fn add(&mut self, word: u64) {
        self.hash = (self.hash.rotate_left(5) ^ word).wrapping_mul(SEED);
    }
}

impl Hasher for FxHasher {
    #[inline]
    fn write(&mut self, bytes: &[u8]) {
        let mut chunks = bytes.chunks_exact(8);
        for chunk in &mut chunks {
            let mut word = [0u8; 8];
            word.copy_from_slice(chunk);
            self.add(u64::from_le_bytes(word));
        }
        let rest = chunks.remainder();
        if !rest.is_empty() {
            let mut word = [0u8; 8];
            word[..rest.len()].copy_from_slice(rest);
            self.add(u64::from_le_bytes(word) ^ ((rest.len() as u64) << 56));
        }
    }

    #[inline]
    fn write_u8(&mut self, i: u8) {
        self.add(u64::from(i));
    }

    #[inline]
    fn write_u16(&mut self, i: u16) {
        self.add(u64::from(i));
    }

    #[inline]
    fn write_u32(&mut self, i: u32) {
        self.add(u64::from(i));
    }

    #[inline]
    fn write_u64(&mut self, i: u64) {
        self.add(i);
    }

    #[inline]
    fn write_usize(&mut self, i: usize) {
        self.add(i as u64);
    }

    #[inline]
    fn finish(&self) -> u64 {
        self.hash
    }
}

#[cfg(test)]
mod tests {
    use std::hash::BuildHasher;

    use acemq_codec::ShortString;

    use super::*;

    /// Names that collide in one map need not collide in another: a client
    /// cannot compute a set of names that collide in the broker's maps.
    #[test]
    fn name_maps_hash_with_a_seed_of_their_own() {
        let a: NameMap<ShortString, ()> = NameMap::default();
        let b: NameMap<ShortString, ()> = NameMap::default();
        let name = ShortString::from("orders");
        assert_ne!(
            a.hasher().hash_one(&name),
            b.hasher().hash_one(&name),
            "two maps hash a name alike: the hash is not seeded"
        );
    }

    /// What a client could do with an unseeded hash: names that all land
    /// in the same bucket chain. With the broker's maps, 20,000 names built
    /// to collide under the Fx hash cost what any 20,000 names cost.
    #[test]
    fn names_built_to_collide_under_fx_do_not_collide_in_name_maps() {
        // Two-word names (16 bytes) whose Fx state after both words is the
        // same: the second word cancels what the first changed (a slice's
        // hash writes its length first).
        let after_length = 16u64.wrapping_mul(SEED);
        let fx = |first: u64| (after_length.rotate_left(5) ^ first).wrapping_mul(SEED).rotate_left(5);
        let names: Vec<ShortString> = (0..20_000u64)
            .map(|n| {
                let first = n + 1;
                let second = fx(first) ^ fx(1);
                let mut bytes = Vec::with_capacity(16);
                bytes.extend_from_slice(&first.to_le_bytes());
                bytes.extend_from_slice(&second.to_le_bytes());
                ShortString::from_bytes(bytes.into()).expect("16 bytes")
            })
            .collect();
        let fx_hashes: std::collections::HashSet<u64> = names
            .iter()
            .map(|n| BuildHasherDefault::<FxHasher>::default().hash_one(n))
            .collect();
        assert_eq!(fx_hashes.len(), 1, "the names do collide under Fx");
        let map: NameMap<ShortString, ()> = NameMap::default();
        let seeded: std::collections::HashSet<u64> = names.iter().map(|n| map.hasher().hash_one(n)).collect();
        assert!(seeded.len() > 19_990, "only {} distinct hashes", seeded.len());
    }
}
