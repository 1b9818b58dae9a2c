//! The one trait every placement policy implements, and the policy names.

use super::cluster::Cluster;
use super::failure::PlacementFailure;
use super::frag::FragModel;
use super::plan::Placement;
use super::policies::{BestFit, Clustering, DotProduct, Fgd, Gshare, Packing, RandomFit};
use super::request::PodRequest;
use crate::rng::Rng;

/// Feasibility → score/rank → pick a node and the GPU(s) inside it.
///
/// A policy sees the cluster read-only and returns a plan; the caller binds
/// it ([`Cluster::remap`] for its remaps, then [`Cluster::bind`]). Policies
/// are online: they see one task at a time, in arrival order. They may keep
/// caches keyed by node [`super::Node::epoch`].
pub trait PlacementPolicy {
    /// The policy's canonical name (one of [`POLICY_NAMES`]).
    fn name(&self) -> &'static str;

    /// Where `pod` goes, or why it fits nowhere.
    fn place(
        &mut self,
        cluster: &Cluster,
        pod: &PodRequest,
        rng: &mut Rng,
    ) -> Result<Placement, PlacementFailure>;
}

/// Canonical policy names.
pub const POLICY_NAMES: [&str; 8] = [
    "random",
    "dotprod",
    "clustering",
    "packing",
    "bestfit",
    "fgd",
    "gshare",
    "gshare-noremap",
];

/// A policy name that is not known.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("unknown placement policy {name:?}; known: {known}", known = POLICY_NAMES.join(", "))]
pub struct UnknownPolicy {
    /// The name given.
    pub name: String,
}

/// The canonical name for `name`: one of [`POLICY_NAMES`], or the FGD
/// artifact's row names (`01-Random` … `06-FGD`), case-insensitive.
pub fn canonical_policy_name(name: &str) -> Result<&'static str, UnknownPolicy> {
    let lower = name.trim().to_ascii_lowercase();
    let n = match lower.as_str() {
        "random" | "01-random" => "random",
        "dotprod" | "dotproduct" | "02-dotprod" => "dotprod",
        "clustering" | "gpuclustering" | "03-gpuclustering" => "clustering",
        "packing" | "gpupacking" | "04-gpupacking" => "packing",
        "bestfit" | "05-bestfit" => "bestfit",
        "fgd" | "06-fgd" => "fgd",
        "gshare" => "gshare",
        "gshare-noremap" => "gshare-noremap",
        _ => {
            return Err(UnknownPolicy {
                name: name.to_string(),
            })
        }
    };
    Ok(n)
}

/// A fresh policy by name (see [`canonical_policy_name`]). `frag` is the
/// typical-pod distribution of the original pod list (used by `fgd` and
/// `gshare*`).
pub fn policy_by_name(
    name: &str,
    frag: &FragModel,
) -> Result<Box<dyn PlacementPolicy + Send>, UnknownPolicy> {
    Ok(match canonical_policy_name(name)? {
        "random" => Box::new(RandomFit),
        "dotprod" => Box::new(DotProduct),
        "clustering" => Box::new(Clustering),
        "packing" => Box::new(Packing),
        "bestfit" => Box::new(BestFit),
        "fgd" => Box::new(Fgd::new(frag.clone())),
        "gshare" => Box::new(Gshare::new(frag.clone(), true)),
        _ => Box::new(Gshare::new(frag.clone(), false)),
    })
}
