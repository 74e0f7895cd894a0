//! Links libtorch so that its CUDA half is loaded, and records libtorch's directory as the
//! binaries' run path.
//!
//! CUDA: torch-sys links `libtorch_cpu` and `libtorch_cuda`, but the linker's default
//! `--as-needed` drops `libtorch_cuda.so` because no symbol of it is referenced (its operators
//! register themselves when it is loaded). Without it libtorch reports no CUDA and
//! `Device::cuda_if_available()` trains on the CPU of a GPU host. Linking `libtorch.so` (the
//! library that needs both halves) with `--no-as-needed` keeps it in the binary's dependencies;
//! for a CPU-only libtorch it needs only `libtorch_cpu.so`, so the same lines serve both builds
//! (torch-sys' build script and tch-rs issues 907/980 describe the drop). Plugins loaded into the
//! worker need nothing: the process has libtorch_cuda already.
//!
//! Run path: `rlvr-worker` then starts without `LD_LIBRARY_PATH` on the machine it was built on.
//! torch-sys publishes the directory to crates that depend on it directly (`links = "tch"` →
//! `DEP_TCH_LIBTORCH_LIB`). It is a RUNPATH, searched after `LD_LIBRARY_PATH`: elsewhere (a
//! service user who cannot read the builder's home, a GPU host with its own torch 2.11.0)
//! `LD_LIBRARY_PATH` names libtorch (systemd/rlvrd.service).
fn main() {
    println!("cargo:rerun-if-env-changed=DEP_TCH_LIBTORCH_LIB");
    if let Ok(dir) = std::env::var("DEP_TCH_LIBTORCH_LIB") {
        println!("cargo:rustc-link-search=native={dir}");
        println!("cargo:rustc-link-arg=-Wl,-rpath,{dir}");
    }
    for arg in ["-Wl,--no-as-needed", "-ltorch", "-Wl,--as-needed"] {
        println!("cargo:rustc-link-arg={arg}");
    }
}
