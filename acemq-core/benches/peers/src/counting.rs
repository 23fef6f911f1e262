//! A counting global allocator: the heap allocations this process makes
//! (count and bytes) and the bytes it frees, counted only while
//! [`enable`]d (the large-body and memory groups), so that the other
//! groups pay one relaxed load an allocation and nothing more.
//!
//! A reallocation counts as an allocation of its new size (and frees the
//! old): what grows a buffer by copying it shows in the bytes.

use std::alloc::{GlobalAlloc, Layout, System};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};

pub struct Counting;

static ON: AtomicBool = AtomicBool::new(false);
static ALLOCATIONS: AtomicU64 = AtomicU64::new(0);
static ALLOCATED: AtomicU64 = AtomicU64::new(0);
static FREED: AtomicU64 = AtomicU64::new(0);

#[inline]
fn allocated(size: usize) {
    if ON.load(Ordering::Relaxed) {
        ALLOCATIONS.fetch_add(1, Ordering::Relaxed);
        ALLOCATED.fetch_add(size as u64, Ordering::Relaxed);
    }
}

#[inline]
fn freed(size: usize) {
    if ON.load(Ordering::Relaxed) {
        FREED.fetch_add(size as u64, Ordering::Relaxed);
    }
}

// SAFETY: every call is passed on to the system allocator unchanged; the
// counting touches atomics only.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        allocated(layout.size());
        System.alloc(layout)
    }

    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        allocated(layout.size());
        System.alloc_zeroed(layout)
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        freed(layout.size());
        System.dealloc(ptr, layout)
    }

    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        allocated(new_size);
        freed(layout.size());
        System.realloc(ptr, layout, new_size)
    }
}

/// Counts from now on (`true`) or stops counting.
pub fn enable(on: bool) {
    ON.store(on, Ordering::SeqCst);
}

/// Allocations and bytes allocated while counting, so far.
pub fn read() -> (u64, u64) {
    (ALLOCATIONS.load(Ordering::Relaxed), ALLOCATED.load(Ordering::Relaxed))
}

/// Bytes allocated and not freed while counting, so far: the change of the
/// live heap between two readings taken while counting.
pub fn live() -> i64 {
    ALLOCATED.load(Ordering::Relaxed) as i64 - FREED.load(Ordering::Relaxed) as i64
}
