//! The verifier contract: one completion and its reference in, a scored verdict out.
//!
//! Explanations are asked for (`VerifyItem::explain`), not always built: auditing wants sentences,
//! training wants microseconds.

use abi_stable::StableAbi;
use abi_stable::sabi_trait;
use abi_stable::std_types::{RBox, ROption, RResult, RStr, RString, RVec};

use crate::{HostContext, Metadata, OptionError, OptionsReport, PluginError};

/// One item to verify. Borrowed from the host for the duration of the call.
#[repr(C)]
#[derive(StableAbi, Debug, Clone, Copy)]
pub struct VerifyItem<'a> {
    /// The caller's id for the item, echoed in the output.
    pub id: RStr<'a>,
    /// The prompt the completion answers.
    pub prompt: RStr<'a>,
    /// The model's completion, the text being graded.
    pub completion: RStr<'a>,
    /// The item's `reference` object as JSON text (`{}` when the item has none).
    pub reference_json: RStr<'a>,
    /// Whether the caller wants [`Verdict::explanation`] filled (`rlvrctl verify --explain`).
    /// Verifiers build explanation text only when this is set, so training pays nothing for it.
    pub explain: bool,
}

impl<'a> VerifyItem<'a> {
    /// An item from plain string slices.
    pub fn new(id: &'a str, prompt: &'a str, completion: &'a str, reference_json: &'a str) -> Self {
        VerifyItem {
            id: id.into(),
            prompt: prompt.into(),
            completion: completion.into(),
            reference_json: reference_json.into(),
            explain: false,
        }
    }

    /// The same item, with [`VerifyItem::explain`] set to `explain`.
    pub fn explaining(mut self, explain: bool) -> Self {
        self.explain = explain;
        self
    }
}

/// One named part of a score, logged separately by the trainer (e.g. `think_block`).
#[repr(C)]
#[derive(StableAbi, Debug, Clone, PartialEq)]
pub struct Component {
    /// The component's name; stable across versions of a plugin.
    pub name: RString,
    /// Its value, usually in `[0, 1]`.
    pub value: f64,
}

/// A verifier's judgement of one item.
#[repr(C)]
#[derive(StableAbi, Debug, Clone, PartialEq)]
pub struct Verdict {
    /// The reward, usually in `[0, 1]`.
    pub score: f64,
    /// Whether the completion counts as correct (used for pass rates and all-pass groups).
    pub passed: bool,
    /// Named parts of the score.
    pub components: RVec<Component>,
    /// The answer that was graded, when one was found.
    pub extracted: ROption<RString>,
    /// Set when the verifier could not judge the item (a timeout, a malformed reference); the
    /// score then is 0 and the item counts toward the job's verifier error rate.
    pub error: ROption<RString>,
    /// Set when the item could not be judged within the verifier's time or work budget; `error`
    /// is then set too. The trainer counts timeouts apart from other errors (`[stop]
    /// verifier_timeout_rate_max`).
    pub timed_out: bool,
    /// Lines for a human auditing the verdict: what was extracted, how it was read, and why it
    /// matched or not. Filled only when [`VerifyItem::explain`] is set.
    pub explanation: RVec<RString>,
}

impl Verdict {
    /// A verdict with `score` and `passed` and nothing else.
    pub fn new(score: f64, passed: bool) -> Self {
        Verdict {
            score,
            passed,
            components: RVec::new(),
            extracted: ROption::RNone,
            error: ROption::RNone,
            timed_out: false,
            explanation: RVec::new(),
        }
    }

    /// Adds a named component.
    pub fn component(mut self, name: &str, value: f64) -> Self {
        self.components.push(Component { name: name.into(), value });
        self
    }

    /// Records the answer that was graded.
    pub fn extracted(mut self, answer: impl Into<String>) -> Self {
        self.extracted = ROption::RSome(RString::from(answer.into()));
        self
    }

    /// Adds a line to the explanation. Call it only when [`VerifyItem::explain`] is set.
    pub fn explain(mut self, line: impl Into<String>) -> Self {
        self.explanation.push(RString::from(line.into()));
        self
    }

    /// A verdict for an item the verifier could not judge: score 0, not passed, `error` set.
    pub fn error(message: impl Into<String>) -> Self {
        let mut verdict = Verdict::new(0.0, false);
        verdict.error = ROption::RSome(RString::from(message.into()));
        verdict
    }

    /// A verdict for an item whose time or work budget ran out: an [`error`](Verdict::error)
    /// with [`timed_out`](Verdict::timed_out) set.
    pub fn timeout(message: impl Into<String>) -> Self {
        let mut verdict = Verdict::error(message);
        verdict.timed_out = true;
        verdict
    }
}

/// A verifier, as the daemon sees it across the ABI boundary. Plugin authors implement
/// [`VerifierPlugin`] instead; the export layer implements this.
#[sabi_trait]
pub trait Verifier: Send + Sync {
    /// Judges one item.
    #[sabi(last_prefix_field)]
    fn verify(&self, item: VerifyItem<'_>) -> RResult<Verdict, PluginError>;
}

/// An owned verifier object from a plugin.
pub type VerifierBox = Verifier_TO<'static, RBox<()>>;

/// What a verifier plugin author implements, in plain Rust; export it with
/// [`export_verifier!`](crate::export_verifier).
///
/// Calls may come from many threads at once (`&self`, `Sync`). Panics are caught at the boundary
/// and reported as [`PluginErrorKind::Panic`](crate::PluginErrorKind::Panic), but a verifier
/// should not panic on any input: a malformed item is an `Err` or a [`Verdict::error`].
pub trait VerifierPlugin: Sized + Send + Sync + 'static {
    /// Name, version and description.
    fn metadata() -> Metadata;

    /// A JSON example or schema of the `reference` object this verifier reads.
    fn reference_schema() -> &'static str {
        "{}"
    }

    /// Facts about the host found when the plugin loads — e.g. which sandbox layers the kernel
    /// allows — for the daemon's log and `rlvrctl plugins`. Called once per load.
    fn notes() -> Vec<String> {
        Vec::new()
    }

    /// Builds a verifier from the plugin's own keys of the job spec, as a JSON object (`{}` for
    /// defaults). Rejects unknown keys and bad values with [`PluginError::invalid_config`],
    /// its message `"<key>: <problem>"` (an [`OptionError`] converts into one).
    fn from_config(config_json: &str) -> Result<Self, PluginError>;

    /// [`from_config`](Self::from_config) with the host's context: the secrets this job may use
    /// and where it may send requests. Override it when an option names a secret or a
    /// destination; the default ignores the context.
    fn from_config_in(config_json: &str, host: &HostContext) -> Result<Self, PluginError> {
        let _ = host;
        Self::from_config(config_json)
    }

    /// Checks the options without creating anything, and reports the secret names and URLs they
    /// refer to (see [`crate::options`]); the daemon calls it at submit, in its own process.
    /// The default creates the verifier and reports nothing: override it when creating is not
    /// cheap and free of side effects, or when an option names a secret or a URL.
    fn check_options(config_json: &str) -> Result<OptionsReport, OptionError> {
        Self::from_config(config_json).map(|_| OptionsReport::default()).map_err(OptionError::from)
    }

    /// Judges one item.
    fn verify(&self, item: &VerifyItem<'_>) -> Result<Verdict, PluginError>;

    /// Run once when the daemon loads the plugin; a failure refuses the plugin. Check a few known
    /// answers here.
    fn self_test() -> Result<(), PluginError> {
        Ok(())
    }
}

/// Checks `verifier` against known answers — `(completion, reference_json, expected score)` — the
/// usual body of [`VerifierPlugin::self_test`]. The first wrong score fails the self-test with a
/// message naming the item, the score it got and the verdict's error, if any.
pub fn check_known_answers<V: VerifierPlugin>(
    verifier: &V,
    cases: &[(&str, &str, f64)],
) -> Result<(), PluginError> {
    for (completion, reference_json, expected) in cases {
        let verdict = verifier.verify(&VerifyItem::new("self-test", "", completion, reference_json))?;
        if verdict.score != *expected {
            return Err(PluginError::self_test_failed(format!(
                "completion {completion:?} with reference {reference_json}: expected score {expected}, got {} (error: {:?})",
                verdict.score,
                verdict.error.as_ref().map(|error| error.as_str())
            )));
        }
    }
    Ok(())
}
