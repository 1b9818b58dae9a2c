//! A deployed function: its spec and version, and the specs of earlier
//! versions its outgoing instances still run.

use crate::model::FunctionSpec;
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;

/// One deployed function.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct FunctionRecord {
    /// The spec as deployed or last updated.
    pub spec: FunctionSpec,
    /// 1 on deploy, +1 on every update.
    pub version: u64,
    /// When it was deployed (Unix ms).
    pub deployed_at: u64,
    /// When it was last updated (Unix ms).
    pub updated_at: u64,
    /// The specs of earlier versions that outgoing instances (placed
    /// before a reshaping update, not yet replaced) still run, by version;
    /// an entry goes with the last instance of its version.
    #[serde(default)]
    pub older: BTreeMap<u64, FunctionSpec>,
}

impl FunctionRecord {
    /// The bytes it counts against its tenant's
    /// [`crate::bounds::MAX_TENANT_SPEC_BYTES`]: its spec and every kept
    /// earlier one ([`crate::bounds::spec_bytes`]).
    pub fn stored_bytes(&self) -> u64 {
        self.older
            .values()
            .map(crate::bounds::spec_bytes)
            .fold(crate::bounds::spec_bytes(&self.spec), u64::saturating_add)
    }

    /// The spec an instance of `version` runs: the current one, or an
    /// earlier version's while instances of it remain (`None` otherwise).
    pub fn spec_for(&self, version: u64) -> Option<&FunctionSpec> {
        if version == self.version {
            Some(&self.spec)
        } else {
            self.older.get(&version)
        }
    }
}
