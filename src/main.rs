fn main() -> std::process::ExitCode {
    sendgate::cli::run()
}
