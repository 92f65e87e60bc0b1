//! `qoslet` itself ([`qoslet::cli::main`], as agent/src/main.rs runs it) as a binary of this
//! crate, for the tests that must see the whole process (its signals, its exit status): cargo
//! builds a package's own binaries for its integration tests, not another package's.

fn main() -> std::process::ExitCode {
    qoslet::cli::main()
}
