//! What the sandboxed graders' tests (`verifier_code.rs`, `graders_python.rs`) check after a
//! batch: nothing left running or on disk, and the canary file beside the work root untouched.

use std::fs;
use std::path::Path;
use std::time::Duration;

/// The canary file's text: a grader that writes outside its sandbox would change it.
pub const CANARY_TEXT: &str = "canary: untouched\n";

/// Writes `dir/canary.txt`, the one file the sandboxed code must never change.
pub fn write_canary(dir: &Path) -> std::path::PathBuf {
    let canary = dir.join("canary.txt");
    fs::write(&canary, CANARY_TEXT).expect("write the canary");
    canary
}

/// No sandboxed or evaluator process is left (none has its cwd under `work_root`) and the work
/// root is empty. The batch is over when rlvrctl exits; the kernel gets a moment to finish the
/// kills.
pub fn assert_nothing_left(work_root: &Path) {
    let leftover = || -> Vec<String> {
        let mut found = Vec::new();
        for entry in fs::read_dir("/proc").unwrap().flatten() {
            if let Ok(cwd) = fs::read_link(entry.path().join("cwd"))
                && cwd.starts_with(work_root)
            {
                let cmdline = fs::read(entry.path().join("cmdline")).unwrap_or_default();
                found.push(format!("{:?}: {}", entry.file_name(), String::from_utf8_lossy(&cmdline)));
            }
        }
        found
    };
    let clean = crate::wait_until(Duration::from_secs(5), || leftover().is_empty());
    assert!(clean, "processes left behind: {:?}", leftover());
    let entries: Vec<_> = fs::read_dir(work_root).unwrap().flatten().map(|e| e.path()).collect();
    assert!(entries.is_empty(), "work directories left behind: {entries:?}");
}

/// `canary_dir` holds only the canary, unchanged.
pub fn assert_canary_untouched(canary_dir: &Path) {
    let names: Vec<_> = fs::read_dir(canary_dir).unwrap().flatten().map(|e| e.file_name()).collect();
    assert_eq!(names, ["canary.txt"], "files appeared next to the canary");
    assert_eq!(fs::read_to_string(canary_dir.join("canary.txt")).unwrap(), CANARY_TEXT);
}
