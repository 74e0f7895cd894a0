//! The book (`docs/`): built by the real mdBook (`scripts/setup.sh` installs it into the cache and
//! names it in `RLVR_MDBOOK`), every page in `SUMMARY.md`, and every link of the built HTML — to
//! a page, an anchor, an image, a file of mdBook's own — resolved; the README's links too, and README.md and ARCHITECTURE.md within their sizes.

use std::collections::{BTreeMap, BTreeSet};
use std::fs;
use std::path::{Path, PathBuf};

use rlvr_tests::{build_book, workspace_root};

/// Every file under `dir` whose name ends with `extension`.
fn files(dir: &Path, extension: &str, found: &mut Vec<PathBuf>) {
    for entry in fs::read_dir(dir).unwrap().flatten() {
        let path = entry.path();
        if path.is_dir() {
            files(&path, extension, found);
        } else if path.to_string_lossy().ends_with(extension) {
            found.push(path);
        }
    }
}

/// The values of `attribute="…"` in `html`.
fn attribute_values<'a>(html: &'a str, attribute: &str) -> Vec<&'a str> {
    let needle = format!(" {attribute}=\"");
    html.match_indices(&needle)
        .filter_map(|(at, _)| {
            let rest = &html[at + needle.len()..];
            rest.find('"').map(|end| &rest[..end])
        })
        .collect()
}

#[test]
fn the_book_builds_lists_every_page_and_has_no_broken_link() {
    let root = workspace_root();
    let src = root.join("docs/src");
    // Every page is in the summary (mdBook builds only what it lists).
    let summary = fs::read_to_string(src.join("SUMMARY.md")).unwrap();
    let mut pages = Vec::new();
    files(&src, ".md", &mut pages);
    let unlisted: Vec<String> = pages
        .iter()
        .map(|page| page.strip_prefix(&src).unwrap().display().to_string())
        .filter(|page| page != "SUMMARY.md" && !summary.contains(&format!("]({page})")))
        .collect();
    assert!(unlisted.is_empty(), "pages SUMMARY.md does not list: {unlisted:?}");

    let out = tempfile::tempdir().unwrap();
    let log = build_book(out.path());
    assert!(!log.contains("ERROR") && !log.contains("WARN"), "mdbook build:\n{log}");

    let mut html = Vec::new();
    files(out.path(), ".html", &mut html);
    let ids = |page: &Path| -> BTreeSet<String> {
        let text = fs::read_to_string(page).unwrap_or_default();
        attribute_values(&text, "id").into_iter().map(str::to_owned).collect()
    };
    let mut anchors: BTreeMap<PathBuf, BTreeSet<String>> = BTreeMap::new();
    let mut broken = Vec::new();
    for page in &html {
        if page.file_name().is_some_and(|name| name == "404.html") {
            // mdBook's page for a server's misses: its links start at the site's root, wherever
            // the book is served from.
            continue;
        }
        let text = fs::read_to_string(page).unwrap();
        let links = attribute_values(&text, "href").into_iter().chain(attribute_values(&text, "src"));
        for link in links {
            if link.contains("://") || link.starts_with("mailto:") || link.starts_with("javascript:") {
                continue;
            }
            let (path, anchor) = link.split_once('#').unwrap_or((link, ""));
            let target = if path.is_empty() { page.clone() } else { page.parent().unwrap().join(path) };
            let target = if target.is_dir() { target.join("index.html") } else { target };
            let name = page.strip_prefix(out.path()).unwrap().display().to_string();
            if !target.is_file() {
                broken.push(format!("{name}: {link}"));
            } else if !anchor.is_empty() && target.extension().is_some_and(|e| e == "html") {
                let known = anchors.entry(target.clone()).or_insert_with(|| ids(&target));
                if !known.contains(anchor) {
                    broken.push(format!("{name}: {link} (no such anchor)"));
                }
            }
        }
    }
    assert!(html.len() > 20, "the book has {} pages", html.len());
    assert!(broken.is_empty(), "{} broken links in the built book:\n{}", broken.len(), broken.join("\n"));
}

#[test]
fn the_readme_and_architecture_stay_short_and_the_readmes_links_name_files_that_exist() {
    let architecture = fs::metadata(workspace_root().join("ARCHITECTURE.md")).unwrap().len();
    assert!(
        architecture <= 25_000,
        "ARCHITECTURE.md has {architecture} bytes: per-file detail goes to the crates' docs"
    );
    let root = workspace_root();
    let readme = fs::read_to_string(root.join("README.md")).unwrap();
    let broken: Vec<&str> = readme
        .match_indices("](")
        .filter_map(|(at, _)| {
            let rest = &readme[at + 2..];
            rest.find(')').map(|end| &rest[..end])
        })
        .filter(|link| !link.contains("://") && !link.starts_with('#'))
        .filter(|link| !root.join(link.split('#').next().unwrap()).exists())
        .collect();
    assert!(broken.is_empty(), "README.md links to files that do not exist: {broken:?}");
    let lines = readme.lines().count();
    assert!(lines <= 250, "README.md has {lines} lines: the book is where the rest goes");
}
