//! A deployed function: its spec and version.

use crate::model::FunctionSpec;
use serde::{Deserialize, Serialize};

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
}
