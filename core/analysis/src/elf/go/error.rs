//! Why a Go table could not be parsed (its own file: the table readers
//! and the extraction around them both use it).

/// Why a Go table could not be parsed.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum GoError {
    /// The table is there but malformed.
    #[error("{0}")]
    Corrupt(String),
    /// The table could not be read from the file.
    #[error("{0}")]
    Load(String),
}
