//! What crosses rlvr's process boundaries, as types both sides share, so that renaming a field is
//! a compile error rather than a silent "not checked" (design.md §2). No IO beyond the job
//! directory's own files; no Redis, no HTTP, no libtorch: every program links it.
//!
//! The modules (**pure**: no IO, no clock):
//! - [`spec`]: the job spec of design.md §1, parsed from TOML or JSON, with errors that name the
//!   field.
//! - [`job`]: job states, the allowed changes between them and the API's wire types. It holds
//!   `JobOutput`: what a job published (a line version with its directory, or a team dataset),
//!   one field of its record.
//! - [`kind`] (**pure**): `JobKind::of`, the one place a job's kind is decided.
//! - [`api`]: the daemon's own wire types (health, plugin listing, the dry-run of graders).
//! - [`batch`]: the verifier batch format's output line.
//! - [`time`]: timestamps on the wire.
//! - [`grants`]: the grant socket's messages between a worker and the scheduler.
//! - [`curricula`]: the shared curricula's versions, which the daemon writes and workers pin.
//! - [`worker`]: the worker protocol — its arguments (argv), exit statuses, outcome, logs,
//!   metrics and progress.
//! - [`gates`]: the gate report (`GateReport`), one status per criterion (`Status`), and the
//!   `Manifest`.
//! - [`engine`] (**pure**): `[engine]`, the one mapping of a job onto TRL's trainers and the
//!   contract its entry script reads.
//! - [`builtin`]: the optimizers built into the worker, `rejection-sampling` and `distill`.
//! - [`jobdir`]: where a job's files are, the one owner of the job directory's layout (below).
//! - [`checkpoints`] (**pure**): which checkpoints a run keeps, and which it offers the gates.
//! - [`formula`] (**pure**): a job's reward as a formula over its named graders
//!   (`[reward] formula`).
//! - [`fs`]: the one atomic file write.
//! - [`runtime`]: what the worker's libtorch can do on this host (`TorchRuntime`,
//!   `rlvr-worker doctor`), and the platform a run recorded (`RunPlatform`).
//! - [`memory`] (**pure**): a job's memory estimate (resident and per phase) from its model's
//!   shape and its spec.
//! - [`records`]: the data files' records, one reader for submit and the worker.
//! - [`reward_model`]: the built-in `reward-model` grader's keys.
//! - [`pipeline`]: multi-stage pipelines — the spec, its checks, a stage's input from the
//!   previous stage's output (`StageOutput`, `bind`), and the pipeline routes' wire types.
//! - [`names`]: the names a tenant writes (datasets, data roots, base models, model lines) and
//!   their rule; and a spec's forms as types: `PinnedSpec`, names pinned (what a record holds and
//!   a team sees), and `ServerSpec`, names resolved to the server's paths (what a worker reads).
//! - [`mod@env`]: `[env]`, a multi-turn job's environment, and its checks (**pure**); the
//!   environment check's answer.
//! - [`builtin_models`] (**pure**): the built-in models (`tiny-arith`, and the `random-*` ones:
//!   random weights at published models' shapes) and their `builtin:NAME?seed=N&layers=K`
//!   sources; the memory estimate's shapes come from here.
//! - [`signals`] (**pure**): why a job may not be learning (steps whose groups were all-fail or
//!   all-pass).
//! - [`tinker`]: the Tinker SDK's front door — `wire` its JSON messages, `proto` its protobuf
//!   messages mirrored from `protocol/proto/tinker_public.proto`, `datums` (**pure**: a request's
//!   datums read with every size checked), `loss` (**pure**: `loss_fn` and its options), `answers`
//!   (**pure**: the protobuf answers), `process` (the training client process's commands and
//!   events), `paths` (**pure**: `tinker://` paths in their team's directory, which a job's
//!   `model.policy` may name too).
//!
//! # The job directory
//!
//! `<state_dir>/jobs/<id>/` (`JobDir`): `spec.json`, `worker.log`, `mlflow.json`, `run/` (`RunDir`:
//! `job.json`, `metrics.jsonl`, `rollouts.jsonl`, `progress.json`, `tensorboard/`,
//! `checkpoints/LATEST`, `checkpoints/step-N/`). [`jobdir`], its one owner, draws it.

pub mod api;
pub mod batch;
pub mod builtin;
pub mod builtin_models;
pub mod checkpoints;
pub mod curricula;
pub mod engine;
pub mod env;
pub mod formula;
pub mod fs;
pub mod gates;
pub mod grants;
pub mod job;
pub mod jobdir;
pub mod kind;
pub mod memory;
pub mod names;
pub mod pipeline;
pub mod records;
pub mod reward_model;
pub mod runtime;
pub mod signals;
pub mod spec;
pub mod time;
pub mod tinker;
pub mod worker;
