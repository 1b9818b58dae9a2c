//! Per-function state of one node, by [`FunctionId`], holding only the ids
//! in use.
//!
//! The serving simulator numbers its functions 0..n; the node agent takes a
//! fresh id for every hosting (a late answer about an earlier one must not
//! be taken for the new one's), so over an agent's life its ids grow
//! without bound while only a few are in use at a time. A vector indexed
//! by id grew with every hosting ever made, and every scan of it (the
//! timer's look at open remaps, host-memory shrinking) with it. Here the
//! entries are kept sorted by id: a look-up is a direct hit where ids are
//! dense from 0 (the simulator), else a binary search over the ids in use.

use super::FunctionId;

/// Values by function id, only for the ids in use, sorted by id.
#[derive(Debug, Clone)]
pub(crate) struct Slots<T> {
    entries: Vec<(u32, T)>,
}

impl<T> Default for Slots<T> {
    fn default() -> Self {
        Self {
            entries: Vec::new(),
        }
    }
}

impl<T> Slots<T> {
    /// Where `id` is (`Ok`) or would go (`Err`).
    fn position(&self, id: FunctionId) -> Result<usize, usize> {
        let id = id.0;
        // Dense ids (0..n, the simulator's): the entry at the id's index.
        if let Some((k, _)) = self.entries.get(id as usize) {
            if *k == id {
                return Ok(id as usize);
            }
        }
        // Fresh ids (the agent's): mostly the newest.
        match self.entries.last() {
            None => return Err(0),
            Some((k, _)) if *k < id => return Err(self.entries.len()),
            _ => {}
        }
        self.entries.binary_search_by_key(&id, |(k, _)| *k)
    }

    /// The value of `id`.
    pub(crate) fn get(&self, id: FunctionId) -> Option<&T> {
        self.position(id).ok().map(|p| &self.entries[p].1)
    }

    /// The value of `id`, mutable.
    pub(crate) fn get_mut(&mut self, id: FunctionId) -> Option<&mut T> {
        match self.position(id) {
            Ok(p) => Some(&mut self.entries[p].1),
            Err(_) => None,
        }
    }

    /// Whether `id` has a value.
    pub(crate) fn contains(&self, id: FunctionId) -> bool {
        self.position(id).is_ok()
    }

    /// Sets the value of `id`, returning the one it replaced.
    pub(crate) fn insert(&mut self, id: FunctionId, value: T) -> Option<T> {
        match self.position(id) {
            Ok(p) => Some(std::mem::replace(&mut self.entries[p].1, value)),
            Err(p) => {
                self.entries.insert(p, (id.0, value));
                None
            }
        }
    }

    /// Removes `id`'s value.
    pub(crate) fn remove(&mut self, id: FunctionId) -> Option<T> {
        self.position(id).ok().map(|p| self.entries.remove(p).1)
    }

    /// The ids in use and their values, by id.
    pub(crate) fn iter(&self) -> impl Iterator<Item = (FunctionId, &T)> {
        self.entries.iter().map(|(k, v)| (FunctionId(*k), v))
    }

    /// The values, by id, mutable.
    pub(crate) fn values_mut(&mut self) -> impl Iterator<Item = &mut T> {
        self.entries.iter_mut().map(|(_, v)| v)
    }

    /// Number of ids in use.
    #[cfg(test)]
    pub(crate) fn len(&self) -> usize {
        self.entries.len()
    }

    /// No id in use.
    pub(crate) fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The slots against a map, on dense ids, on ids that only grow (with
    /// most of them removed again, as an agent's hostings) and on ids in
    /// any order.
    #[test]
    fn slots_behave_as_a_map_in_id_order() {
        let mut rng = crate::rng::Rng::new(7);
        for pattern in 0..3u32 {
            let mut slots: Slots<u64> = Slots::default();
            let mut model = std::collections::BTreeMap::new();
            let mut next = 0u32;
            for step in 0..5_000u64 {
                let id = match pattern {
                    0 => rng.below(64) as u32,
                    1 => {
                        next += u32::from(rng.below(3) == 0);
                        next.saturating_sub(rng.below(8) as u32)
                    }
                    _ => rng.below(1_000_000) as u32,
                };
                let id = FunctionId(id);
                match rng.below(4) {
                    0 | 1 => assert_eq!(slots.insert(id, step), model.insert(id.0, step)),
                    2 => assert_eq!(slots.remove(id), model.remove(&id.0)),
                    _ => {
                        if let Some(v) = slots.get_mut(id) {
                            *v += 1;
                        }
                        if let Some(v) = model.get_mut(&id.0) {
                            *v += 1;
                        }
                    }
                }
                assert_eq!(slots.get(id), model.get(&id.0));
                assert_eq!(slots.contains(id), model.contains_key(&id.0));
                assert_eq!(slots.len(), model.len());
            }
            let listed: Vec<(u32, u64)> = slots.iter().map(|(k, v)| (k.0, *v)).collect();
            let expected: Vec<(u32, u64)> = model.into_iter().collect();
            assert_eq!(listed, expected, "pattern {pattern}");
        }
    }

    /// An agent's pattern: a fresh id per hosting, each gone again soon,
    /// one long-lived function at the first id. What is kept is what is
    /// in use, not every id ever used.
    #[test]
    fn ids_that_only_grow_keep_only_those_in_use() {
        let mut slots: Slots<u8> = Slots::default();
        slots.insert(FunctionId(0), 0);
        for id in 1..100_000 {
            slots.insert(FunctionId(id), 1);
            if id > 3 {
                slots.remove(FunctionId(id - 3));
            }
        }
        assert_eq!(slots.len(), 4);
        assert_eq!(slots.get(FunctionId(0)), Some(&0));
        assert_eq!(slots.get(FunctionId(99_999)), Some(&1));
        assert_eq!(slots.get(FunctionId(5)), None);
    }
}
