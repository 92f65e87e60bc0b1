//! The `qoslet` binary: [`qoslet::cli::main`].

fn main() -> std::process::ExitCode {
    qoslet::cli::main()
}
