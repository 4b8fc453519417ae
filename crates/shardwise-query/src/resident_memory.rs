//! What the node process holds in memory, as the kernel sees it, and giving freed heap back.
//!
//! `max_server_memory_usage` (`crate::server_memory`) is a cap on the node, not only on what
//! DataFusion's operators say they reserve: their accounting is an estimate (a hash table's
//! accumulators, `count(DISTINCT)`'s sets), and the process also holds buffers no pool sees
//! (storage buffers, network messages, the allocator's own overhead). So the node's pool is
//! corrected from the process's anonymous resident memory (`RssAnon` in `/proc/self/status`:
//! heap, stacks and anonymous maps, not the file pages of mapped files, which the kernel can drop),
//! as ClickHouse corrects its memory tracker from the resident size.
//!
//! Freed memory can stay resident: glibc keeps free chunks inside its heaps, and shardwise asks
//! it to keep up to 512 MiB at each heap's top (`malloc_tuning` in the binary). [`release_free_heap`]
//! gives it back (`malloc_trim`), for when the pool would otherwise refuse a query because of
//! memory nobody uses any more.

/// A `kB` field of a `/proc/PID/status` text (`VmRSS:`, `RssAnon:`, ...), in KiB.
pub fn status_field_kib(status: &str, field: &str) -> Option<u64> {
    status.lines().find_map(|l| l.strip_prefix(field)?.trim().strip_suffix("kB")?.trim().parse().ok())
}

/// This process's anonymous resident memory in bytes, or `None` where the kernel does not say
/// (not Linux, or `/proc` not mounted).
pub fn anon_resident_bytes() -> Option<u64> {
    let status = std::fs::read_to_string("/proc/self/status").ok()?;
    status_field_kib(&status, "RssAnon:").map(|kib| kib.saturating_mul(1024))
}

/// Gives the allocator's free memory back to the kernel (glibc's `malloc_trim(0)`: the top of
/// each heap and the free pages inside it). It walks every heap under its lock, so it costs
/// milliseconds on a large heap: call it rarely. Returns whether anything was given back; a
/// no-op elsewhere than glibc.
pub fn release_free_heap() -> bool {
    trim()
}

#[cfg(all(target_os = "linux", target_env = "gnu"))]
fn trim() -> bool {
    // SAFETY: malloc_trim takes a byte count and only rearranges the allocator's free lists; glibc
    // allows it from any thread at any time.
    unsafe { libc::malloc_trim(0) == 1 }
}

#[cfg(not(all(target_os = "linux", target_env = "gnu")))]
fn trim() -> bool {
    false
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn status_fields_are_read_in_kib() {
        let status = "Name:\tshardwise\nVmHWM:\t  2048 kB\nVmRSS:\t  1024 kB\nRssAnon:\t   512 kB\n";
        assert_eq!(status_field_kib(status, "VmRSS:"), Some(1024));
        assert_eq!(status_field_kib(status, "RssAnon:"), Some(512));
        assert_eq!(status_field_kib(status, "VmSwap:"), None);
        assert_eq!(status_field_kib("RssAnon:\tlots kB\n", "RssAnon:"), None);
    }

    #[cfg(target_os = "linux")]
    #[test]
    fn this_process_holds_anonymous_memory_and_can_trim() {
        // The figure is the whole process's, and the other tests of this binary allocate and
        // free beside this one: a few tries, so that their frees cannot hide these 64 MiB.
        let mut seen = Vec::new();
        for _ in 0..5 {
            let before = anon_resident_bytes().expect("RssAnon on Linux");
            assert!(before > 0);
            // 64 MiB touched: resident until freed, and given back at the latest by a trim.
            let ballast = vec![1u8; 64 << 20];
            let with = anon_resident_bytes().expect("RssAnon");
            drop(std::hint::black_box(ballast));
            release_free_heap();
            if with >= before + (32 << 20) {
                return;
            }
            seen.push((before, with));
        }
        panic!("64 MiB touched never showed as resident (bytes before and with, per try): {seen:?}");
    }
}
