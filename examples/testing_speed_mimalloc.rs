//! `testing_speed` (the same arguments) with mimalloc as the global allocator: what a test
//! binary running the harness gains by choosing it (a third of the harness's CPU is malloc
//! and free with the system allocator).
//!
//! ```text
//! cargo run --release --features testing --example testing_speed_mimalloc -- 10000 200
//! ```

#![allow(missing_docs)] // an example

#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

#[path = "testing_speed.rs"]
mod speed;

fn main() -> Result<(), Box<dyn std::error::Error>> {
    speed::main()
}
