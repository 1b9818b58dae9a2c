//! The placement policies: the FGD paper's five baselines, FGD itself, and
//! gshare's own.

mod best_fit;
mod clustering;
mod dot_product;
mod fgd;
mod gshare;
mod packing;
mod random_fit;
mod repack;

pub use best_fit::BestFit;
pub use clustering::Clustering;
pub use dot_product::DotProduct;
pub use fgd::Fgd;
#[cfg(test)]
pub(crate) use gshare::oversubscribed_models;
pub use gshare::Gshare;
pub use packing::Packing;
pub use random_fit::RandomFit;
