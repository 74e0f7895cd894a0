//! Fixture: the `stall` verifier. Its completion says what to do: `hang` never returns,
//! `sleep:MS` sleeps MS milliseconds, `timeout` reports its own budget ran out; anything else
//! passes. It explains every verdict and reports a load note, so tests see both reach the user.

use std::time::Duration;

use rlvr_plugin_api::{Metadata, PluginError, Verdict, VerifierPlugin, VerifyItem, export_verifier};

struct Stall;

impl VerifierPlugin for Stall {
    fn metadata() -> Metadata {
        Metadata { name: "stall", version: "0.1.0", description: "sleeps or hangs when asked to" }
    }

    fn notes() -> Vec<String> {
        vec!["stall: hangs on request; the host's deadline must answer for it".to_owned()]
    }

    fn from_config(_config_json: &str) -> Result<Self, PluginError> {
        Ok(Stall)
    }

    fn verify(&self, item: &VerifyItem<'_>) -> Result<Verdict, PluginError> {
        let completion = item.completion.as_str();
        if completion == "hang" {
            loop {
                std::thread::sleep(Duration::from_secs(3600));
            }
        }
        if completion == "timeout" {
            return Ok(Verdict::timeout("stall: budget of 0 work units spent"));
        }
        if let Some(millis) = completion.strip_prefix("sleep:").and_then(|ms| ms.parse().ok()) {
            std::thread::sleep(Duration::from_millis(millis));
        }
        let mut verdict = Verdict::new(1.0, true).extracted(completion);
        if item.explain {
            verdict = verdict.explain(format!("stall: did as told by {completion:?}"));
        }
        Ok(verdict)
    }
}

export_verifier!(Stall);
