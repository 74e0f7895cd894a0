//! The control plane, `rlvrd serve`: the HTTP API, the queue consumer and the supervision of
//! each job's worker process, the scheduler, the gates and publishing, the shared curricula.
//! It never touches a tensor: this crate does not depend on libtorch, and its plugin registry
//! only probes optimizer plugins in a worker process (see ARCHITECTURE.md).
//!
//! `main` is thin: it parses arguments and calls into here, so the whole server runs in-process
//! in tests.
pub mod api;
pub mod arith;
pub mod config;
pub mod curricula;
pub mod doctor;
pub mod health;
pub mod jobs;
pub mod metrics;
pub mod pipelines;
pub mod sched;
pub mod serve;
pub mod state_dir;
pub mod tenancy;
pub mod tinker;

#[cfg(test)]
mod layering {
    use std::path::Path;

    /// Every `.rs` file under `dir`, with its text.
    fn sources(dir: &Path) -> Vec<(String, String)> {
        let mut files = Vec::new();
        for entry in std::fs::read_dir(dir).unwrap() {
            let path = entry.unwrap().path();
            if path.is_dir() {
                files.extend(sources(&path));
            } else if path.extension().is_some_and(|ext| ext == "rs") {
                files.push((path.display().to_string(), std::fs::read_to_string(&path).unwrap()));
            }
        }
        files
    }

    // The use cases (jobs, pipelines) and the policies under them are called by the HTTP layer,
    // never the other way round: a use case that reached into `api` would answer in statuses.
    #[test]
    fn nothing_under_the_http_layer_imports_from_it() {
        let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
        for layer in ["jobs", "pipelines", "tenancy", "sched", "tinker"] {
            for (file, text) in sources(&root.join(layer)) {
                for (number, line) in text.lines().enumerate() {
                    let code = line.split("//").next().unwrap_or_default();
                    assert!(
                        !code.contains("crate::api") && !code.contains("super::super::api"),
                        "{file}:{}: {line}",
                        number + 1
                    );
                }
            }
        }
    }
}
