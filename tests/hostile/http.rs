//! Placeholder: filled in by the work on issue 12.
