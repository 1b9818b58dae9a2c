//! An index over free capacity: the GPUs of each pool grouped by what the
//! planner's checks and rankings read of one GPU (its size and its load).
//!
//! Two GPUs of one class take a one-GPU demand the same way (same
//! [`super::fit::fit_gpu`] answer, same score), so the planner checks and
//! scores each class once and takes the class's earliest GPU: what a full
//! scan of the same ranking picks, at a cost that grows with the number of
//! distinct loads, not with the number of GPUs. It is derived data (never
//! serialized) and kept in step by [`super::index::Index`] on every apply.

use super::fit::{GpuCapacity, GpuLoad, GpuSlot};
use std::collections::{BTreeSet, HashMap};

/// What the planner reads of one GPU of a pool.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct GpuClass {
    /// The pool's position in the topology.
    pub pool: u32,
    /// The GPU's size.
    pub capacity: GpuCapacity,
    /// Its load.
    pub load: GpuLoad,
}

impl GpuClass {
    /// The class of `slot` in pool `pool`.
    pub fn of(pool: u32, slot: &GpuSlot) -> GpuClass {
        GpuClass {
            pool,
            capacity: slot.capacity,
            load: slot.load,
        }
    }
}

/// A GPU: (node position in topology order, index on the node).
pub type GpuAt = (u32, u32);

/// GPUs by class.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct FreeIndex {
    classes: HashMap<GpuClass, BTreeSet<GpuAt>>,
}

impl FreeIndex {
    /// Files `gpu` under `class`.
    pub fn insert(&mut self, class: GpuClass, gpu: GpuAt) {
        self.classes.entry(class).or_default().insert(gpu);
    }

    /// Takes `gpu` out of `class` (dropping the class once empty).
    pub fn remove(&mut self, class: &GpuClass, gpu: GpuAt) {
        if let Some(set) = self.classes.get_mut(class) {
            set.remove(&gpu);
            if set.is_empty() {
                self.classes.remove(class);
            }
        }
    }

    /// Moves `gpu` from class `old` to class `new`.
    pub fn set(&mut self, old: &GpuClass, new: GpuClass, gpu: GpuAt) {
        if old != &new {
            self.remove(old, gpu);
            self.insert(new, gpu);
        }
    }

    /// Every class with its GPUs in (node, GPU) order.
    pub fn classes(&self) -> impl Iterator<Item = (&GpuClass, &BTreeSet<GpuAt>)> + '_ {
        self.classes.iter()
    }
}
