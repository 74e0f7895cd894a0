//! Loads one plugin library and checks it: the ABI (abi_stable), our API version, its kind and
//! kind-specific needs, the libtorch version of optimizers, and its self-test.
//!
//! Everything here is the in-process part. The registry first runs it in a child process
//! (`rlvr-worker probe-plugin`) so that a library that crashes or aborts while loading takes down the
//! child, not the daemon; see `registry::Isolation`.
//!
//! The ELF pre-check (`check_elf`) runs on the bytes the registry read to hash, with the `object`
//! crate, rather than trusting `dlopen`: `dlopen` of a truncated library maps pages past the end of
//! the file, and touching one is a SIGBUS (measured on a truncated debug build). `rlvrctl verify`
//! and the worker load in-process and rely on that check. Every failure is a `RefusalReason`.

use std::fmt;
use std::path::Path;

use abi_stable::library::{LibraryError, RawLibrary, RootModule, lib_header_from_path};
use abi_stable::std_types::{ROption, RResult};
use rlvr_plugin_api::{
    API_VERSION, LIBTORCH_VERSION, PluginErrorKind, PluginInfo, PluginKind, PluginModRef, TRAINS_SYMBOL,
    TrainedModel,
};
use serde::{Deserialize, Serialize};

/// Why a library was refused. A bounded set: these are the `reason` label of
/// `rlvr_plugin_refusals_total`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum RefusalReason {
    /// The file could not be read.
    Unreadable,
    /// Not a loadable shared library: corrupt, truncated, wrong architecture.
    NotALibrary,
    /// A shared library without an rlvr root module.
    NotAPlugin,
    /// Built against an incompatible `rlvr-plugin-api`/abi_stable (layout or version check).
    AbiMismatch,
    /// Built against another `API_VERSION`.
    ApiVersion,
    /// An optimizer built against another libtorch.
    LibtorchVersion,
    /// A kind this daemon does not know, or info that does not fit the kind.
    Kind,
    /// A name or version that does not parse, or an error from `info()`.
    InvalidMetadata,
    /// The self-test returned an error.
    SelfTestFailed,
    /// The plugin panicked (in `info()` or its self-test) or crashed the probe process.
    Crashed,
    /// The same `name@version` is already loaded with different content.
    DuplicateVersion,
}

impl RefusalReason {
    /// Every reason, for pre-registering metric labels.
    pub const ALL: [RefusalReason; 11] = [
        RefusalReason::Unreadable,
        RefusalReason::NotALibrary,
        RefusalReason::NotAPlugin,
        RefusalReason::AbiMismatch,
        RefusalReason::ApiVersion,
        RefusalReason::LibtorchVersion,
        RefusalReason::Kind,
        RefusalReason::InvalidMetadata,
        RefusalReason::SelfTestFailed,
        RefusalReason::Crashed,
        RefusalReason::DuplicateVersion,
    ];

    /// The label value.
    pub fn as_str(self) -> &'static str {
        match self {
            RefusalReason::Unreadable => "unreadable",
            RefusalReason::NotALibrary => "not_a_library",
            RefusalReason::NotAPlugin => "not_a_plugin",
            RefusalReason::AbiMismatch => "abi_mismatch",
            RefusalReason::ApiVersion => "api_version",
            RefusalReason::LibtorchVersion => "libtorch_version",
            RefusalReason::Kind => "kind",
            RefusalReason::InvalidMetadata => "invalid_metadata",
            RefusalReason::SelfTestFailed => "self_test_failed",
            RefusalReason::Crashed => "crashed",
            RefusalReason::DuplicateVersion => "duplicate_version",
        }
    }
}

impl fmt::Display for RefusalReason {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// A refusal: why, and a message that says what was wrong and what was expected. The registry
/// adds the file name.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, thiserror::Error)]
#[error("{message}")]
pub struct LoadRefusal {
    /// The class of problem.
    pub reason: RefusalReason,
    /// What was wrong.
    pub message: String,
}

impl LoadRefusal {
    pub(crate) fn new(reason: RefusalReason, message: impl Into<String>) -> Self {
        LoadRefusal { reason, message: message.into() }
    }
}

/// What the daemon keeps of a plugin's [`PluginInfo`], in host types.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct PluginMeta {
    /// Verifier, optimizer or curriculum.
    #[serde(with = "kind_serde")]
    pub kind: PluginKind,
    /// Short name.
    pub name: String,
    /// Semantic version.
    pub version: semver::Version,
    /// One line for humans.
    pub description: String,
    /// Verifiers: the expected `reference` object.
    pub reference_schema: Option<String>,
    /// Optimizers: their data mode (`online-groups`, ...).
    pub data_mode: Option<String>,
    /// Optimizers: whether a frozen reference model is needed.
    pub needs_reference: Option<bool>,
    /// Optimizers: whether a value head is needed.
    pub needs_value_head: Option<bool>,
    /// Optimizers: whether completions must come in groups.
    pub needs_groups: Option<bool>,
    /// Optimizers: the model they train (`policy`, `reward-model`; see `TrainedModel`). Absent
    /// in records written before it was, which were all policies.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub trains: Option<String>,
    /// What the plugin found about this host when it loaded (e.g. sandbox layers).
    #[serde(default)]
    pub notes: Vec<String>,
}

impl PluginMeta {
    /// `name@version`, the id jobs pin.
    pub fn id(&self) -> String {
        format!("{}@{}", self.name, self.version)
    }
}

mod kind_serde {
    use rlvr_plugin_api::PluginKind;
    use serde::{Deserialize, Deserializer, Serializer};

    pub fn serialize<S: Serializer>(kind: &PluginKind, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.serialize_str(kind.as_str())
    }

    pub fn deserialize<'de, D: Deserializer<'de>>(deserializer: D) -> Result<PluginKind, D::Error> {
        let name = String::deserialize(deserializer)?;
        PluginKind::parse(&name)
            .ok_or_else(|| serde::de::Error::custom(format!("unknown plugin kind {name:?}")))
    }
}

/// The note of a plugin built before `check_options` was appended to the root module.
pub const NOT_CHECKED_AT_SUBMIT: &str = "options not checked by check_options: built before it, so its options are checked when it is created (a verifier's by the daemon at submit, an optimizer's when its worker starts)";

/// Checks that `bytes` are a whole shared library for this machine before anything maps them.
///
/// `dlopen` maps each loadable segment straight from the file and trusts the program headers: a
/// truncated library maps pages past the end of the file, and the first touch of one kills the
/// process with SIGBUS. So we read the headers first and refuse a file whose segments do not fit.
pub fn check_elf(bytes: &[u8]) -> Result<(), LoadRefusal> {
    use object::{Architecture, Object, ObjectKind, ObjectSegment};

    let not_a_library = |what: String| {
        LoadRefusal::new(RefusalReason::NotALibrary, format!("not a loadable shared library: {what}"))
    };
    let file = object::read::elf::ElfFile64::<object::Endianness>::parse(bytes).map_err(|error| {
        not_a_library(format!("not a valid 64-bit ELF file, corrupt or truncated ({error})"))
    })?;
    if file.kind() != ObjectKind::Dynamic {
        return Err(not_a_library(format!(
            "an ELF file of kind {:?}, expected a shared library",
            file.kind()
        )));
    }
    let host = if cfg!(target_arch = "x86_64") {
        Architecture::X86_64
    } else if cfg!(target_arch = "aarch64") {
        Architecture::Aarch64
    } else {
        file.architecture()
    };
    if file.architecture() != host {
        return Err(not_a_library(format!("built for {:?}, this machine is {host:?}", file.architecture())));
    }
    for segment in file.segments() {
        let (offset, size) = segment.file_range();
        let end = offset.checked_add(size);
        if end.is_none_or(|end| end > bytes.len() as u64) {
            return Err(not_a_library(format!(
                "truncated: a segment needs bytes {offset}..{} but the file has {} bytes",
                offset.saturating_add(size),
                bytes.len()
            )));
        }
    }
    Ok(())
}

/// Loads the library at `path` (never unloaded), checks it and runs its self-test. The caller
/// has passed the file's bytes through [`check_elf`] first.
pub fn load_and_check(path: &Path) -> Result<(PluginModRef, PluginMeta), LoadRefusal> {
    let module = open(path)?;
    let mut meta = match module.info()() {
        RResult::ROk(info) => check_info(&info)?,
        RResult::RErr(error) if error.kind == PluginErrorKind::Panic => {
            return Err(LoadRefusal::new(RefusalReason::Crashed, error.message.to_string()));
        }
        RResult::RErr(error) => {
            return Err(LoadRefusal::new(RefusalReason::InvalidMetadata, format!("info() failed: {error}")));
        }
    };
    if meta.kind == PluginKind::Optimizer {
        meta.trains = Some(trained_model(path, &meta.name)?.as_str().to_owned());
    }
    if module.check_options().is_none() {
        // Listed with the plugin (`rlvrctl plugins`, `GET /v1/plugins`) and logged at load.
        meta.notes.push(NOT_CHECKED_AT_SUBMIT.to_owned());
    }
    match module.self_test()() {
        RResult::ROk(()) => Ok((module, meta)),
        RResult::RErr(error) if error.kind == PluginErrorKind::Panic => {
            Err(LoadRefusal::new(RefusalReason::Crashed, format!("self-test: {}", error.message)))
        }
        RResult::RErr(error) => Err(LoadRefusal::new(
            RefusalReason::SelfTestFailed,
            format!("self-test failed: {}", error.message),
        )),
    }
}

/// The model an optimizer library trains: the string its [`TRAINS_SYMBOL`] function returns; a
/// library without the symbol (built before it) trains the policy, and a name this host does not
/// know is refused by name. The library is mapped already (`open`): this takes one more reference
/// to it, which is never given back, as libraries are never unloaded.
fn trained_model(path: &Path, name: &str) -> Result<TrainedModel, LoadRefusal> {
    let library = RawLibrary::load_at(path).map_err(library_refusal)?;
    let library: &'static RawLibrary = Box::leak(Box::new(library));
    // SAFETY: the symbol, when present, is `export_optimizer!`'s `extern "C" fn() -> *const
    // c_char`, returning a pointer to a static NUL-terminated string of the library's.
    let answer = unsafe {
        match library.get::<extern "C" fn() -> *const std::ffi::c_char>(TRAINS_SYMBOL) {
            Err(_) => return Ok(TrainedModel::Policy),
            Ok(trains) => {
                let pointer = trains();
                if pointer.is_null() {
                    String::new()
                } else {
                    std::ffi::CStr::from_ptr(pointer).to_string_lossy().into_owned()
                }
            }
        }
    };
    TrainedModel::parse(&answer).ok_or_else(|| {
        let known: Vec<&str> = TrainedModel::ALL.iter().map(|model| model.as_str()).collect();
        LoadRefusal::new(
            RefusalReason::InvalidMetadata,
            format!(
                "optimizer {name} trains {answer:?}, a model this daemon does not know (it knows {})",
                known.join(", ")
            ),
        )
    })
}

/// Loads the library at `path` to ask it about options (`rlvr-worker check-options`): ELF-checked
/// and its info checked, but not self-tested again — the registry's probe did that for these
/// bytes, and a self-test per submit would cost what the check is meant to save.
pub fn load_for_options(path: &Path) -> Result<PluginModRef, LoadRefusal> {
    let bytes = std::fs::read(path).map_err(|error| {
        LoadRefusal::new(RefusalReason::Unreadable, format!("cannot read the file: {error}"))
    })?;
    check_elf(&bytes)?;
    drop(bytes);
    let module = open(path)?;
    match module.info()() {
        RResult::ROk(info) => check_info(&info).map(|_| module),
        RResult::RErr(error) => {
            Err(LoadRefusal::new(RefusalReason::InvalidMetadata, format!("info() failed: {error}")))
        }
    }
}

fn open(path: &Path) -> Result<PluginModRef, LoadRefusal> {
    let header = lib_header_from_path(path).map_err(library_refusal)?;
    header.init_root_module::<PluginModRef>().map_err(library_refusal)
}

fn library_refusal(error: LibraryError) -> LoadRefusal {
    let reason = match &error {
        LibraryError::OpenError { .. } => RefusalReason::NotALibrary,
        LibraryError::GetSymbolError { .. } => RefusalReason::NotAPlugin,
        LibraryError::RootModule { .. } => RefusalReason::Crashed,
        _ => RefusalReason::AbiMismatch,
    };
    let message = match reason {
        RefusalReason::NotALibrary => format!(
            "not a loadable shared library (corrupt, truncated or built for another platform): {error}"
        ),
        RefusalReason::NotAPlugin => format!(
            "a shared library but not an rlvr plugin: it exports no `{}` root module (build it with rlvr_plugin_api::export_verifier! or its siblings)",
            PluginModRef::NAME
        ),
        _ => format!(
            "incompatible plugin ABI (expected a plugin built against rlvr-plugin-api {} with API_VERSION {API_VERSION}; rebuild it): {}",
            env!("CARGO_PKG_VERSION"),
            summarize_layout_error(&error.to_string())
        ),
    };
    LoadRefusal::new(reason, message)
}

/// abi_stable reports a layout mismatch as a dump of both layouts, hundreds of lines long. An
/// operator needs which types differ and how: `Verdict: incompatible type size (expected 168,
/// found 128)`. Falls back to the first line when the dump has no `Error:` entries.
fn summarize_layout_error(dump: &str) -> String {
    const SHOWN: usize = 4;
    let lines: Vec<&str> = dump.lines().map(str::trim).collect();
    let mut expected_type = None;
    let mut in_expected = false;
    let mut found = Vec::new();
    for (index, line) in lines.iter().enumerate() {
        if *line == "Layout of expected type:" {
            in_expected = true;
        } else if *line == "Layout of found type:" {
            in_expected = false;
        } else if let Some(name) = line.strip_prefix("type:").filter(|_| in_expected) {
            // The first `type:` after the heading names the type; later ones are its fields.
            expected_type.get_or_insert(name);
        } else if let Some(what) = line.strip_prefix("Error:") {
            let value = |label: &str| {
                (lines.get(index + 1..index + 5)?.iter())
                    .position(|l| *l == label)
                    .and_then(|at| lines.get(index + 2 + at))
                    .copied()
            };
            let mut entry = format!("{}: {what}", expected_type.unwrap_or("?"));
            if let (Some(expected), Some(got)) = (value("Expected:"), value("Found:")) {
                entry.push_str(&format!(" (expected {expected}, found {got})"));
            }
            if !found.contains(&entry) {
                found.push(entry);
            }
        }
        if line.starts_with("Layout of expected type:") {
            expected_type = None;
        }
    }
    if found.is_empty() {
        return dump.lines().next().unwrap_or("").trim().to_owned();
    }
    let more = found.len().saturating_sub(SHOWN);
    found.truncate(SHOWN);
    let mut summary = found.join("; ");
    if more > 0 {
        summary.push_str(&format!("; and {more} more difference(s)"));
    }
    summary
}

/// Checks what a plugin says about itself against what this daemon can use.
pub fn check_info(info: &PluginInfo) -> Result<PluginMeta, LoadRefusal> {
    if info.api_version != API_VERSION {
        return Err(LoadRefusal::new(
            RefusalReason::ApiVersion,
            format!(
                "built against plugin API version {}, this daemon speaks version {API_VERSION}: rebuild the plugin against this rlvr-plugin-api",
                info.api_version
            ),
        ));
    }
    let Some(kind) = PluginKind::parse(info.kind.as_str()) else {
        return Err(LoadRefusal::new(
            RefusalReason::Kind,
            format!(
                "unknown plugin kind {:?}: expected one of verifier, optimizer, curriculum",
                info.kind.as_str()
            ),
        ));
    };
    let name = info.name.as_str();
    if name.is_empty()
        || name.len() > 64
        || !name.bytes().all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-' || b == b'_')
    {
        return Err(LoadRefusal::new(
            RefusalReason::InvalidMetadata,
            format!("plugin name {name:?}: expected 1 to 64 characters of a-z, 0-9, '-' and '_'"),
        ));
    }
    let version = semver::Version::parse(info.version.as_str()).map_err(|error| {
        LoadRefusal::new(
            RefusalReason::InvalidMetadata,
            format!(
                "plugin {name} version {:?}: expected a semantic version like 1.2.3 ({error})",
                info.version.as_str()
            ),
        )
    })?;
    let mut meta = PluginMeta {
        kind,
        name: name.to_owned(),
        version,
        description: info.description.to_string(),
        reference_schema: None,
        data_mode: None,
        needs_reference: None,
        needs_value_head: None,
        needs_groups: None,
        trains: None,
        notes: info.notes.iter().map(|note| note.to_string()).collect(),
    };
    let kind_mismatch = |details: &str| {
        LoadRefusal::new(
            RefusalReason::Kind,
            format!("plugin {name} says it is a {} but {details}", kind.as_str()),
        )
    };
    match kind {
        PluginKind::Verifier => {
            let ROption::RSome(verifier) = &info.verifier else {
                return Err(kind_mismatch("gives no verifier info"));
            };
            meta.reference_schema = Some(verifier.reference_schema.to_string());
        }
        PluginKind::Optimizer => {
            let ROption::RSome(optimizer) = &info.optimizer else {
                return Err(kind_mismatch("gives no optimizer info"));
            };
            if optimizer.libtorch_version.as_str() != LIBTORCH_VERSION {
                return Err(LoadRefusal::new(
                    RefusalReason::LibtorchVersion,
                    format!(
                        "optimizer {name} was built against libtorch {}, this daemon uses libtorch {LIBTORCH_VERSION} (tch 0.24): rebuild it against this rlvr-plugin-api",
                        optimizer.libtorch_version.as_str()
                    ),
                ));
            }
            meta.data_mode = Some(optimizer.data_mode.as_str().to_owned());
            meta.needs_reference = Some(optimizer.needs_reference);
            meta.needs_value_head = Some(optimizer.needs_value_head);
            meta.needs_groups = Some(optimizer.needs_groups);
        }
        PluginKind::Curriculum => {
            if info.curriculum.is_none() {
                return Err(kind_mismatch("gives no curriculum info"));
            }
        }
    }
    Ok(meta)
}

#[cfg(test)]
mod tests {
    #[test]
    fn a_layout_dump_is_summarized_to_the_types_that_differ() {
        let dump = "Compared <this>:\n    --- Type Layout ---\n    type:PrefixRef<'a, PluginMod>\n\
            Layout of expected type:\n    --- Type Layout ---\n    type:Verdict\n    size:168 align:8\n\
            field_name:score\n    type:f64\nLayout of found type:\n    type:Verdict\n\
            Error:incompatible type size\nExpected:\n    168\nFound:\n    128\n\n\
            Error:too many fields\nExpected:\n    7\nFound:\n    5\n";
        assert_eq!(
            super::summarize_layout_error(dump),
            "Verdict: incompatible type size (expected 168, found 128); Verdict: too many fields (expected 7, found 5)"
        );
        assert_eq!(super::summarize_layout_error("something else\nentirely"), "something else");
    }

    use abi_stable::std_types::{ROption, RString};
    use rlvr_plugin_api::{DataMode, OptimizerInfo, VerifierInfo};

    use super::*;

    fn verifier_info() -> PluginInfo {
        PluginInfo {
            kind: "verifier".into(),
            name: "format".into(),
            version: "0.1.0".into(),
            api_version: API_VERSION,
            description: "d".into(),
            verifier: ROption::RSome(VerifierInfo { reference_schema: "{}".into() }),
            optimizer: ROption::RNone,
            curriculum: ROption::RNone,
            notes: Default::default(),
        }
    }

    fn optimizer(libtorch: &str) -> ROption<OptimizerInfo> {
        ROption::RSome(OptimizerInfo {
            data_mode: DataMode::OfflinePairs,
            needs_reference: true,
            needs_value_head: false,
            needs_groups: false,
            libtorch_version: RString::from(libtorch),
        })
    }

    fn check(edit: impl FnOnce(&mut PluginInfo), expected: Result<&str, (RefusalReason, &str)>) {
        let mut info = verifier_info();
        edit(&mut info);
        match (check_info(&info), expected) {
            (Ok(meta), Ok(id)) => assert_eq!(meta.id(), id),
            (Err(refusal), Err((reason, message))) => {
                assert_eq!(refusal.reason, reason, "{refusal}");
                assert!(refusal.message.contains(message), "{:?} lacks {message:?}", refusal.message);
            }
            (got, expected) => panic!("got {got:?}, expected {expected:?}"),
        }
    }

    #[test]
    fn info_checks() {
        check(|_| {}, Ok("format@0.1.0"));
        check(|i| i.version = "1.2.3-rc.1".into(), Ok("format@1.2.3-rc.1"));
        check(|i| i.api_version = 0, Err((RefusalReason::ApiVersion, "plugin API version 0")));
        check(|i| i.kind = "Verifier".into(), Err((RefusalReason::Kind, "unknown plugin kind \"Verifier\"")));
        check(|i| i.kind = "optimizer".into(), Err((RefusalReason::Kind, "gives no optimizer info")));
        check(|i| i.kind = "curriculum".into(), Err((RefusalReason::Kind, "gives no curriculum info")));
        check(|i| i.verifier = ROption::RNone, Err((RefusalReason::Kind, "gives no verifier info")));
        check(|i| i.name = "".into(), Err((RefusalReason::InvalidMetadata, "expected 1 to 64 characters")));
        check(|i| i.name = "Format".into(), Err((RefusalReason::InvalidMetadata, "plugin name \"Format\"")));
        check(|i| i.name = "a b".into(), Err((RefusalReason::InvalidMetadata, "plugin name \"a b\"")));
        check(
            |i| i.version = "1.0".into(),
            Err((RefusalReason::InvalidMetadata, "expected a semantic version")),
        );
        check(
            |i| {
                i.kind = "optimizer".into();
                i.optimizer = optimizer(LIBTORCH_VERSION);
            },
            Ok("format@0.1.0"),
        );
        check(
            |i| {
                i.kind = "optimizer".into();
                i.optimizer = optimizer("2.10.0");
            },
            Err((RefusalReason::LibtorchVersion, "built against libtorch 2.10.0")),
        );
    }

    #[test]
    fn elf_check_refuses_what_dlopen_would_crash_on() {
        let cases: &[(&[u8], &str)] = &[
            (b"", "not a valid 64-bit ELF file"),
            (b"\x7fELF garbage", "not a valid 64-bit ELF file"),
            (b"#!/bin/sh\necho hi\n", "not a valid 64-bit ELF file"),
        ];
        for (bytes, message) in cases {
            let refusal = check_elf(bytes).unwrap_err();
            assert_eq!(refusal.reason, RefusalReason::NotALibrary);
            assert!(refusal.message.contains(message), "{}", refusal.message);
        }
        // The test binary (position-independent, like a library) passes whole and fails cut short.
        let exe = std::fs::read(std::env::current_exe().unwrap()).unwrap();
        check_elf(&exe).unwrap();
        let refusal = check_elf(&exe[..exe.len() / 2]).unwrap_err();
        assert!(refusal.message.contains("corrupt or truncated"), "{}", refusal.message);
    }
}
