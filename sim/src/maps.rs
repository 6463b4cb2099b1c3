//! A generic in-memory BPF map with the kernel's semantics, at the byte level.
//!
//! The simulator must fail exactly where a kernel fails, with the same errno
//! and after the same number of batch elements, or the machine's recovery
//! paths would be tested against a kernel that does not exist. So this module
//! follows the syscall side of `kernel/bpf/{syscall,hashtab,arraymap,map_in_map}.c`:
//!
//! * update flags: `BPF_ANY`, `BPF_NOEXIST` (`EEXIST` on a present key),
//!   `BPF_EXIST` (`ENOENT` on a missing key), anything else `EINVAL`;
//! * HASH: a new key in a full map is `E2BIG`; replacing a present key works
//!   even when full; a missing key on delete or lookup is `ENOENT`;
//! * ARRAY: keys are `u32` indices; an index `>= max_entries` is `E2BIG` on
//!   update and `ENOENT` on lookup; every slot exists, so `BPF_NOEXIST` is
//!   `EEXIST`; delete is `EINVAL`; a slot never written reads as zeros;
//! * batch update (`generic_map_update_batch`): `elem_flags` other than 0 is
//!   `EINVAL` before anything is done (`BPF_F_LOCK` needs a spin lock these
//!   maps never have); elements are applied in order with `BPF_ANY` and the
//!   call stops at the first failing one, the earlier ones staying;
//! * batch delete (`generic_map_delete_batch`): stops at the first failure
//!   (`ENOENT` for a missing key); ARRAY has no batch delete (`ENOTSUPP`);
//! * HASH_OF_MAPS: the value written from user space names an inner map (here
//!   by its id, the kernel takes an fd); an unknown map is `EBADF`, a map whose
//!   type, key size, value size or max_entries differ from the outer map's
//!   template is `EINVAL`. The outer entry holds a reference; an inner map that
//!   no outer entry references and its creator has closed is freed.
//!
//! Wrong key or value sizes are `EINVAL` here. The kernel copies exactly
//! `key_size` bytes from user memory and cannot see a wrong size, so a wrong
//! size is always a caller bug, and the simulator reports it instead of
//! reading past or short of a buffer.

use std::collections::BTreeMap;

use eim_machine::ops::Errno;

/// Update flag: create or replace.
pub const BPF_ANY: u64 = 0;
/// Update flag: create only; `EEXIST` if the key is present.
pub const BPF_NOEXIST: u64 = 1;
/// Update flag: replace only; `ENOENT` if the key is missing.
pub const BPF_EXIST: u64 = 2;
/// Update flag: take the value's spin lock. None of the simulated maps has
/// one, so the kernel rejects it with `EINVAL`, and so does the simulator.
pub const BPF_F_LOCK: u64 = 4;

/// Longest hash key the kernel accepts (`MAX_BPF_STACK`).
const MAX_HASH_KEY: u32 = 512;

/// The map types eim uses.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum MapType {
    /// `BPF_MAP_TYPE_HASH`
    Hash,
    /// `BPF_MAP_TYPE_ARRAY`
    Array,
    /// `BPF_MAP_TYPE_HASH_OF_MAPS`: values are inner maps.
    HashOfMaps,
}

/// What a map is created with. For [`MapType::HashOfMaps`], `inner` is the
/// template every inserted inner map must match.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct MapSpec {
    pub kind: MapType,
    pub key_size: u32,
    pub value_size: u32,
    pub max_entries: u32,
    pub inner: Option<Box<MapSpec>>,
}

impl MapSpec {
    pub fn hash(key_size: u32, value_size: u32, max_entries: u32) -> Self {
        Self {
            kind: MapType::Hash,
            key_size,
            value_size,
            max_entries,
            inner: None,
        }
    }

    pub fn array(value_size: u32, max_entries: u32) -> Self {
        Self {
            kind: MapType::Array,
            key_size: 4,
            value_size,
            max_entries,
            inner: None,
        }
    }

    /// A HASH_OF_MAPS; the value (an inner map reference) is 4 bytes.
    pub fn hash_of_maps(key_size: u32, max_entries: u32, inner: MapSpec) -> Self {
        Self {
            kind: MapType::HashOfMaps,
            key_size,
            value_size: 4,
            max_entries,
            inner: Some(Box::new(inner)),
        }
    }

    /// The kernel's `bpf_map_meta_equal`: what an inner map must share with
    /// the template (there are no map flags in the simulator).
    pub fn meta_equal(&self, other: &MapSpec) -> bool {
        self.kind == other.kind
            && self.key_size == other.key_size
            && self.value_size == other.value_size
            && self.max_entries == other.max_entries
    }

    /// The checks of the map-create syscall for these types.
    fn validate(&self) -> Result<(), Errno> {
        if self.key_size == 0 || self.value_size == 0 || self.max_entries == 0 {
            return Err(Errno::EINVAL);
        }
        match (self.kind, &self.inner) {
            (MapType::Array, None) if self.key_size == 4 => Ok(()),
            (MapType::Hash, None) if self.key_size <= MAX_HASH_KEY => Ok(()),
            (MapType::Hash, None) => Err(Errno::E2BIG),
            // Map-in-map nests one level only, and the value is a u32 reference.
            (MapType::HashOfMaps, Some(inner))
                if self.value_size == 4
                    && self.key_size <= MAX_HASH_KEY
                    && inner.kind != MapType::HashOfMaps
                    && inner.validate().is_ok() =>
            {
                Ok(())
            }
            _ => Err(Errno::EINVAL),
        }
    }
}

/// The id of a map in a [`MapRegistry`] (the kernel's map id; the
/// simulator uses it where user space would pass an fd).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct MapId(pub u32);

/// A batch call that stopped: the errno and how many elements were
/// processed (are in effect) before it, the kernel's `batch.count` out value.
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
#[error("{errno} after {processed} elements")]
pub struct BatchError {
    pub errno: Errno,
    pub processed: usize,
}

impl BatchError {
    fn new(errno: Errno, processed: usize) -> Self {
        Self { errno, processed }
    }
}

/// Where a map keeps its contents.
#[derive(Clone, Debug)]
enum Store {
    /// HASH and HASH_OF_MAPS: ordered so that iteration and clones are
    /// deterministic.
    Hash(BTreeMap<Vec<u8>, Vec<u8>>),
    /// ARRAY: the bytes of slots `0..n` for the highest slot ever written
    /// (`n * value_size` bytes), the rest implicitly zero. Inner delta
    /// arrays are filled from slot 0, so this is as small as the table;
    /// `zero` is one zeroed value to lend out for unwritten slots.
    Array { bytes: Vec<u8>, zero: Vec<u8> },
}

/// One map: its spec and contents.
#[derive(Clone, Debug)]
pub struct BpfMap {
    spec: MapSpec,
    store: Store,
}

impl PartialEq for BpfMap {
    /// Same spec and same contents. For arrays an unwritten slot equals a
    /// slot written with zeros, as a reader cannot tell them apart.
    fn eq(&self, other: &Self) -> bool {
        if self.spec != other.spec {
            return false;
        }
        match (&self.store, &other.store) {
            (Store::Hash(a), Store::Hash(b)) => a == b,
            (Store::Array { bytes: a, .. }, Store::Array { bytes: b, .. }) => {
                let (short, long) = if a.len() <= b.len() { (a, b) } else { (b, a) };
                long.starts_with(short) && long[short.len()..].iter().all(|&x| x == 0)
            }
            _ => false,
        }
    }
}

impl Eq for BpfMap {}

impl BpfMap {
    fn new(spec: MapSpec) -> Self {
        let store = match spec.kind {
            MapType::Array => Store::Array {
                bytes: Vec::new(),
                zero: vec![0; spec.value_size as usize],
            },
            MapType::Hash | MapType::HashOfMaps => Store::Hash(BTreeMap::new()),
        };
        Self { spec, store }
    }

    pub fn spec(&self) -> &MapSpec {
        &self.spec
    }

    /// Entries present: for a hash the keys, for an array every slot.
    pub fn len(&self) -> usize {
        match &self.store {
            Store::Hash(m) => m.len(),
            Store::Array { .. } => self.spec.max_entries as usize,
        }
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The value stored under `key`, as the lookup syscall (and a BPF
    /// program) sees it. A HASH_OF_MAPS value is the inner map's id.
    pub fn lookup(&self, key: &[u8]) -> Result<&[u8], Errno> {
        if key.len() != self.spec.key_size as usize {
            return Err(Errno::EINVAL);
        }
        match &self.store {
            Store::Hash(m) => m.get(key).map(Vec::as_slice).ok_or(Errno::ENOENT),
            Store::Array { .. } => {
                let index = array_index(key).ok_or(Errno::EINVAL)?;
                self.slot(index).ok_or(Errno::ENOENT)
            }
        }
    }

    /// Array slot `index` (zeros if never written); `None` past the end or
    /// for a hash map.
    pub fn slot(&self, index: u32) -> Option<&[u8]> {
        let Store::Array { bytes, zero } = &self.store else {
            return None;
        };
        if index >= self.spec.max_entries {
            return None;
        }
        let size = zero.len();
        let at = index as usize * size;
        Some(bytes.get(at..at + size).unwrap_or(zero))
    }

    /// For arrays, the number of leading slots outside of which every slot
    /// reads as zero (a bound, not a count of written slots).
    pub fn array_extent(&self) -> usize {
        match &self.store {
            Store::Array { bytes, zero } => {
                let size = zero.len().max(1);
                let last = bytes
                    .chunks(size)
                    .rposition(|slot| slot.iter().any(|&b| b != 0));
                last.map_or(0, |i| i + 1)
            }
            Store::Hash(_) => 0,
        }
    }

    /// The hash entries in key-byte order (empty for an array).
    pub fn entries(&self) -> impl Iterator<Item = (&[u8], &[u8])> {
        let map = match &self.store {
            Store::Hash(m) => Some(m),
            Store::Array { .. } => None,
        };
        map.into_iter()
            .flat_map(|m| m.iter().map(|(k, v)| (k.as_slice(), v.as_slice())))
    }

    /// The update syscall on the map's own storage (no map-in-map
    /// reference handling: [`MapRegistry::update`] does that). Returns the
    /// value it replaced, so a map-in-map can drop that reference.
    fn put(&mut self, key: &[u8], value: &[u8], flags: u64) -> Result<Option<Vec<u8>>, Errno> {
        if flags > BPF_EXIST
            || key.len() != self.spec.key_size as usize
            || value.len() != self.spec.value_size as usize
        {
            return Err(Errno::EINVAL);
        }
        let max_entries = self.spec.max_entries;
        match &mut self.store {
            Store::Hash(m) => {
                let present = m.contains_key(key);
                match (flags, present) {
                    (BPF_NOEXIST, true) => return Err(Errno::EEXIST),
                    (BPF_EXIST, false) => return Err(Errno::ENOENT),
                    _ => {}
                }
                if !present && m.len() >= max_entries as usize {
                    return Err(Errno::E2BIG);
                }
                Ok(m.insert(key.to_vec(), value.to_vec()))
            }
            Store::Array { bytes, zero } => {
                let index = array_index(key).ok_or(Errno::EINVAL)?;
                if index >= max_entries {
                    return Err(Errno::E2BIG);
                }
                if flags == BPF_NOEXIST {
                    return Err(Errno::EEXIST);
                }
                let size = zero.len();
                let at = index as usize * size;
                if bytes.len() < at + size {
                    // Bounded by max_entries * value_size.
                    bytes.resize(at + size, 0);
                }
                let old = bytes[at..at + size].to_vec();
                bytes[at..at + size].copy_from_slice(value);
                Ok(Some(old))
            }
        }
    }

    /// The delete syscall on the map's own storage; returns the removed value.
    fn remove(&mut self, key: &[u8]) -> Result<Vec<u8>, Errno> {
        if key.len() != self.spec.key_size as usize {
            return Err(Errno::EINVAL);
        }
        match &mut self.store {
            Store::Hash(m) => m.remove(key).ok_or(Errno::ENOENT),
            Store::Array { .. } => Err(Errno::EINVAL),
        }
    }
}

fn array_index(key: &[u8]) -> Option<u32> {
    Some(u32::from_le_bytes(key.try_into().ok()?))
}

fn id_of(value: &[u8]) -> Option<MapId> {
    Some(MapId(u32::from_le_bytes(value.try_into().ok()?)))
}

/// A map and who keeps it alive.
#[derive(Clone, Debug)]
struct Slot {
    map: BpfMap,
    /// The creator still holds its fd.
    held: bool,
    /// Outer-map entries that reference it.
    refs: u32,
}

/// All maps of a simulated kernel, by id, with the map-in-map reference
/// counting that decides when an inner map is freed.
#[derive(Clone, Debug, Default)]
pub struct MapRegistry {
    maps: BTreeMap<MapId, Slot>,
    next_id: u32,
}

impl MapRegistry {
    pub fn new() -> Self {
        Self::default()
    }

    /// Creates a map (the creator holds it until [`MapRegistry::close`]).
    pub fn create(&mut self, spec: MapSpec) -> Result<MapId, Errno> {
        spec.validate()?;
        // Ids are never reused, like the kernel's idr (modulo wrap-around,
        // which a simulation never reaches).
        self.next_id = self.next_id.checked_add(1).ok_or(Errno::ENOSPC)?;
        let id = MapId(self.next_id);
        self.maps.insert(
            id,
            Slot {
                map: BpfMap::new(spec),
                held: true,
                refs: 0,
            },
        );
        Ok(id)
    }

    /// The creator closes its fd; the map is freed unless an outer map
    /// references it. `EBADF` if the creator no longer holds it.
    pub fn close(&mut self, id: MapId) -> Result<(), Errno> {
        let slot = self.maps.get_mut(&id).ok_or(Errno::EBADF)?;
        if !slot.held {
            return Err(Errno::EBADF);
        }
        slot.held = false;
        self.collect(id);
        Ok(())
    }

    /// The map, if it is alive.
    pub fn get(&self, id: MapId) -> Option<&BpfMap> {
        self.maps.get(&id).map(|s| &s.map)
    }

    /// Maps alive (held by their creator or referenced by an outer map).
    pub fn live(&self) -> usize {
        self.maps.len()
    }

    /// What a BPF program's lookup in a map-in-map returns: the inner map.
    pub fn inner(&self, outer: MapId, key: &[u8]) -> Option<&BpfMap> {
        let value = self.get(outer)?.lookup(key).ok()?;
        self.get(id_of(value)?)
    }

    pub fn lookup(&self, id: MapId, key: &[u8]) -> Result<&[u8], Errno> {
        self.get(id).ok_or(Errno::EBADF)?.lookup(key)
    }

    /// The update syscall. For a HASH_OF_MAPS `value` is the inner map's id
    /// (u32, little endian); the entry takes a reference to it, and a
    /// replaced entry drops its reference.
    pub fn update(&mut self, id: MapId, key: &[u8], value: &[u8], flags: u64) -> Result<(), Errno> {
        let slot = self.maps.get(&id).ok_or(Errno::EBADF)?;
        if slot.map.spec.kind != MapType::HashOfMaps {
            let slot = self.maps.get_mut(&id).ok_or(Errno::EBADF)?;
            return slot.map.put(key, value, flags).map(drop);
        }
        // map_fd_get_ptr: resolve and check the inner map before the update.
        let inner_id = id_of(value).ok_or(Errno::EINVAL)?;
        let inner = self.maps.get(&inner_id).ok_or(Errno::EBADF)?;
        let template = slot.map.spec.inner.as_deref().ok_or(Errno::EINVAL)?;
        if !template.meta_equal(&inner.map.spec) {
            return Err(Errno::EINVAL);
        }
        let slot = self.maps.get_mut(&id).ok_or(Errno::EBADF)?;
        let replaced = slot.map.put(key, value, flags)?;
        if let Some(inner) = self.maps.get_mut(&inner_id) {
            inner.refs = inner.refs.saturating_add(1);
        }
        if let Some(old) = replaced.as_deref().and_then(id_of) {
            self.unref(old);
        }
        Ok(())
    }

    /// The delete syscall. Deleting a HASH_OF_MAPS entry drops its
    /// reference to the inner map.
    pub fn delete(&mut self, id: MapId, key: &[u8]) -> Result<(), Errno> {
        let slot = self.maps.get_mut(&id).ok_or(Errno::EBADF)?;
        let is_outer = slot.map.spec.kind == MapType::HashOfMaps;
        let removed = slot.map.remove(key)?;
        if is_outer {
            if let Some(inner) = id_of(&removed) {
                self.unref(inner);
            }
        }
        Ok(())
    }

    /// `BPF_MAP_UPDATE_BATCH`: `count` keys and values laid end to end.
    /// A buffer whose length is not `count` elements is `EINVAL` before
    /// anything is done (the kernel would fault part way; see the module doc).
    pub fn update_batch(
        &mut self,
        id: MapId,
        keys: &[u8],
        values: &[u8],
        count: usize,
        elem_flags: u64,
    ) -> Result<(), BatchError> {
        let spec = &self.get(id).ok_or(BatchError::new(Errno::EBADF, 0))?.spec;
        let (ks, vs) = (spec.key_size as usize, spec.value_size as usize);
        // elem_flags may only be BPF_F_LOCK, which needs a spin lock.
        if elem_flags != 0
            || Some(keys.len()) != count.checked_mul(ks)
            || Some(values.len()) != count.checked_mul(vs)
        {
            return Err(BatchError::new(Errno::EINVAL, 0));
        }
        for (done, (key, value)) in keys
            .chunks_exact(ks)
            .zip(values.chunks_exact(vs))
            .enumerate()
        {
            self.update(id, key, value, BPF_ANY)
                .map_err(|errno| BatchError::new(errno, done))?;
        }
        Ok(())
    }

    /// `BPF_MAP_DELETE_BATCH`: stops at the first key that fails (`ENOENT`
    /// for a missing one). Arrays have no batch delete (`ENOTSUPP`).
    pub fn delete_batch(
        &mut self,
        id: MapId,
        keys: &[u8],
        count: usize,
        elem_flags: u64,
    ) -> Result<(), BatchError> {
        let spec = &self.get(id).ok_or(BatchError::new(Errno::EBADF, 0))?.spec;
        if spec.kind == MapType::Array {
            return Err(BatchError::new(Errno::ENOTSUPP, 0));
        }
        let ks = spec.key_size as usize;
        if elem_flags != 0 || Some(keys.len()) != count.checked_mul(ks) {
            return Err(BatchError::new(Errno::EINVAL, 0));
        }
        for (done, key) in keys.chunks_exact(ks).enumerate() {
            self.delete(id, key)
                .map_err(|errno| BatchError::new(errno, done))?;
        }
        Ok(())
    }

    /// Drops one outer reference to `id` and frees it if nothing keeps it.
    fn unref(&mut self, id: MapId) {
        if let Some(slot) = self.maps.get_mut(&id) {
            slot.refs = slot.refs.saturating_sub(1);
        }
        self.collect(id);
    }

    /// Frees `id` if it is neither held nor referenced; a freed outer map
    /// drops its references in turn. Maps nest one level only, so the work
    /// list holds at most one outer map's entries.
    fn collect(&mut self, id: MapId) {
        let mut work = vec![id];
        // Each round frees at most one map, and there are finitely many.
        let mut budget = self.maps.len();
        while let Some(id) = work.pop() {
            if budget == 0 {
                break;
            }
            let Some(slot) = self.maps.get(&id) else {
                continue;
            };
            if slot.held || slot.refs > 0 {
                continue;
            }
            let Some(freed) = self.maps.remove(&id) else {
                continue;
            };
            budget -= 1;
            if freed.map.spec.kind != MapType::HashOfMaps {
                continue;
            }
            for (_, value) in freed.map.entries() {
                let Some(inner) = id_of(value) else {
                    continue;
                };
                if let Some(slot) = self.maps.get_mut(&inner) {
                    slot.refs = slot.refs.saturating_sub(1);
                    work.push(inner);
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn k8(v: u64) -> Vec<u8> {
        v.to_le_bytes().to_vec()
    }
    fn k4(v: u32) -> Vec<u8> {
        v.to_le_bytes().to_vec()
    }

    fn reg_with(spec: MapSpec) -> (MapRegistry, MapId) {
        let mut reg = MapRegistry::new();
        let id = reg.create(spec).expect("valid spec");
        (reg, id)
    }

    #[test]
    fn create_rejects_what_the_kernel_rejects() {
        let mut reg = MapRegistry::new();
        assert_eq!(reg.create(MapSpec::hash(0, 8, 1)), Err(Errno::EINVAL));
        assert_eq!(reg.create(MapSpec::hash(8, 0, 1)), Err(Errno::EINVAL));
        assert_eq!(reg.create(MapSpec::hash(8, 8, 0)), Err(Errno::EINVAL));
        assert_eq!(reg.create(MapSpec::hash(513, 8, 1)), Err(Errno::E2BIG));
        let mut bad_array = MapSpec::array(4, 4);
        bad_array.key_size = 8;
        assert_eq!(reg.create(bad_array), Err(Errno::EINVAL));
        let nested = MapSpec::hash_of_maps(8, 4, MapSpec::hash_of_maps(8, 4, MapSpec::array(4, 4)));
        assert_eq!(reg.create(nested), Err(Errno::EINVAL));
        let mut no_template = MapSpec::hash_of_maps(8, 4, MapSpec::array(4, 4));
        no_template.inner = None;
        assert_eq!(reg.create(no_template), Err(Errno::EINVAL));
        assert_eq!(reg.live(), 0);
    }

    #[test]
    fn hash_flags_and_capacity() {
        let (mut reg, id) = reg_with(MapSpec::hash(8, 4, 2));
        assert_eq!(
            reg.update(id, &k8(1), &k4(10), BPF_EXIST),
            Err(Errno::ENOENT)
        );
        assert_eq!(reg.update(id, &k8(1), &k4(10), BPF_NOEXIST), Ok(()));
        assert_eq!(
            reg.update(id, &k8(1), &k4(11), BPF_NOEXIST),
            Err(Errno::EEXIST)
        );
        assert_eq!(reg.lookup(id, &k8(1)), Ok(&k4(10)[..]));
        assert_eq!(reg.update(id, &k8(1), &k4(11), BPF_EXIST), Ok(()));
        assert_eq!(reg.update(id, &k8(2), &k4(20), BPF_ANY), Ok(()));
        // Full: a new key is E2BIG, a present one can still be replaced.
        assert_eq!(reg.update(id, &k8(3), &k4(30), BPF_ANY), Err(Errno::E2BIG));
        assert_eq!(reg.update(id, &k8(2), &k4(21), BPF_ANY), Ok(()));
        assert_eq!(reg.lookup(id, &k8(2)), Ok(&k4(21)[..]));
        assert_eq!(reg.lookup(id, &k8(3)), Err(Errno::ENOENT));
        assert_eq!(reg.delete(id, &k8(3)), Err(Errno::ENOENT));
        assert_eq!(reg.delete(id, &k8(2)), Ok(()));
        assert_eq!(reg.update(id, &k8(3), &k4(30), BPF_ANY), Ok(()));
    }

    #[test]
    fn bad_flags_and_sizes_are_einval() {
        let (mut reg, id) = reg_with(MapSpec::hash(8, 4, 2));
        assert_eq!(reg.update(id, &k8(1), &k4(1), 3), Err(Errno::EINVAL));
        assert_eq!(
            reg.update(id, &k8(1), &k4(1), BPF_F_LOCK),
            Err(Errno::EINVAL)
        );
        assert_eq!(reg.update(id, &k4(1), &k4(1), BPF_ANY), Err(Errno::EINVAL));
        assert_eq!(reg.update(id, &k8(1), &k8(1), BPF_ANY), Err(Errno::EINVAL));
        assert_eq!(reg.lookup(id, &k4(1)), Err(Errno::EINVAL));
        assert_eq!(reg.delete(id, &k4(1)), Err(Errno::EINVAL));
        assert_eq!(reg.get(id).map(BpfMap::len), Some(0));
        assert_eq!(
            reg.update(MapId(99), &k8(1), &k4(1), BPF_ANY),
            Err(Errno::EBADF)
        );
    }

    #[test]
    fn array_semantics() {
        let (mut reg, id) = reg_with(MapSpec::array(4, 3));
        // Every slot exists and reads as zeros until written.
        assert_eq!(reg.lookup(id, &k4(2)), Ok(&[0u8; 4][..]));
        assert_eq!(reg.lookup(id, &k4(3)), Err(Errno::ENOENT));
        assert_eq!(reg.update(id, &k4(3), &k4(1), BPF_ANY), Err(Errno::E2BIG));
        assert_eq!(
            reg.update(id, &k4(1), &k4(1), BPF_NOEXIST),
            Err(Errno::EEXIST)
        );
        assert_eq!(reg.update(id, &k4(1), &k4(7), BPF_EXIST), Ok(()));
        assert_eq!(reg.lookup(id, &k4(1)), Ok(&k4(7)[..]));
        assert_eq!(reg.delete(id, &k4(1)), Err(Errno::EINVAL));
        // E2BIG is checked before the NOEXIST rule, as in array_map_update_elem.
        assert_eq!(
            reg.update(id, &k4(9), &k4(1), BPF_NOEXIST),
            Err(Errno::E2BIG)
        );
        let map = reg.get(id).expect("alive");
        assert_eq!(map.len(), 3);
        assert_eq!(map.array_extent(), 2);
    }

    #[test]
    fn arrays_compare_by_what_a_reader_sees() {
        let (mut reg, a) = reg_with(MapSpec::array(4, 8));
        let b = reg.create(MapSpec::array(4, 8)).expect("valid");
        assert_eq!(reg.update(a, &k4(5), &k4(0), BPF_ANY), Ok(()));
        assert_eq!(reg.get(a), reg.get(b), "a zero write is no write");
        assert_eq!(reg.update(b, &k4(1), &k4(3), BPF_ANY), Ok(()));
        assert_ne!(reg.get(a), reg.get(b));
        assert_eq!(reg.update(a, &k4(1), &k4(3), BPF_ANY), Ok(()));
        assert_eq!(reg.get(a), reg.get(b));
    }

    fn flat(keys: &[u64]) -> Vec<u8> {
        keys.iter().flat_map(|k| k.to_le_bytes()).collect()
    }
    fn flat4(values: &[u32]) -> Vec<u8> {
        values.iter().flat_map(|v| v.to_le_bytes()).collect()
    }

    #[test]
    fn update_batch_stops_at_the_first_failure_and_keeps_the_rest() {
        let (mut reg, id) = reg_with(MapSpec::hash(8, 4, 3));
        let keys = flat(&[1, 2, 3, 4, 5]);
        let values = flat4(&[1, 2, 3, 4, 5]);
        assert_eq!(
            reg.update_batch(id, &keys, &values, 5, 0),
            Err(BatchError::new(Errno::E2BIG, 3))
        );
        assert_eq!(reg.get(id).map(BpfMap::len), Some(3));
        assert_eq!(reg.lookup(id, &k8(3)), Ok(&k4(3)[..]));
        // The batch writes with BPF_ANY: present keys are overwritten.
        let again = flat4(&[9, 9, 9]);
        assert_eq!(
            reg.update_batch(id, &flat(&[1, 2, 3]), &again, 3, 0),
            Ok(())
        );
        assert_eq!(reg.lookup(id, &k8(1)), Ok(&k4(9)[..]));
    }

    #[test]
    fn update_batch_elem_flags_other_than_zero_are_einval_with_nothing_done() {
        let (mut reg, id) = reg_with(MapSpec::hash(8, 4, 3));
        for flags in [BPF_NOEXIST, BPF_EXIST, BPF_F_LOCK, 8] {
            assert_eq!(
                reg.update_batch(id, &flat(&[1]), &flat4(&[1]), 1, flags),
                Err(BatchError::new(Errno::EINVAL, 0))
            );
        }
        assert_eq!(
            reg.update_batch(id, &flat(&[1, 2]), &flat4(&[1]), 2, 0),
            Err(BatchError::new(Errno::EINVAL, 0)),
            "short value buffer"
        );
        assert_eq!(reg.get(id).map(BpfMap::len), Some(0));
        assert_eq!(reg.update_batch(id, &[], &[], 0, 0), Ok(()));
    }

    #[test]
    fn array_batches() {
        let (mut reg, id) = reg_with(MapSpec::array(4, 2));
        assert_eq!(
            reg.update_batch(id, &flat4(&[0, 1, 2]), &flat4(&[5, 6, 7]), 3, 0),
            Err(BatchError::new(Errno::E2BIG, 2))
        );
        assert_eq!(reg.lookup(id, &k4(1)), Ok(&k4(6)[..]));
        assert_eq!(
            reg.delete_batch(id, &flat4(&[0]), 1, 0),
            Err(BatchError::new(Errno::ENOTSUPP, 0))
        );
    }

    #[test]
    fn delete_batch_stops_at_the_first_missing_key() {
        let (mut reg, id) = reg_with(MapSpec::hash(8, 4, 8));
        let keys = flat(&[1, 2, 3]);
        assert_eq!(
            reg.update_batch(id, &keys, &flat4(&[1, 2, 3]), 3, 0),
            Ok(())
        );
        assert_eq!(
            reg.delete_batch(id, &flat(&[1, 7, 2]), 3, 0),
            Err(BatchError::new(Errno::ENOENT, 1))
        );
        assert_eq!(reg.lookup(id, &k8(1)), Err(Errno::ENOENT));
        assert_eq!(reg.lookup(id, &k8(2)), Ok(&k4(2)[..]));
        assert_eq!(
            reg.delete_batch(id, &flat(&[2]), 1, BPF_F_LOCK),
            Err(BatchError::new(Errno::EINVAL, 0))
        );
        assert_eq!(reg.delete_batch(id, &flat(&[2, 3]), 2, 0), Ok(()));
        assert_eq!(reg.get(id).map(BpfMap::len), Some(0));
    }

    fn outer_and_inner(max_outer: u32) -> (MapRegistry, MapId, MapId) {
        let (mut reg, outer) = reg_with(MapSpec::hash_of_maps(8, max_outer, MapSpec::array(4, 4)));
        let inner = reg.create(MapSpec::array(4, 4)).expect("valid");
        (reg, outer, inner)
    }

    #[test]
    fn map_in_map_checks_the_template() {
        let (mut reg, outer, _) = outer_and_inner(4);
        for wrong in [
            MapSpec::array(4, 8),
            MapSpec::array(8, 4),
            MapSpec::hash(4, 4, 4),
        ] {
            let id = reg.create(wrong).expect("valid");
            assert_eq!(
                reg.update(outer, &k8(1), &k4(id.0), BPF_ANY),
                Err(Errno::EINVAL)
            );
            assert_eq!(reg.close(id), Ok(()));
        }
        assert_eq!(
            reg.update(outer, &k8(1), &k4(999), BPF_ANY),
            Err(Errno::EBADF)
        );
        assert_eq!(reg.get(outer).map(BpfMap::len), Some(0));
    }

    #[test]
    fn inner_map_lives_while_referenced_or_held() {
        let (mut reg, outer, inner) = outer_and_inner(4);
        assert_eq!(reg.update(inner, &k4(0), &k4(42), BPF_ANY), Ok(()));
        assert_eq!(reg.update(outer, &k8(7), &k4(inner.0), BPF_NOEXIST), Ok(()));
        assert_eq!(reg.close(inner), Ok(()));
        assert_eq!(reg.close(inner), Err(Errno::EBADF), "closed twice");
        assert_eq!(reg.live(), 2, "the outer entry keeps it");
        let seen = reg.inner(outer, &k8(7)).and_then(|m| m.slot(0));
        assert_eq!(seen, Some(&k4(42)[..]));
        assert_eq!(reg.delete(outer, &k8(7)), Ok(()));
        assert_eq!(reg.live(), 1, "freed with the last reference");
        assert!(reg.get(inner).is_none());
        assert_eq!(reg.delete(outer, &k8(7)), Err(Errno::ENOENT));
    }

    #[test]
    fn a_failed_insert_takes_no_reference() {
        let (mut reg, outer, inner) = outer_and_inner(1);
        let other = reg.create(MapSpec::array(4, 4)).expect("valid");
        assert_eq!(reg.update(outer, &k8(1), &k4(inner.0), BPF_NOEXIST), Ok(()));
        assert_eq!(
            reg.update(outer, &k8(1), &k4(other.0), BPF_NOEXIST),
            Err(Errno::EEXIST)
        );
        assert_eq!(
            reg.update(outer, &k8(2), &k4(other.0), BPF_ANY),
            Err(Errno::E2BIG)
        );
        assert_eq!(reg.close(other), Ok(()));
        assert!(reg.get(other).is_none(), "no outer entry kept it");
        assert_eq!(reg.close(inner), Ok(()));
        assert!(reg.get(inner).is_some());
    }

    #[test]
    fn replacing_an_outer_entry_drops_the_old_inner_map() {
        let (mut reg, outer, first) = outer_and_inner(4);
        let second = reg.create(MapSpec::array(4, 4)).expect("valid");
        assert_eq!(reg.update(outer, &k8(1), &k4(first.0), BPF_ANY), Ok(()));
        assert_eq!(reg.close(first), Ok(()));
        assert_eq!(reg.update(outer, &k8(1), &k4(second.0), BPF_ANY), Ok(()));
        assert!(reg.get(first).is_none());
        assert_eq!(reg.close(second), Ok(()));
        assert!(reg.get(second).is_some());
    }

    #[test]
    fn closing_an_outer_map_frees_its_inner_maps() {
        let (mut reg, outer, inner) = outer_and_inner(4);
        assert_eq!(reg.update(outer, &k8(1), &k4(inner.0), BPF_ANY), Ok(()));
        assert_eq!(reg.update(outer, &k8(2), &k4(inner.0), BPF_ANY), Ok(()));
        assert_eq!(reg.close(inner), Ok(()));
        assert_eq!(reg.delete(outer, &k8(1)), Ok(()));
        assert!(reg.get(inner).is_some(), "still referenced by key 2");
        assert_eq!(reg.close(outer), Ok(()));
        assert_eq!(reg.live(), 0);
    }

    #[test]
    fn outer_batches_count_references() {
        let (mut reg, outer, inner) = outer_and_inner(4);
        assert_eq!(reg.close(inner), Ok(()));
        assert!(reg.get(inner).is_none());
        let inner = reg.create(MapSpec::array(4, 4)).expect("valid");
        assert_eq!(
            reg.update_batch(outer, &flat(&[1, 2]), &flat4(&[inner.0, 12345]), 2, 0),
            Err(BatchError::new(Errno::EBADF, 1))
        );
        assert_eq!(reg.close(inner), Ok(()));
        assert_eq!(
            reg.delete_batch(outer, &flat(&[1, 2]), 2, 0),
            Err(BatchError::new(Errno::ENOENT, 1))
        );
        assert!(reg.get(inner).is_none());
    }
}
