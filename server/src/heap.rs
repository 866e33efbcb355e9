//! Giving the memory the process freed back to the system.
//!
//! The allocator stays glibc's on purpose. Measured with `--bench load` (2026-12-07, 2 cores):
//! - mimalloc served about 2.4x the requests per second, but held 106 to 185 MiB (by its
//!   settings) with 1,000 running tasks and 1,000 dormant sessions, against 46.5 MiB with glibc
//!   (target: 64 MiB).
//! - jemalloc, purging in a background thread, served 1.6x to 1.9x, with 51.9 MiB there. But it
//!   sped the in-memory ceiling up more, so the ratios the load bench holds the server to fell:
//!   `start_*` from about 0.40x to 0.33x, status reads from 0.88x to 0.80x.
//! - Measured again in two interleaved pairs of runs (stop 48), jemalloc with
//!   `background_thread:true,dirty_decay_ms:1000,muzzy_decay_ms:0` served `start_*` at 5,376 and
//!   5,860 req/s against glibc's 3,478 and 3,521, with ratios of 0.40x and 0.41x against 0.35x and
//!   0.36x, and held 51.7 MiB. The ratios move within this machine's noise either way; the
//!   absolute gain does not. It is worth adopting once measured over more runs.

/// Returns the heap's free pages to the system: glibc's `malloc_trim`. glibc keeps what a
/// process frees for its next allocations, in every arena its threads used, so when a thousand
/// dormant sessions had left memory (see `http::put_to_sleep`) the resident memory stayed where
/// it was: 91 MiB with them, 91 MiB after they went, 31 MiB after a trim. No crate wraps the
/// call, hence the crate's one `unsafe` block. It walks every arena, so it runs on the blocking
/// pool, and only after something large was freed.
#[cfg(all(target_os = "linux", target_env = "gnu"))]
#[allow(unsafe_code)]
pub fn trim() {
    // SAFETY: malloc_trim takes no pointer and may be called from any thread at any time; glibc
    // locks each arena while it trims it.
    unsafe {
        libc::malloc_trim(0);
    }
}

/// Elsewhere the allocator returns memory on its own terms.
#[cfg(not(all(target_os = "linux", target_env = "gnu")))]
pub fn trim() {}
