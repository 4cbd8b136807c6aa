//! The `lockstep` binary: a thin shell over [`lockstep::cli`].

fn main() -> std::process::ExitCode {
    lockstep::cli::main()
}
