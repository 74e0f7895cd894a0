//! What the worker's libtorch can do on this host, as the programs report it: libtorch's CUDA
//! half linked and loaded whenever the libtorch it was built against has one, `rlvr-worker doctor`
//! and `rlvrd doctor`, and a CUDA device refused with the reason where CUDA cannot run, never a
//! silent CPU run. On a GPU host (scripts/bench/gpu.sh) the same tests check the other side:
//! CUDA available, and a job on `cuda` runs.

use std::fs;
use std::path::Path;
use std::process::Command;

use object::Endianness;
use object::read::elf::Dyn;
use object::read::elf::ElfFile64;
use rlvr_protocol::runtime::TorchRuntime;
use rlvr_protocol::worker::WorkerExit;
use rlvr_tests::{arith_data, arith_grpo_spec, artifact, drop_in, plugin_lib};
use serde_json::Value;

/// `rlvr-worker doctor`'s report.
fn worker_doctor() -> TorchRuntime {
    let output = Command::new(artifact("rlvr-worker")).arg("doctor").output().unwrap();
    assert!(output.status.success(), "{}", String::from_utf8_lossy(&output.stderr));
    serde_json::from_slice(&output.stdout).expect("one TorchRuntime line")
}

/// The libraries a binary names as needed (its ELF dynamic section).
fn needed(binary: &Path) -> Vec<String> {
    let bytes = fs::read(binary).unwrap();
    let elf = ElfFile64::<Endianness>::parse(&*bytes).unwrap();
    let mut names = Vec::new();
    let endian = elf.endian();
    let table = elf.elf_section_table();
    let (dynamic, link) = table.dynamic(endian, &*bytes).unwrap().expect("a dynamic section");
    let strings = table.strings(endian, &*bytes, link).unwrap();
    for entry in dynamic {
        if entry.d_tag(endian) == object::elf::DT_NEEDED {
            names.push(String::from_utf8(entry.string(endian, strings).unwrap().to_vec()).unwrap());
        }
    }
    names
}

/// libtorch's CUDA half is dropped by the linker unless something keeps it (worker/build.rs):
/// wherever the libtorch the worker was built against has `libtorch_cuda.so`, the binary needs
/// `libtorch.so` (which needs both halves), and the running worker has CUDA loaded.
#[test]
fn the_worker_loads_libtorch_cuda_whenever_its_libtorch_has_it() {
    let runtime = worker_doctor();
    let dir = runtime.libtorch_dir.clone().expect("libtorch found");
    assert!(runtime.libtorch_version.as_deref().is_some_and(|v| v.starts_with("2.11.0")), "{runtime:?}");
    let has_cuda = Path::new(&dir).join("libtorch_cuda.so").exists();
    assert_eq!(runtime.cuda_built, has_cuda, "{runtime:?}");
    assert_eq!(runtime.cuda_loaded, has_cuda, "libtorch in {dir}: {runtime:?}");
    let needed = needed(&artifact("rlvr-worker"));
    assert!(needed.iter().any(|name| name == "libtorch_cpu.so"), "{needed:?}");
    if has_cuda {
        assert!(
            needed.iter().any(|name| name == "libtorch.so" || name == "libtorch_cuda.so"),
            "rlvr-worker does not keep libtorch's CUDA half: it needs {needed:?}"
        );
        // The versions of what libtorch loaded with it.
        for (what, version) in
            [("CUDA runtime", &runtime.cuda_runtime), ("cuBLAS", &runtime.cublas), ("NCCL", &runtime.nccl)]
        {
            assert!(version.is_some(), "{what} version missing: {runtime:?}");
        }
    }
}

/// Asked for `cuda` where CUDA cannot run, a worker exits 70 (the host's fault, not the job's)
/// naming `--device` and why, before writing anything; where CUDA runs, the job runs on it.
#[test]
fn a_cuda_device_where_cuda_cannot_run_is_refused_with_the_reason() {
    let runtime = worker_doctor();
    let dir = tempfile::tempdir().unwrap();
    let plugins = dir.path().join("plugins");
    fs::create_dir_all(&plugins).unwrap();
    for name in ["rlvr-optimizer-grpo", "rlvr-verifier-math"] {
        drop_in(&plugin_lib(name), &plugins, &format!("lib{}.so", name.replace('-', "_")));
    }
    let data = arith_data(dir.path(), &["--train", "16", "--heldout", "4", "--sft", "0"]);
    let spec = dir.path().join("job.toml");
    fs::write(&spec, arith_grpo_spec(&data, "on-cuda", "builtin:tiny-arith", 1, 1)).unwrap();
    let state = dir.path().join("run");
    let output = Command::new(artifact("rlvr-worker"))
        .args(["run", "--device", "cuda", "--spec"])
        .arg(&spec)
        .arg("--state-dir")
        .arg(&state)
        .arg("--plugin-dir")
        .arg(&plugins)
        .env("RLVR_LOG", "warn")
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&output.stderr);
    if runtime.cuda_available {
        assert!(output.status.success(), "{stderr}");
        let record: Value = serde_json::from_slice(&fs::read(state.join("job.json")).unwrap()).unwrap();
        assert!(record["platform"]["cuda_runtime"].is_string(), "{record}");
        return;
    }
    assert_eq!(output.status.code(), Some(WorkerExit::Transient.code() as i32), "{stderr}");
    assert!(stderr.contains("--device: cuda:0 was asked for but cannot be used"), "{stderr}");
    assert!(!state.join("job.json").exists(), "a refused run wrote job.json");
}

/// `rlvrd doctor` prints what the worker's libtorch can do and the devices; `--json` carries
/// the same report; it exits 0 unless the devices are GPUs the worker cannot use.
#[test]
fn rlvrd_doctor_reports_libtorch_cuda_and_the_devices() {
    let runtime = worker_doctor();
    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("rlvrd.toml");
    fs::write(
        &config,
        format!(
            "[daemon]\nstate_dir = {:?}\nworker_exe = {:?}\n",
            dir.path().join("state"),
            artifact("rlvr-worker")
        ),
    )
    .unwrap();
    let doctor = |extra: &[&str]| {
        Command::new(artifact("rlvrd"))
            .arg("doctor")
            .arg("--config")
            .arg(&config)
            .args(extra)
            .output()
            .unwrap()
    };
    let text = doctor(&[]);
    let stdout = String::from_utf8_lossy(&text.stdout);
    assert!(text.status.success(), "{stdout}\n{}", String::from_utf8_lossy(&text.stderr));
    let version = runtime.libtorch_version.clone().unwrap();
    for line in [format!("libtorch   {version}"), "CUDA       ".to_owned(), "devices\n".to_owned()] {
        assert!(stdout.contains(&line), "missing {line:?} in:\n{stdout}");
    }
    if runtime.cuda_loaded {
        assert!(stdout.contains(&format!("runtime {}", runtime.cuda_runtime.clone().unwrap())), "{stdout}");
    }
    let json = doctor(&["--json"]);
    let report: Value = serde_json::from_slice(&json.stdout).unwrap();
    let reported: TorchRuntime = serde_json::from_value(report["torch"].clone()).unwrap();
    assert_eq!(reported.libtorch_version, runtime.libtorch_version);
    assert!(!report["devices"].as_array().unwrap().is_empty(), "{report}");
}
