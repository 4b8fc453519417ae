//! How the C allocator keeps freed memory, set once at start-up.
//!
//! shardwise uses the system allocator (glibc's malloc on Linux; mimalloc was tried and made the
//! insert tail worse, BENCHMARKS.md "Insert latency"). By default glibc serves allocations of
//! 128 KiB and more with a fresh `mmap` and hands them back with `munmap` when freed (the cut-off
//! rises with what is freed, up to 32 MiB), and gives the top of a heap back to the kernel once
//! 128 KiB of it is free. A query moves its data in buffers of a few MiB (Arrow arrays of 8192
//! rows, 2 MiB Flight messages, a gRPC receive buffer) that are freed as soon as the next
//! operator or the network has them, so each new buffer is fresh memory: a page fault and a
//! zeroed page for every 4 KiB. A client fetching db-benchmark's q10 answer (10M rows, 620 MB)
//! spent a quarter of its time in those faults (BENCHMARKS.md, "q10, taken apart").
//!
//! Here buffers under [`MMAP_THRESHOLD_BYTES`] come from the heap, and a heap keeps up to
//! [`TRIM_THRESHOLD_BYTES`] of free memory at its top for the next allocation instead of
//! returning it. The cost is memory held after a large query: a process's resident size stays
//! near its peak until the freed memory is reused (up to the trim threshold per heap).
//!
//! A user who sets glibc's own malloc tunables (`GLIBC_TUNABLES=glibc.malloc....`) keeps them:
//! nothing is changed then.

/// Allocations of at least this size get a `mmap` of their own (glibc's `M_MMAP_THRESHOLD`; the
/// largest value its own adaptive threshold reaches).
pub const MMAP_THRESHOLD_BYTES: usize = 32 << 20;

/// Free memory a heap keeps at its top before giving it back (glibc's `M_TRIM_THRESHOLD`).
pub const TRIM_THRESHOLD_BYTES: usize = 512 << 20;

/// Whether the environment already tunes glibc's malloc.
fn user_tuned(tunables: Option<&str>) -> bool {
    tunables.is_some_and(|t| t.contains("glibc.malloc."))
}

/// Sets the thresholds above, unless the user set glibc's malloc tunables. Call before any other
/// thread starts. glibc refusing them (it never does with these values) leaves its defaults.
pub fn configure() {
    if !user_tuned(std::env::var("GLIBC_TUNABLES").ok().as_deref()) {
        set_thresholds();
    }
}

#[cfg(all(target_os = "linux", target_env = "gnu"))]
fn set_thresholds() -> bool {
    // SAFETY: mallopt takes two integers and changes allocator parameters, which glibc allows at
    // any time; both values are within the ranges glibc accepts (it returns 0 otherwise).
    unsafe {
        let mmap = libc::mallopt(libc::M_MMAP_THRESHOLD, MMAP_THRESHOLD_BYTES as libc::c_int);
        let trim = libc::mallopt(libc::M_TRIM_THRESHOLD, TRIM_THRESHOLD_BYTES as libc::c_int);
        mmap == 1 && trim == 1
    }
}

#[cfg(not(all(target_os = "linux", target_env = "gnu")))]
fn set_thresholds() -> bool {
    false
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_users_own_malloc_tunables_win() {
        assert!(!user_tuned(None));
        assert!(!user_tuned(Some("glibc.pthread.rseq=0")));
        assert!(user_tuned(Some("glibc.malloc.trim_threshold=131072")));
        assert!(user_tuned(Some("glibc.pthread.rseq=0:glibc.malloc.hugetlb=1")));
    }

    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    #[test]
    fn glibc_accepts_the_thresholds() {
        assert!(set_thresholds());
    }
}
