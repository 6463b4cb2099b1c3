//! Why the C-library analyses failed; the texts are upstream's.

/// Why a symbol's code could not be read.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum SymbolError {
    #[error("symbol not found")]
    NotFound,
    #[error("no matching segment for {0:#x}")]
    NotMapped(u64),
}

/// Why the TSD analysis failed; the text is upstream's.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum TsdError {
    #[error("unable to read 'pthread_getspecific': {0}")]
    Symbol(SymbolError),
    #[error("getspecific function size is {0}")]
    TooShort(usize),
    #[error("failed to extract getspecific data: {0}")]
    Analysis(AnalysisError),
}

/// Why the analysis of a function's code found no layout.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum AnalysisError {
    /// x86-64: an instruction did not decode.
    #[error("at {at:#x}: undecodable instruction")]
    Undecodable { at: usize },
    /// x86-64: the code ended before a `ret`.
    #[error("EOF")]
    NoReturn,
    /// x86-64: the return value has none of the known shapes.
    #[error("could not extract tsdInfo amd")]
    NoTsdPattern,
    /// arm64: `x0` does not hold a TSD value at the end.
    #[error("libc data not found")]
    NoTsdValue,
    #[error("could not extract DTV info: no matching pattern found")]
    NoDtvPattern,
}

/// Why the DTV analysis failed.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum DtvError {
    #[error("unable to read '__tls_get_addr': {0}")]
    Symbol(SymbolError),
    #[error("failed to extract __tls_get_addr data: {0}")]
    Analysis(AnalysisError),
}
