//! The Elastic APM Java agent's profiling correlation library
//! (`elastic-jvmti-linux-<arch>.so`), asked for every file as upstream does.
//!
//! Extracts the address of the exported process-storage pointer
//! `elastic_apm_profiling_correlation_process_storage_v1` (which must be 8
//! bytes; a library without it is "not mine") and the TLS offset of
//! `elastic_apm_profiling_correlation_tls_v1`. No `interpreter_offsets`.

use super::names::APM;
use super::InterpreterData;
use super::{Loaded, LoaderError, LoaderInfo};

pub const NAME: &str = "apm";

const PROCESS_STORAGE: &str = "elastic_apm_profiling_correlation_process_storage_v1";
const TLS: &str = "elastic_apm_profiling_correlation_tls_v1";

#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct ApmData {
    /// The `[\w-]*` part of the name (the build's architecture).
    pub(crate) flavour: String,
    pub(crate) process_storage: u64,
    pub(crate) tls_offset: u64,
}

impl InterpreterData for ApmData {
    fn loader(&self) -> &'static str {
        NAME
    }

    fn version(&self) -> String {
        format!("v1 ({})", self.flavour)
    }

    fn facts(&self) -> Vec<(&'static str, String)> {
        vec![
            ("version", self.version()),
            ("process storage", super::hex(self.process_storage)),
            ("TLS offset", super::hex(self.tls_offset)),
        ]
    }
}

pub fn load(info: &LoaderInfo<'_, '_>) -> Result<Option<Loaded>, LoaderError> {
    let Some(caps) = APM.captures(info.name) else {
        return Ok(None);
    };
    let syms = info.symbols();
    let Some(storage) = syms.get(PROCESS_STORAGE) else {
        return Ok(None);
    };
    if storage.size != 8 {
        return Err(LoaderError::Invalid(format!(
            "{PROCESS_STORAGE} is {} bytes, not 8",
            storage.size
        )));
    }
    let tls = syms.require(TLS)?;
    if !tls.tls {
        return Err(LoaderError::Invalid(format!("{TLS} is not thread-local")));
    }
    Ok(Some(Loaded::new(
        ApmData {
            flavour: caps.get(1).map_or("", |m| m.as_str()).to_owned(),
            process_storage: storage.address,
            tls_offset: tls.address,
        },
        None,
    )))
}
