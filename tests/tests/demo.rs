//! The README's first command, end to end: `scripts/demo.sh` publishes a gated checkpoint and
//! prints its gate table and paths; `scripts/demo.sh --refuse` shows the gates refusing a job
//! whose held-out score does not improve, with the reason. Run on the debug build the suite
//! already made (`RLVR_DEMO_PROFILE=debug`); everything else is the script as users run it.

use std::path::Path;
use std::process::Command;

use serde_json::Value;

fn demo(args: &[&str], out: &Path) -> (bool, String) {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).parent().unwrap();
    let mut command = Command::new(root.join("scripts/demo.sh"));
    command.args(args).env("RLVR_DEMO_PROFILE", "debug").env("RLVR_DEMO_OUT", out);
    // As a user runs it: without the variables cargo sets for this test crate. demo.sh builds the
    // workspace (a no-op after scripts/test.sh's build), and some build scripts watch them —
    // ring's, CARGO_MANIFEST_DIR — so inherited they rebuilt ring, rustls and every crate above
    // them in the suite's own target directory, under its running tests, and the next build of
    // the suite did it all again.
    for (name, _) in std::env::vars_os() {
        let name = name.to_string_lossy();
        if [
            "CARGO_MANIFEST_",
            "CARGO_PKG_",
            "CARGO_CRATE_",
            "CARGO_BIN_",
            "CARGO_PRIMARY_",
            "CARGO_TARGET_TMPDIR",
        ]
        .iter()
        .any(|prefix| name.starts_with(prefix))
        {
            command.env_remove(name.as_ref());
        }
    }
    let output = command.output().expect("run scripts/demo.sh");
    let text =
        format!("{}{}", String::from_utf8_lossy(&output.stdout), String::from_utf8_lossy(&output.stderr));
    (output.status.success(), text)
}

/// The value printed after `label` on its own line, the last such line (`rlvrctl gates` prints a
/// `published:` line of the team's view, `registry:/LINE/VERSION`, before the demo's own).
fn printed<'a>(text: &'a str, label: &str) -> &'a str {
    text.lines()
        .rev()
        .find_map(|line| line.strip_prefix(label))
        .map(str::trim)
        .unwrap_or_else(|| panic!("no {label:?} in:\n{text}"))
}

/// The two runs are two tests, so that they run side by side: each is a whole pipeline of jobs.
#[test]
fn the_demo_publishes_a_gated_checkpoint() {
    let out = tempfile::tempdir().unwrap();
    let (ok, text) = demo(&[], out.path());
    assert!(ok, "{text}");
    assert!(text.contains("gates of job ") && text.contains(": PASSED"), "{text}");
    for criterion in ["heldout_gain", "canary_regressions", "kl", "length_ratio", "reward_hacking"] {
        assert!(text.contains(criterion), "{criterion} in the gate table:\n{text}");
    }
    let published = Path::new(printed(&text, "published:"));
    assert!(published.starts_with(out.path()), "{}", published.display());
    let manifest: Value =
        serde_json::from_slice(&std::fs::read(published.join("manifest.json")).unwrap()).unwrap();
    assert_eq!(manifest["gates"]["passed"], true);
    assert_eq!(manifest["spec"]["curriculum"]["plugin"], "frontier");
    let report = Path::new(printed(&text, "report:"));
    let html = std::fs::read_to_string(report).unwrap();
    assert!(html.contains("heldout_gain"), "the report has the gate table");
    assert!(report.with_file_name("reward.svg").is_file());
}

#[test]
fn the_demos_refusal_variant_is_refused_by_the_gates_and_says_why() {
    let out = tempfile::tempdir().unwrap();
    let (ok, text) = demo(&["--refuse"], out.path());
    assert!(ok, "{text}");
    assert!(text.contains(": REFUSED"), "{text}");
    let reason = printed(&text, "refused:");
    assert!(reason.starts_with("gates refused: heldout_gain: 0.0000 < 0.02"), "{reason}");
}
