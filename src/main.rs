use std::process::ExitCode;

fn main() -> ExitCode {
    drover::cli::main()
}
