//! Keeping large message buffers in the heap (`PS_MALLOC_TUNE`).
//!
//! ZeroMQ allocates a buffer of the message's size for every large message
//! it receives, and pslite's apps allocate answers and sums of the same
//! sizes, step after step. glibc's malloc serves allocations above its
//! mmap threshold (128 KiB at start, growing to at most 32 MiB as such
//! blocks are freed) with a fresh `mmap`, and gives the top of the heap back
//! to the kernel once more than twice that is free. Either way the next
//! message of the same size faults in fresh pages, which the kernel zeroes
//! first: measured with `perf` on a 5 Gbit/s link (`tests/bench/links.py`,
//! 120 MB push and pull at 2+2), 40-50% of a server's and a worker's CPU
//! was `clear_page_erms` under those faults, on a machine where the CPU,
//! not the wire, was what the 2+2 transfers waited for.
//!
//! [`keep_large_buffers`] turns glibc's use of `mmap` for large blocks off
//! (`M_MMAP_MAX` 0: blocks come from the heap and are reused; in a thread's
//! arena a block larger than its 64 MiB heaps still gets an `mmap` of its
//! own), sets the mmap threshold to its largest value (32 MiB, for a
//! `GLIBC_TUNABLES` that allows `mmap` again) and the trim threshold to
//! [`TRIM_THRESHOLD`] (freed heap memory up to that much stays with the
//! process). A process's memory then stays near its high-water mark
//! instead of following each message. It runs once per process, leaves
//! malloc alone where the user's `GLIBC_TUNABLES` already chose any of
//! these, and does nothing on a C library other than glibc. The Postoffice
//! calls it for servers and workers; a scheduler, which moves no large data
//! and must keep its store's memory bounded, calls it only when
//! `PS_MALLOC_TUNE=1` asks.
//!
//! On a worker it also caps malloc's arenas at [`ARENA_MAX`] (glibc makes up
//! to eight a core, one for each thread that meets a locked one). With large
//! blocks in the heap, each arena keeps its own high-water mark, and a
//! worker's answers are allocated in ZeroMQ's and pslite's threads and freed
//! in the application's: `tests/bench/emb_size.py` (16.8 M rows of 64
//! floats pulled by 2 workers from 4 servers in 16 MB answers) saw a worker
//! at 1.5, 1.7 and 2.3 GB (`PS_MALLOC_TUNE=0`) in 3 of 4 runs, against 0.7
//! GB at 1 M rows; with the cap, 0.75-0.86 GB in 12 runs of 13 (one run of
//! the cap set for servers too reached 3.3 GB, cause not found). Servers
//! keep glibc's arenas: capped, `kv_bench`'s pulls of fresh values at 1+2+2
//! had 3 runs of 10 at 2-7x the median. `MALLOC_ARENA_MAX` or
//! `glibc.malloc.arena_max` set by the user stand.
//!
//! Measured side by side on the merged main (links.py, 5 Gbit/s, quiet
//! machine, 2+2, medians of 5 rounds): 120 MB push 252 and 232 ms without
//! this module, 253 and 223 ms with the thresholds alone, 202-214 ms with
//! `mmap` off too (raw ZeroMQ 202 ms, the wire's limit 192 ms): the 40 MB
//! key frames a server receives from each worker were fresh pages every
//! round until then.

use std::sync::Once;

/// The mmap threshold set: glibc's largest (`DEFAULT_MMAP_THRESHOLD_MAX`
/// on 64-bit machines; `mallopt` refuses more).
pub const MMAP_THRESHOLD: usize = 32 << 20;

/// Free heap memory a process keeps instead of giving it back.
pub const TRIM_THRESHOLD: usize = 1 << 30;

/// The most malloc arenas a process makes (glibc's default is eight a core).
pub const ARENA_MAX: usize = 2;

/// What [`keep_large_buffers`] did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Tuned {
    /// `mmap` off and both thresholds set.
    Set,
    /// `GLIBC_TUNABLES` names one of them already: the user's choice stands.
    UserTunables,
    /// Not glibc (or `mallopt` refused): malloc as it was.
    Unsupported,
    /// An earlier call of this process did it.
    AlreadyDone,
}

/// Turns glibc's `mmap` of large blocks off and sets its mmap and trim
/// thresholds and its number of arenas (see the module's text), the first
/// time it is called in a process, unless `tunables` (the value of
/// `GLIBC_TUNABLES`) sets any of them; `arenas_chosen` (not a worker, or
/// `MALLOC_ARENA_MAX` is set) leaves the arenas alone.
pub fn keep_large_buffers(tunables: &str, arenas_chosen: bool) -> Tuned {
    static ONCE: Once = Once::new();
    let mut outcome = Tuned::AlreadyDone;
    ONCE.call_once(|| {
        outcome = if user_chose(tunables) {
            Tuned::UserTunables
        } else {
            set_thresholds(!arenas_chosen)
        };
        log::debug!("large message buffers kept in the heap: {outcome:?}");
    });
    outcome
}

/// Whether `GLIBC_TUNABLES` (its value) sets either threshold.
fn user_chose(tunables: &str) -> bool {
    tunables.split(':').any(|t| {
        let name = t.split('=').next().unwrap_or_default().trim();
        name == "glibc.malloc.mmap_threshold"
            || name == "glibc.malloc.trim_threshold"
            || name == "glibc.malloc.mmap_max"
            || name == "glibc.malloc.arena_max"
    })
}

#[cfg(all(target_os = "linux", target_env = "gnu"))]
fn set_thresholds(arenas: bool) -> Tuned {
    // SAFETY: mallopt only changes malloc's parameters, under its own lock;
    // the values are within the ranges glibc documents.
    let mmap = unsafe { libc::mallopt(libc::M_MMAP_THRESHOLD, MMAP_THRESHOLD as libc::c_int) };
    let trim = unsafe { libc::mallopt(libc::M_TRIM_THRESHOLD, TRIM_THRESHOLD as libc::c_int) };
    let no_mmap = unsafe { libc::mallopt(libc::M_MMAP_MAX, 0) };
    // SAFETY: as above; arenas already made stay, no new one is made.
    let arena =
        !arenas || unsafe { libc::mallopt(libc::M_ARENA_MAX, ARENA_MAX as libc::c_int) } == 1;
    if mmap == 1 && trim == 1 && no_mmap == 1 && arena {
        Tuned::Set
    } else {
        Tuned::Unsupported
    }
}

#[cfg(not(all(target_os = "linux", target_env = "gnu")))]
fn set_thresholds(_arenas: bool) -> Tuned {
    Tuned::Unsupported
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_user_tunable_for_either_threshold_stands() {
        assert!(user_chose("glibc.malloc.mmap_threshold=65536"));
        assert!(user_chose(
            "glibc.malloc.hugetlb=1:glibc.malloc.trim_threshold=1"
        ));
        assert!(user_chose("glibc.malloc.mmap_max=0"));
        assert!(user_chose("glibc.malloc.arena_max=4"));
        assert!(!user_chose("glibc.malloc.hugetlb=1"));
        assert!(!user_chose(""));
        assert!(!user_chose("glibc.malloc.mmap_threshold_x=1"));
    }

    #[test]
    fn sets_the_thresholds_once() {
        let tunables = std::env::var("GLIBC_TUNABLES").unwrap_or_default();
        let first = keep_large_buffers(&tunables, false);
        if !user_chose(&tunables) {
            #[cfg(all(target_os = "linux", target_env = "gnu"))]
            assert_eq!(first, Tuned::Set);
        }
        assert_eq!(keep_large_buffers(&tunables, false), Tuned::AlreadyDone);
    }
}
