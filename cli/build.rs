//! Rebuilds rlvrctl when an example job spec changes: `rlvrctl init` carries examples/jobs/.

fn main() {
    println!("cargo:rerun-if-changed=../examples/jobs");
}
