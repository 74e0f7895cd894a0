//! Compiles, against the libtorch that torch-sys links, the C++ entry points tch lacks:
//! `csrc/onednn_linear.cpp` (the oneDNN linear layer, see `src/onednn.rs`),
//! `csrc/cuda_settings.cpp` (TF32 and deterministic algorithms, see `src/cuda_settings.rs`),
//! `csrc/cuda_memory.cpp` (the CUDA caching allocator's cache and statistics, see
//! `src/cuda_memory.rs`) and `csrc/optimizer.cpp` (AdamW's fused kernel and clearing a gradient,
//! see `src/optimizer.rs`), with `csrc/messages.cpp` (how their errors reach Rust, see
//! `src/ffi.rs`). libtorch's headers sit next to its library directory, which torch-sys publishes
//! to crates depending on it directly (`links = "tch"` → `DEP_TCH_LIBTORCH_LIB`). The C++ ABI
//! flag must match libtorch's: torch 2.11's builds use the C++11 ABI; `LIBTORCH_CXX11_ABI=0`
//! (torch-sys's own variable) says otherwise.
use std::path::PathBuf;

fn main() {
    println!("cargo:rerun-if-changed=csrc/onednn_linear.cpp");
    println!("cargo:rerun-if-changed=csrc/cuda_settings.cpp");
    println!("cargo:rerun-if-changed=csrc/cuda_memory.cpp");
    println!("cargo:rerun-if-changed=csrc/optimizer.cpp");
    println!("cargo:rerun-if-changed=csrc/messages.cpp");
    println!("cargo:rerun-if-changed=csrc/messages.h");
    println!("cargo:rerun-if-env-changed=DEP_TCH_LIBTORCH_LIB");
    println!("cargo:rerun-if-env-changed=LIBTORCH_CXX11_ABI");
    let lib = PathBuf::from(
        std::env::var("DEP_TCH_LIBTORCH_LIB")
            .expect("torch-sys publishes libtorch's directory (DEP_TCH_LIBTORCH_LIB)"),
    );
    let root = lib.parent().expect("libtorch's lib directory has a parent");
    let include = root.join("include");
    let abi = std::env::var("LIBTORCH_CXX11_ABI").unwrap_or_else(|_| "1".to_owned());
    cc::Build::new()
        .cpp(true)
        .file("csrc/onednn_linear.cpp")
        .file("csrc/cuda_settings.cpp")
        .file("csrc/cuda_memory.cpp")
        .file("csrc/optimizer.cpp")
        .file("csrc/messages.cpp")
        .include(&include)
        .include(include.join("torch/csrc/api/include"))
        .flag("-std=c++17")
        .flag(format!("-D_GLIBCXX_USE_CXX11_ABI={abi}"))
        .flag("-DGLOG_USE_GLOG_EXPORT")
        .flag_if_supported("-Wno-unused-parameter")
        .warnings(false)
        .compile("rlvr_model_csrc");
}
