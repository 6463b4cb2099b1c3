//! .NET (`<major>.<minor>.<patch>/libcoreclr.so`).
//!
//! Extracts the runtime version from the directory name and checks it
//! before looking at the file (6.0.0 <= v < 9.0.0, as upstream), then the
//! address of the DAC table (`g_dacTable`) the unwinder reads the runtime's
//! globals through. .NET needs no `interpreter_offsets`.

use super::names::DOTNET;
use super::InterpreterData;
use super::{Loaded, LoaderError, LoaderInfo, Version};

pub const NAME: &str = "dotnet";

#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct DotnetData {
    pub(crate) version: Version,
    pub(crate) dac_table: u64,
}

impl InterpreterData for DotnetData {
    fn loader(&self) -> &'static str {
        NAME
    }

    fn version(&self) -> String {
        self.version.to_string()
    }

    fn facts(&self) -> Vec<(&'static str, String)> {
        vec![
            ("version", self.version()),
            ("DAC table", super::hex(self.dac_table)),
        ]
    }
}

pub fn load(info: &LoaderInfo<'_, '_>) -> Result<Option<Loaded>, LoaderError> {
    let Some(caps) = DOTNET.captures(info.name) else {
        return Ok(None);
    };
    let part = |i: usize| -> Result<u32, LoaderError> {
        caps.get(i)
            .and_then(|m| m.as_str().parse().ok())
            .ok_or_else(|| LoaderError::Invalid(format!("no version in the path {}", info.name)))
    };
    let version = Version(part(1)?, part(2)?, part(3)?).check(
        Version(6, 0, 0),
        Version(9, 0, 0),
        "6.0.0 to 8.x",
    )?;
    let dac_table = info.symbols().require("g_dacTable")?.address;
    Ok(Some(Loaded::new(DotnetData { version, dac_table }, None)))
}
