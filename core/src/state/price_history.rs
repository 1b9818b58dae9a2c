//! Every price list the region has used, with the time it took effect, so
//! usage is priced with the list in force when it ended.

use crate::config::PriceList;
use serde::{Deserialize, Serialize};

/// One price list and when it took effect.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct PriceEpoch {
    /// When it took effect (Unix ms); never decreasing along the history.
    pub effective_from_ms: u64,
    /// The list.
    pub list: PriceList,
}

/// The price lists in order; an epoch is an index into it.
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
pub struct PriceHistory {
    epochs: Vec<PriceEpoch>,
}

impl PriceHistory {
    /// All epochs, oldest first.
    pub fn epochs(&self) -> &[PriceEpoch] {
        &self.epochs
    }

    /// The list in force now (the newest), if any.
    pub fn current(&self) -> Option<&PriceList> {
        self.epochs.last().map(|e| &e.list)
    }

    /// The epoch in force at `at_ms`: the newest one that took effect at or
    /// before it (the first one for earlier times). `None` when empty.
    pub fn epoch_at(&self, at_ms: u64) -> Option<u32> {
        if self.epochs.is_empty() {
            return None;
        }
        let n = self
            .epochs
            .partition_point(|e| e.effective_from_ms <= at_ms);
        Some(n.saturating_sub(1) as u32)
    }

    /// The list of `epoch`.
    pub fn list(&self, epoch: u32) -> Option<&PriceList> {
        self.epochs.get(epoch as usize).map(|e| &e.list)
    }

    /// Makes `list` take effect at `now_ms` (or at the newest epoch's start
    /// if that is later); returns its epoch.
    pub(crate) fn push(&mut self, now_ms: u64, list: PriceList) -> (u32, u64) {
        let from = self
            .epochs
            .last()
            .map_or(now_ms, |e| e.effective_from_ms.max(now_ms));
        self.epochs.push(PriceEpoch {
            effective_from_ms: from,
            list,
        });
        (self.epochs.len().saturating_sub(1) as u32, from)
    }
}
