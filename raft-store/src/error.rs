//! Errors of opening the store.

/// The store could not be opened.
#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    /// sled could not open the database directory.
    #[error("cannot open the sled database at {path}: {source}")]
    Open {
        /// The database directory.
        path: String,
        /// sled's error.
        source: sled::Error,
    },
    /// A tree could not be opened.
    #[error("cannot open sled tree {tree}: {source}")]
    Tree {
        /// The tree's name.
        tree: &'static str,
        /// sled's error.
        source: sled::Error,
    },
    /// The stored snapshot cannot be read back.
    #[error("the stored snapshot is unreadable: {0}")]
    Snapshot(String),
}
