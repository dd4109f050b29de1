//! The `sendgate` binary: hands over to `cli::run`.

fn main() -> std::process::ExitCode {
    sendgate::cli::run()
}
