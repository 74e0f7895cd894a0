//! `rlvr-worker`: one job's training process, started by `rlvrd serve` for each admitted job (or
//! by hand, without Redis). `run` trains; `probe-plugin` loads one plugin library for the
//! daemon's registry, and `check-options` asks one about a job's options at submit, each in a
//! process that can crash without harm (and that may link libtorch, which the daemon never does);
//! `doctor` reports what its libtorch can do on this host; `env-check` plays an `[env]` spec's
//! first episodes and shows what its job would train on.

use std::process::ExitCode;

use clap::{Parser, Subcommand};
use rlvr_protocol::spec::Dtype;
use rlvr_protocol::worker::{EnvCheckArgs, HostContext, LastWord, TinkerClientArgs, WorkerArgs, WorkerExit};
use rlvr_startup::logging::{self, LogFormat};
use rlvr_worker::host::read_host_context;
use rlvr_worker::{Outcome, WorkerError, WorkerOptions, lifecycle, memory};

/// The rlvr worker: trains one job end to end (rollout, verification, updates, checkpoints).
#[derive(Parser)]
#[command(name = "rlvr-worker", version)]
struct Cli {
    /// Log line format on stderr (level from RLVR_LOG, default info).
    #[arg(long, value_enum, default_value_t, global = true)]
    log_format: LogFormat,
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Run one job end to end without Redis: rollout, verification, updates, checkpoints. Prints
    /// the outcome (steps, weights hash, held-out before/after, checkpoint) as JSON on stdout.
    Run(Box<WorkerArgs>),
    /// Load one plugin library, check it and run its self-test; print a JSON report. The daemon
    /// runs this in a child process so a crashing library cannot take it down.
    #[command(hide = true)]
    ProbePlugin {
        /// The library.
        library: std::path::PathBuf,
    },
    /// Ask one plugin library whether it accepts a configuration (its `check_options`); print
    /// the answer as one JSON line. The daemon runs this at submit for optimizer plugins, whose
    /// code it never loads.
    #[command(hide = true)]
    CheckOptions {
        /// The library (the daemon's content-addressed copy, already probed).
        #[arg(long)]
        plugin_path: std::path::PathBuf,
        /// The plugin's options, as the JSON object it would be created with.
        #[arg(long)]
        options_json: String,
    },
    /// Play the first episodes of an `[env]` job's spec against its environment with its policy
    /// (a model directory or builtin:tiny-arith), sampled as its rollouts are, and print each turn
    /// with what is trained on (the model's turns) and what is masked out (the environment's
    /// replies). Nothing is trained or written.
    EnvCheck(EnvCheckArgs),
    /// A Tinker training client (the daemon's, for a team's own training loop): a base model with
    /// the client's LoRA adapter, serving the daemon's commands on stdin, one JSON line each,
    /// answered on stdout.
    #[command(hide = true)]
    TinkerClient(TinkerClientArgs),
    /// Write a model (a built-in one, `builtin:random-qwen2.5-0.5b?seed=1`, or a directory) as a
    /// Hugging Face directory: the same weights for a peer (transformers, TRL, vLLM) that a job
    /// on the built-in model trains. Prints `{source, dir, parameters, dtype}` as one JSON line.
    ExportModel {
        /// `builtin:NAME[?seed=N][&layers=K]`, a model directory or an adapter directory.
        source: String,
        /// The directory to write; it must not exist (written whole or not at all).
        #[arg(long)]
        out: std::path::PathBuf,
        /// The weights' dtype.
        #[arg(long, value_enum, default_value = "f32")]
        dtype: ExportDtype,
    },
    /// Report what this process's libtorch can do: its version and directory, whether CUDA is
    /// loaded and available, the CUDA runtime, driver, cuDNN, NCCL and cuBLAS versions, the CPU
    /// matmul path, and what is wrong; one JSON line (`rlvrd doctor` prints it for people).
    #[command(hide = true)]
    Doctor,
}

/// `export-model --dtype`.
#[derive(Clone, Copy, clap::ValueEnum)]
enum ExportDtype {
    F32,
    Bf16,
}

/// `eprintln!` that never panics: stderr is the run's log file, which a full disk can refuse, and
/// a failed write must not turn the exit status the daemon reads into a panic's.
macro_rules! say {
    ($($arg:tt)*) => {{
        use std::io::Write as _;
        let _ = writeln!(std::io::stderr(), $($arg)*);
    }};
}

/// cuBLAS picks a reduction order per call from its workspace unless its workspace is fixed:
/// with this setting (NVIDIA's documented one for reproducible results, 8 buffers of 4 MiB per
/// handle) and libtorch's deterministic algorithms, a CUDA run repeats to the bit.
const CUBLAS_WORKSPACE: (&str, &str) = ("CUBLAS_WORKSPACE_CONFIG", ":4096:8");

fn main() -> ExitCode {
    // First, while the process has one thread, and before any cuBLAS handle exists; an
    // operator's own setting stands.
    if std::env::var_os(CUBLAS_WORKSPACE.0).is_none() {
        // SAFETY: no other thread exists yet to read the environment concurrently.
        unsafe { std::env::set_var(CUBLAS_WORKSPACE.0, CUBLAS_WORKSPACE.1) };
    }
    let cli = Cli::parse();
    // The http verifier's client needs a rustls provider in the process that loads it.
    rlvr_startup::install_crypto_provider();
    match cli.command {
        // stdout carries the answer; logs stay off it.
        Command::ProbePlugin { library } => {
            print_line("probe-plugin", &rlvr_plugin_host::registry::probe_main(&library))
        }
        Command::CheckOptions { plugin_path, options_json } => {
            print_line("check-options", &rlvr_plugin_host::options::check_main(&plugin_path, &options_json))
        }
        Command::Doctor => print_line("doctor", &rlvr_worker::runtime::report()),
        Command::ExportModel { source, out, dtype } => {
            let dtype = match dtype {
                ExportDtype::F32 => Dtype::F32,
                ExportDtype::Bf16 => Dtype::Bf16,
            };
            match rlvr_worker::models::export(&source, &out, dtype) {
                Ok(exported) => print_line("export-model", &exported),
                Err(message) => {
                    say!("rlvr-worker export-model: {message}");
                    ExitCode::from(WorkerExit::JobError.code())
                }
            }
        }
        Command::EnvCheck(args) => env_check(&args),
        Command::TinkerClient(args) => tinker_client(&args, cli.log_format),
        Command::Run(args) => {
            logging::init(cli.log_format, "info");
            ExitCode::from(run(*args).code())
        }
    }
}

/// `env-check`: the check as text, or one JSON line for the daemon; an error on stderr as
/// `rlvr-worker env-check: FIELD: why`, exit 2.
fn env_check(args: &EnvCheckArgs) -> ExitCode {
    if let Some(parent) = args.exit_with_parent {
        lifecycle::exit_with_parent(parent);
    }
    let host = match args.host_context_stdin.then(|| read_host_context(std::io::stdin().lock())).transpose() {
        Ok(host) => host.unwrap_or_else(HostContext::unrestricted),
        Err(error) => {
            say!("rlvr-worker env-check: {error}");
            return ExitCode::from(WorkerExit::JobError.code());
        }
    };
    match rlvr_worker::env_check::check(args, &host) {
        Ok(check) if args.json => print_line("env-check", &check),
        Ok(check) => {
            print!("{}", check.render());
            ExitCode::SUCCESS
        }
        Err(message) => {
            say!("rlvr-worker env-check: {message}");
            ExitCode::from(WorkerExit::JobError.code())
        }
    }
}

/// `tinker-client`: serves until stdin closes or a suspend; a failure on stderr, exit 70 (not
/// the team's: the daemon fails the client's pending requests as the server's).
fn tinker_client(args: &TinkerClientArgs, log_format: LogFormat) -> ExitCode {
    // Logs go to stderr: stdout carries the events.
    logging::init(log_format, "info");
    if let Some(parent) = args.exit_with_parent {
        lifecycle::exit_with_parent(parent);
    }
    match rlvr_worker::tinker::serve::serve(args, std::io::stdin().lock(), std::io::stdout().lock()) {
        Ok(()) => ExitCode::SUCCESS,
        Err(message) => {
            say!("rlvr-worker tinker-client: {message}");
            ExitCode::from(WorkerExit::Transient.code())
        }
    }
}

/// A helper command's answer: one JSON line on stdout.
fn print_line(command: &str, answer: &impl serde::Serialize) -> ExitCode {
    match serde_json::to_string(answer) {
        Ok(line) => {
            println!("{line}");
            ExitCode::SUCCESS
        }
        Err(error) => {
            say!("rlvr-worker {command}: cannot encode the answer: {error}");
            ExitCode::FAILURE
        }
    }
}

/// Trains, prints the outcome and says how the process ends.
fn run(args: WorkerArgs) -> WorkerExit {
    // Before anything else: the daemon writes the line as soon as the process starts.
    let host = match args.host_context_stdin.then(|| read_host_context(std::io::stdin().lock())).transpose() {
        Ok(host) => host,
        Err(error) => {
            last_word(&error.to_string());
            return error.exit();
        }
    };
    // Before any other thread starts, so that every one blocks the stop signals.
    lifecycle::install_stop_handlers();
    if let Some(parent) = args.exit_with_parent {
        lifecycle::exit_with_parent(parent);
    }
    let train = || -> Result<Outcome, WorkerError> {
        let options = WorkerOptions::from_args(args, host)?;
        rlvr_worker::run(&options)
    };
    // A panic in libtorch glue is a bug, but it still ends as one line and an exit status.
    match std::panic::catch_unwind(std::panic::AssertUnwindSafe(train)) {
        Ok(Ok(outcome)) => {
            println!("{}", serde_json::to_string(&outcome).unwrap_or_default());
            if outcome.interrupted { WorkerExit::Interrupted } else { WorkerExit::Finished }
        }
        Ok(Err(error)) => {
            last_word(&error.to_string());
            match memory::out_of_memory(&error.to_string()) {
                // libtorch could not allocate: the job needs more memory than it has.
                Some(report) => {
                    last_word(&report.to_string());
                    WorkerExit::OutOfMemory
                }
                None => error.exit(),
            }
        }
        Err(payload) => {
            if let Some(message) = determinism_refusal(&payload) {
                // The job's choice, not our bug: a retry would meet the same operation.
                last_word(&message);
                return WorkerExit::JobError;
            }
            if let Some(report) = panic_text(&payload).and_then(memory::out_of_memory) {
                // tch's unchecked calls panic with libtorch's error: an allocation failure is
                // the job's size, not our bug.
                last_word(&report.to_string());
                return WorkerExit::OutOfMemory;
            }
            last_word("internal error (a panic, reported above); the last checkpoint is intact");
            WorkerExit::Transient
        }
    }
}

/// The run's error, in its log (`rlvr-worker: …`) and on stdout as a [`LastWord`] line, which
/// reaches the daemon when a full disk refuses the log's.
fn last_word(message: &str) {
    say!("rlvr-worker: {message}");
    if let Ok(line) = serde_json::to_string(&LastWord { last_word: message.to_owned() }) {
        use std::io::Write as _;
        let mut stdout = std::io::stdout().lock();
        let _ = writeln!(stdout, "{line}").and_then(|()| stdout.flush());
    }
}

/// A panic's message, when it carries one.
fn panic_text(payload: &(dyn std::any::Any + Send)) -> Option<&str> {
    payload.downcast_ref::<String>().map(String::as_str).or_else(|| payload.downcast_ref::<&str>().copied())
}

/// The line for a panic that is libtorch refusing an operation without a deterministic kernel,
/// which `[checkpoint] exact_resume` asked for on CUDA.
fn determinism_refusal(payload: &(dyn std::any::Any + Send)) -> Option<String> {
    let text = panic_text(payload)?;
    rlvr_model::cuda_settings::is_determinism_refusal(text).then(|| {
        let operation = text.split(" does not have").next().unwrap_or_default();
        let operation = operation.rsplit(['"', '(']).next().unwrap_or(operation);
        format!(
            "checkpoint.exact_resume: `{operation}` has no deterministic implementation on this device; \
             set [checkpoint] exact_resume = false to let it run (a resumed run then no longer ends \
             bit-identically); the last checkpoint is intact"
        )
    })
}

#[cfg(test)]
mod tests {
    /// The book's reference of this program (`docs/src/reference/cli/rlvr-worker.md`) is its help,
    /// rendered by clap-markdown: `UPDATE_EXPECT=1 cargo test -p rlvr-worker reference` after changing
    /// a command.
    #[test]
    fn the_books_reference_is_this_programs_help() {
        let options = clap_markdown::MarkdownOptions::new()
            .title("`rlvr-worker`".to_owned())
            .show_footer(false)
            .show_table_of_contents(false);
        expect_test::expect_file!["../../docs/src/reference/cli/rlvr-worker.md"]
            .assert_eq(&clap_markdown::help_markdown_custom::<super::Cli>(&options));
    }

    use std::ffi::OsString;

    use super::*;

    /// A panic that is libtorch refusing an operation under deterministic algorithms (as a tch
    /// wrapper panics: `put_` without accumulation is refused on a CPU too) names the operation
    /// and the spec key, and is the job's error; any other panic is not recognised.
    #[test]
    fn a_determinism_refusal_names_the_operation_and_exact_resume() {
        let target = tch::Tensor::zeros([4], (tch::Kind::Float, tch::Device::Cpu));
        rlvr_model::cuda_settings::set_deterministic(true).unwrap();
        let refused = std::panic::catch_unwind(|| {
            target.put(&tch::Tensor::from_slice(&[1i64]), &tch::Tensor::from_slice(&[2f32]), false)
        });
        rlvr_model::cuda_settings::set_deterministic(false).unwrap();
        let message = determinism_refusal(&*refused.expect_err("put_ panics")).expect("recognised");
        assert!(message.starts_with("checkpoint.exact_resume: `put_` has no deterministic"), "{message}");
        assert!(message.contains("exact_resume = false"), "{message}");
        let other = std::panic::catch_unwind(|| panic!("index out of bounds")).unwrap_err();
        assert_eq!(determinism_refusal(&*other), None);
    }

    /// libtorch failing to allocate (a petabyte on the CPU), as a tch error and as the panic of
    /// tch's unchecked call, is an out-of-memory report; other failures are not.
    #[test]
    fn a_libtorch_allocation_failure_is_an_out_of_memory_report() {
        let huge = [1i64 << 48];
        let error = tch::Tensor::f_empty(huge, (tch::Kind::Float, tch::Device::Cpu)).unwrap_err();
        let report = memory::out_of_memory(&error.to_string()).expect("recognised");
        // Nothing watched in this test binary: the device is unknown, the cap none.
        assert_eq!(report.cap_bytes, None);
        assert!(report.to_string().starts_with("out of memory on "), "{report}");
        let panic =
            std::panic::catch_unwind(|| tch::Tensor::empty(huge, (tch::Kind::Float, tch::Device::Cpu)))
                .unwrap_err();
        assert!(panic_text(&*panic).and_then(memory::out_of_memory).is_some());
        let other = std::panic::catch_unwind(|| panic!("index out of bounds")).unwrap_err();
        assert_eq!(panic_text(&*other).and_then(memory::out_of_memory), None);
    }

    /// The daemon writes the arguments ([`WorkerArgs::command_line`]) and this binary parses them:
    /// every field survives.
    #[test]
    fn the_arguments_round_trip_through_the_command_line() {
        let full = WorkerArgs {
            spec: "/jobs/a/spec.json".into(),
            state_dir: "/jobs/a/run".into(),
            resume: true,
            plugin_dirs: vec!["/p1".into(), "/p 2".into()],
            plugin_files: vec!["/cache/libgrpo-0a.so".into(), "/cache/lib math-1b.so".into()],
            config: Some("/etc/rlvr/rlvrd.toml".into()),
            device: Some("cuda".into()),
            verify_parallel: Some(3),
            threads: Some(2),
            exit_with_parent: Some(42),
            grant_socket: Some("/state/sched.sock".into()),
            job_id: Some("01J".into()),
            baseline: Some("/registry/line/3".into()),
            baseline_version: Some(3),
            curricula_dir: Some("/state/curricula".into()),
            curriculum_version: Some(5),
            host_context_stdin: true,
            memory_cap: Some(1 << 30),
            engine_python: Some("/cache/venvs/engine-trl/bin/python".into()),
            vllm_python: Some("/cache/venvs/vllm/bin/python".into()),
            env_script: Some("/opt/environments/arith.py".into()),
            env_python: Some("/cache/venvs/openenv/bin/python".into()),
            verify_url: Some("http://127.0.0.1:8080/v1/verify".into()),
            ray_address: Some("http://127.0.0.1:8265".into()),
            ray_python: Some("/cache/venvs/engine-ray/bin/python".into()),
            kind: Some(rlvr_protocol::kind::JobKind::RewardModel),
        };
        let bare = WorkerArgs { spec: "s.toml".into(), state_dir: "run".into(), ..WorkerArgs::default() };
        for args in [full, bare] {
            let line = std::iter::once(OsString::from("rlvr-worker")).chain(args.command_line());
            match Cli::try_parse_from(line).unwrap().command {
                Command::Run(parsed) => assert_eq!(*parsed, args),
                Command::ProbePlugin { .. }
                | Command::CheckOptions { .. }
                | Command::Doctor
                | Command::ExportModel { .. }
                | Command::EnvCheck(_)
                | Command::TinkerClient(_) => {
                    panic!("parsed as another command")
                }
            }
        }
        let full = EnvCheckArgs {
            spec: "s.toml".into(),
            episodes: 3,
            env_script: Some("/envs/arith.py".into()),
            env_python: Some("/venvs/openenv/bin/python".into()),
            json: true,
            threads: Some(2),
            exit_with_parent: Some(42),
            host_context_stdin: true,
        };
        let client = TinkerClientArgs {
            base: "builtin:tiny-arith".into(),
            base_name: "Qwen/Qwen3-8B".into(),
            lora: r#"{"rank":8}"#.into(),
            seed: 3,
            resume: Some("/state/suspended".into()),
            device: Some("cpu".into()),
            threads: Some(1),
            exit_with_parent: Some(7),
            grant_socket: Some("/run/grants.sock".into()),
            job_id: Some("s:train:0".into()),
            ..TinkerClientArgs::default()
        };
        // --resume and --from-state exclude each other.
        let from_state = TinkerClientArgs {
            resume: None,
            from_state: Some("/tinker/math/s:train:0/weights/a".into()),
            with_optimizer: true,
            ..client.clone()
        };
        for client in [client, from_state] {
            let line = std::iter::once(OsString::from("rlvr-worker")).chain(client.command_line());
            match Cli::try_parse_from(line).unwrap().command {
                Command::TinkerClient(parsed) => assert_eq!(parsed, client),
                _ => panic!("parsed as another command"),
            }
        }
        let bare = EnvCheckArgs { spec: "s.toml".into(), episodes: 2, ..EnvCheckArgs::default() };
        for args in [full, bare] {
            let line = std::iter::once(OsString::from("rlvr-worker")).chain(args.command_line());
            match Cli::try_parse_from(line).unwrap().command {
                Command::EnvCheck(parsed) => assert_eq!(parsed, args),
                _ => panic!("parsed as another command"),
            }
        }
    }
}
