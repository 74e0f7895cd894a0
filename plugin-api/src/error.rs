//! `PluginError`: the one error type that crosses the plugin boundary.

use std::fmt;

use abi_stable::StableAbi;
use abi_stable::std_types::RString;

/// What went wrong, coarsely; the message says the rest.
#[repr(u8)]
#[derive(StableAbi, Debug, Clone, Copy, PartialEq, Eq)]
pub enum PluginErrorKind {
    /// The plugin's configuration (its keys in the job spec) was rejected.
    InvalidConfig,
    /// One input (a verify item, a batch) was rejected; other inputs may still succeed.
    InvalidInput,
    /// The plugin failed for a reason of its own.
    Internal,
    /// The plugin panicked; the export layer caught it at the boundary.
    Panic,
    /// The plugin's self-test did not pass.
    SelfTestFailed,
}

/// An error returned by a plugin call. Crosses the ABI boundary by value.
#[repr(C)]
#[derive(StableAbi, Debug, Clone, PartialEq)]
pub struct PluginError {
    /// The class of failure.
    pub kind: PluginErrorKind,
    /// A lowercase message naming what was wrong and what was expected.
    pub message: RString,
}

impl PluginError {
    /// An error of `kind` with `message`.
    pub fn new(kind: PluginErrorKind, message: impl Into<String>) -> Self {
        PluginError { kind, message: RString::from(message.into()) }
    }

    /// The plugin's configuration was rejected.
    pub fn invalid_config(message: impl Into<String>) -> Self {
        Self::new(PluginErrorKind::InvalidConfig, message)
    }

    /// One input was rejected.
    pub fn invalid_input(message: impl Into<String>) -> Self {
        Self::new(PluginErrorKind::InvalidInput, message)
    }

    /// The plugin failed internally.
    pub fn internal(message: impl Into<String>) -> Self {
        Self::new(PluginErrorKind::Internal, message)
    }

    /// The self-test did not pass.
    pub fn self_test_failed(message: impl Into<String>) -> Self {
        Self::new(PluginErrorKind::SelfTestFailed, message)
    }
}

impl fmt::Display for PluginError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let kind = match self.kind {
            PluginErrorKind::InvalidConfig => "invalid config",
            PluginErrorKind::InvalidInput => "invalid input",
            PluginErrorKind::Internal => "internal error",
            PluginErrorKind::Panic => "panic",
            PluginErrorKind::SelfTestFailed => "self-test failed",
        };
        write!(f, "{kind}: {}", self.message)
    }
}

impl std::error::Error for PluginError {}
