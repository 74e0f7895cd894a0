//! The README's "Write and drop in a verifier" guide, step by step: build the template crate,
//! drop its `.so` into a running daemon's plugin directory, see it listed, and use it through
//! `rlvrctl verify`.

use std::process::Command;
use std::time::Duration;

use rlvr_tests::{Daemon, TEAM_TOKEN, drop_in, json_lines, rlvrctl, target_dir, wait_until, workspace_root};

#[test]
fn the_guide_builds_drops_in_and_uses_the_template_verifier() {
    // Step 2 of the guide: build the plugin. A target directory of its own keeps this build out of
    // the way of the cargo that runs the tests; the workspace is named where the tests were built
    // from (a kept target directory's fixed link, scripts/test.sh), so a kept build stays fresh.
    let guide_target = target_dir().join("guide");
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".to_owned());
    let build = Command::new(cargo)
        .current_dir(workspace_root())
        .arg("build")
        .arg("--manifest-path")
        .arg(workspace_root().join("Cargo.toml"))
        .args(["-p", "rlvr-verifier-template", "--target-dir"])
        .arg(&guide_target)
        .output()
        .expect("run cargo build");
    assert!(build.status.success(), "cargo build failed:\n{}", String::from_utf8_lossy(&build.stderr));
    let library = guide_target.join("debug/librlvr_verifier_template.so");
    assert!(library.exists(), "{} was not built", library.display());

    // Step 3: drop it into the running daemon's plugin directory (copy, then rename).
    let daemon = Daemon::start(&["rlvr-verifier-format"], "redis://127.0.0.1:1");
    drop_in(&library, &daemon.plugins, "librlvr_verifier_template.so");

    // Step 4: `rlvrctl plugins` lists it.
    let listed = wait_until(Duration::from_secs(20), || {
        let output = rlvrctl(&["--server", &daemon.url, "--token", TEAM_TOKEN, "plugins"], b"");
        String::from_utf8_lossy(&output.stdout)
            .lines()
            .any(|line| line.starts_with("exact-match ") && line.contains("verifier"))
    });
    assert!(listed, "exact-match never listed; daemon log:\n{}", daemon.log());

    // Step 5: it answers `rlvrctl verify`.
    let input = b"{\"id\":\"right\",\"completion\":\" 42 \",\"reference\":{\"answer\":\"42\"}}\n\
                  {\"id\":\"wrong\",\"completion\":\"41\",\"gold\":\"42\"}\n\
                  {\"id\":\"no-answer\",\"completion\":\"41\",\"reference\":{}}\n";
    let output = rlvrctl(
        &["verify", "--plugin", "exact-match", "--plugin-dir", daemon.plugins.to_str().unwrap()],
        input,
    );
    assert!(output.status.success(), "{}", String::from_utf8_lossy(&output.stderr));
    let lines = json_lines(&output.stdout);
    let got: Vec<(&str, bool, Option<&str>)> = lines
        .iter()
        .map(|l| (l["id"].as_str().unwrap(), l["passed"].as_bool().unwrap(), l["error"].as_str()))
        .collect();
    assert_eq!(
        got,
        [
            ("right", true, None),
            ("wrong", false, None),
            ("no-answer", false, Some("invalid input: reference.answer: expected a string")),
        ]
    );
}

#[test]
fn the_book_shows_the_template_as_it_is() {
    let page = workspace_root().join("docs/src/plugins/verifier.md");
    let readme = std::fs::read_to_string(page).unwrap();
    let source =
        std::fs::read_to_string(workspace_root().join("plugins/verifier-template/src/lib.rs")).unwrap();
    let code: Vec<&str> = source.lines().filter(|line| !line.starts_with("//!")).collect();
    let shown: String = code
        .join("\n")
        .trim_matches('\n')
        .lines()
        .map(|line| if line.is_empty() { String::new() } else { format!("   {line}") })
        .collect::<Vec<_>>()
        .join("\n");
    assert!(
        readme.contains(&shown),
        "docs/src/plugins/verifier.md's template listing differs from plugins/verifier-template/src/lib.rs"
    );
    assert!(code.len() <= 40, "the template should stay about 30 lines, it has {}", code.len());
}
