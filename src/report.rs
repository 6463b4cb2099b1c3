//! The reports: what a scan or a watch found and what it costs
//! ([`summary::Summary`], as text or JSON), the manager's metrics under
//! upstream's names ([`metrics`]), every loaded file ([`files`]), the
//! files not loaded grouped by reason ([`problems`]), in plain-text tables
//! ([`table`]).

pub mod files;
pub mod metrics;
pub mod problems;
pub mod summary;
pub mod table;
