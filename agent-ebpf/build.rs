//! The object is linked by `bpf-linker`, an undeclared dependency: rebuild when it changes.
fn main() {
    if let Ok(linker) = which::which("bpf-linker") {
        println!("cargo:rerun-if-changed={}", linker.display());
    }
}
