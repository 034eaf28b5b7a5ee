//! The system allocator, counting what is allocated and freed: the heap live now is their
//! difference. Shared by the memory benches (`#[path]`), each its own binary.

use std::alloc::System;

#[global_allocator]
static ALLOCATOR: &stats_alloc::StatsAlloc<System> = &stats_alloc::INSTRUMENTED_SYSTEM;

/// The heap allocated and not yet freed, in bytes.
pub fn live() -> usize {
    let s = ALLOCATOR.stats();
    // A realloc's growth or shrink is already in these two.
    s.bytes_allocated.saturating_sub(s.bytes_deallocated)
}

/// How many allocations are live now (a realloc moves one, it does not add one).
#[allow(dead_code)]
pub fn live_allocations() -> usize {
    let s = ALLOCATOR.stats();
    s.allocations.saturating_sub(s.deallocations)
}
