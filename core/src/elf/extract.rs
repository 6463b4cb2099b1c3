//! The extraction stages in upstream's order (spec 5.2). Placeholder until
//! implemented.
