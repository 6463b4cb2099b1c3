//! The reports: what a scan or a watch found and what it costs
//! ([`summary::Summary`], as text or JSON), in plain-text tables
//! ([`table`]).

pub mod summary;
pub mod table;
