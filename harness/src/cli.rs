//! Command-line interface (placeholder, being written).

/// Entry point for the binary.
pub fn main() -> std::process::ExitCode {
    std::process::ExitCode::SUCCESS
}
