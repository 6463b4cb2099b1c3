//! Synthetic deltas for the arm64 vDSO (spec 6.1). Placeholder until
//! implemented.
