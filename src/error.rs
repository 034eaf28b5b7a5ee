//! Error enums per stage and the umbrella [`Error`].

/// The umbrella error of the crate.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// An I/O error outside the database.
    #[error("I/O error: {0}")]
    Io(#[from] std::io::Error),
}

/// Result with the crate's [`Error`] by default.
pub type Result<T, E = Error> = std::result::Result<T, E>;
