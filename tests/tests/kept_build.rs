//! A kept target directory serves a new clone (`scripts/test.sh`'s build cache): after a build,
//! `scripts/source-mtimes.py record` notes each tracked file's content and time and each tracked
//! directory's entries and time; in a new clone, `restore` gives back the time of every file whose
//! content is the one recorded and of every directory whose entries are, so cargo rebuilds only
//! what depends on a change. A changed file, or a directory with an entry added or removed, keeps
//! the clone's time: cargo must see it.

use std::fs;
use std::path::Path;
use std::process::Command;
use std::time::{Duration, SystemTime};

use rlvr_tests::cli::text;
use rlvr_tests::workspace_root;

/// The time the recorded checkout's files and directories are given: long before any clone.
fn kept() -> SystemTime {
    SystemTime::UNIX_EPOCH + Duration::from_secs(1_000_000_000)
}

fn git(dir: &Path, args: &[&str]) {
    let output = Command::new("git")
        .args(["-c", "user.name=rlvr", "-c", "user.email=rlvr@localhost", "-c", "init.defaultBranch=main"])
        .args(args)
        .current_dir(dir)
        .output()
        .expect("run git");
    assert!(output.status.success(), "git {args:?}: {}", text(&output));
}

fn source_mtimes(checkout: &Path, verb: &str, manifest: &Path) -> String {
    let output = Command::new("python3")
        .arg(workspace_root().join("scripts/source-mtimes.py"))
        .arg(verb)
        .arg(manifest)
        .current_dir(checkout)
        .output()
        .expect("run python3 scripts/source-mtimes.py");
    assert!(output.status.success(), "source-mtimes.py {verb}: {}", text(&output));
    String::from_utf8_lossy(&output.stdout).into_owned()
}

fn set_time(path: &Path) {
    fs::File::open(path).unwrap().set_modified(kept()).unwrap();
}

fn modified(path: &Path) -> SystemTime {
    fs::metadata(path).unwrap().modified().unwrap()
}

#[test]
fn a_new_clone_gets_the_kept_builds_times_back_for_what_did_not_change() {
    // (what the new clone changes, paths that must get the kept time, paths that must not)
    type Change = fn(&Path);
    let cases: [(&str, Change, &[&str], &[&str]); 4] = [
        (
            "nothing",
            |_| {},
            &["src/lib.rs", "src/", "jobs/a.toml", "jobs/data/x.jsonl", "jobs/data/", "jobs/"],
            &[],
        ),
        (
            "a file's content",
            |clone| fs::write(clone.join("jobs/a.toml"), "changed = true\n").unwrap(),
            &["src/lib.rs", "jobs/data/x.jsonl", "jobs/"],
            &["jobs/a.toml"],
        ),
        (
            "a directory's entries: one removed",
            |clone| git(clone, &["rm", "-q", "jobs/data/y.jsonl"]),
            &["jobs/data/x.jsonl", "jobs/"],
            &["jobs/data/"],
        ),
        (
            "a directory's entries: one added",
            |clone| {
                fs::write(clone.join("jobs/b.toml"), "new = true\n").unwrap();
                git(clone, &["add", "jobs/b.toml"]);
            },
            &["jobs/a.toml", "jobs/data/"],
            &["jobs/", "jobs/b.toml"],
        ),
    ];

    let dir = tempfile::tempdir().unwrap();
    let origin = dir.path().join("kept");
    for (path, content) in [
        ("src/lib.rs", "pub fn f() {}\n"),
        ("jobs/a.toml", "a = 1\n"),
        ("jobs/data/x.jsonl", "{}\n"),
        ("jobs/data/y.jsonl", "{}\n"),
    ] {
        fs::create_dir_all(origin.join(path).parent().unwrap()).unwrap();
        fs::write(origin.join(path), content).unwrap();
    }
    git(dir.path(), &["init", "-q", "kept"]);
    git(&origin, &["add", "."]);
    git(&origin, &["commit", "-q", "-m", "sources"]);
    for path in
        ["src/lib.rs", "src", "jobs/a.toml", "jobs/data/x.jsonl", "jobs/data/y.jsonl", "jobs/data", "jobs"]
    {
        set_time(&origin.join(path));
    }

    for (case, change, keeps_kept_time, gets_clone_time) in cases {
        let manifest = dir.path().join("source-mtimes.tsv");
        let recorded = source_mtimes(&origin, "record", &manifest);
        assert!(recorded.contains("4 source files"), "{case}: {recorded}");

        let clone = dir.path().join(case.replace([' ', ':', '\''], "-"));
        git(dir.path(), &["clone", "-q", "kept", clone.to_str().unwrap()]);
        change(&clone);
        let restored = source_mtimes(&clone, "restore", &manifest);
        assert!(!manifest.exists(), "{case}: the manifest is consumed by a restore");
        for path in keeps_kept_time {
            assert_eq!(
                modified(&clone.join(path)),
                kept(),
                "{case}: {path} should have the kept time back ({restored})"
            );
        }
        for path in gets_clone_time {
            assert!(
                modified(&clone.join(path)) > kept(),
                "{case}: {path} must keep the clone's time ({restored})"
            );
        }
    }
}
