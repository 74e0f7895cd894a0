//! The integration tests: each module is a story over real processes (the daemon, workers,
//! Redis, plugin libraries, peers), run by `scripts/test.sh` through cargo-nextest, which runs
//! every test in a process of its own. Two binaries instead of one per file: this one, which
//! does not link libtorch, and `torch` (`torch.rs`), the stories that hold tensors in the test
//! process itself — every process of a binary that links libtorch spends ~0.35 s of CPU loading
//! it, ~1 minute of the suite's over its 160 tests here. `.config/nextest.toml` says which tests
//! need both cores and which only wait.

mod api_schema;
mod chaos;
mod clients;
mod cuda;
mod curriculum;
mod daemon;
mod demo;
mod distill;
mod docs;
mod engines;
mod env;
mod examples;
mod full_disk;
mod gates;
mod graders_dry_run;
mod graders_judge;
mod graders_python;
mod graders_text;
mod http_hardening;
mod jobs;
mod kept_build;
mod learning;
mod memcheck;
mod mlflow;
mod models_and_list;
mod no_torch;
mod outbound;
mod pipelines;
mod plugin_options;
mod plugins;
mod publish;
mod python_client;
mod sampling;
mod scheduling;
mod template_guide;
mod tenancy;
mod tensorboard;
mod tinker;
mod ui;
mod verifier_code;
mod verifier_http;
mod verifier_ifeval;
mod verifier_math;
mod verify_cli;
mod vllm;
