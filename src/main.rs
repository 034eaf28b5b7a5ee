//! The `durable-informer` command-line tool: a demo on the built-in simulated cluster, live
//! persistent watches, recording and replay, and inspection of databases.
//!
//! Built only on the library's public API.

mod cli;

fn main() {
    std::process::exit(cli::main());
}
