//! The integration tests, one binary: each module is a story over real processes (the daemon,
//! workers, Redis, plugin libraries, peers), run by `scripts/test.sh` through cargo-nextest,
//! which runs every test in a process of its own. One binary links the harness, libtorch and the
//! daemon's library once instead of once per file; `.config/nextest.toml` says which tests need
//! both cores and which only wait.

mod api_schema;
mod clients;
mod conformance;
mod cuda;
mod curriculum;
mod daemon;
mod demo;
mod distill;
mod engines;
mod estimate;
mod examples;
mod gates;
mod graders_dry_run;
mod graders_judge;
mod graders_python;
mod graders_text;
mod http_hardening;
mod jobs;
mod kept_build;
mod learning;
mod mlflow;
mod models_and_list;
mod no_torch;
mod outbound;
mod pipelines;
mod plugin_options;
mod plugins;
mod publish;
mod python_client;
mod reward_model;
mod reward_training;
mod sampling;
mod scheduling;
mod template_guide;
mod tenancy;
mod tensorboard;
mod ui;
mod verifier_code;
mod verifier_http;
mod verifier_ifeval;
mod verifier_math;
mod verify_cli;
mod worker;
