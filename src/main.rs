//! The `durable-informer` command-line tool (work in progress: see the README).

fn main() {
    eprintln!("durable-informer: the command-line tool is not built yet; see README.md");
    std::process::exit(2);
}
