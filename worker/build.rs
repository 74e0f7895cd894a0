//! Records libtorch's directory as the binaries' run path, so `rlvrd` starts without
//! `LD_LIBRARY_PATH` on the machine it was built on. torch-sys publishes the directory to crates
//! that depend on it directly (`links = "tch"` → `DEP_TCH_LIBTORCH_LIB`). Elsewhere (a GPU host
//! with its own torch 2.11.0) the dynamic loader's usual search applies.
fn main() {
    println!("cargo:rerun-if-env-changed=DEP_TCH_LIBTORCH_LIB");
    if let Ok(dir) = std::env::var("DEP_TCH_LIBTORCH_LIB") {
        println!("cargo:rustc-link-arg=-Wl,-rpath,{dir}");
    }
}
