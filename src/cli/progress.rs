//! Progress on stderr, drawn only when stderr is a terminal (scripts and logs get none).

use std::io::IsTerminal;
use std::time::Duration;

use indicatif::{ProgressBar, ProgressStyle};

fn visible() -> bool {
    std::io::stderr().is_terminal()
}

/// A bar towards `len` steps.
pub fn bar(len: u64, msg: &str) -> ProgressBar {
    let pb = if visible() {
        ProgressBar::new(len)
    } else {
        ProgressBar::hidden()
    };
    pb.set_style(
        ProgressStyle::with_template("{spinner} {msg:<28} [{bar:40}] {pos}/{len} ({per_sec})")
            .unwrap_or_else(|_| ProgressStyle::default_bar())
            .progress_chars("=> "),
    );
    pb.set_message(msg.to_owned());
    pb
}

/// A spinner for work of unknown length; the message says how far it got.
pub fn spinner(msg: &str) -> ProgressBar {
    let pb = if visible() {
        ProgressBar::new_spinner()
    } else {
        ProgressBar::hidden()
    };
    pb.set_style(
        ProgressStyle::with_template("{spinner} {msg} ({elapsed})")
            .unwrap_or_else(|_| ProgressStyle::default_spinner()),
    );
    pb.set_message(msg.to_owned());
    pb.enable_steady_tick(Duration::from_millis(120));
    pb
}
