//! File ids (spec 9). Placeholder until implemented.
