//! The process's heap: jemalloc, and giving what the process freed back to the system.
//!
//! jemalloc, not glibc's malloc: measured with `--bench load` in five interleaved pairs of runs
//! (stop 48, 2 cores), it served `start_*` at 5,288 to 5,860 requests a second against glibc's
//! 3,024 to 3,707, at 0.38x to 0.42x of the in-memory ceiling against 0.34x to 0.36x, status
//! reads about 1.6x, and held 51.7 to 53.3 MiB with 1,000 running tasks and 1,000 dormant sessions
//! (target 64 MiB; glibc with `malloc_trim`, 48.8 MiB). glibc's cost was its arena locks
//! (futex wake-ups between threads that free what others allocated), `unlink_chunk` and
//! `malloc_consolidate`. mimalloc was as fast but held 82 to 182 MiB there, by its settings.
//! (An earlier measurement, in fewer runs, had jemalloc's ratios lower than glibc's.)
//!
//! jemalloc's settings ([`JEMALLOC_CONF`]): a background thread hands pages freed for a second
//! back to the system (`dirty_decay_ms`; jemalloc's default waits ten), and straight away
//! (`muzzy_decay_ms:0`: no `MADV_FREE` stage, whose pages stay resident until the kernel
//! needs them), so memory follows the sessions in use. With jemalloc's defaults the figure
//! above was 76.3 MiB.

/// Makes jemalloc, with [`JEMALLOC_CONF`], the allocator of the binary that invokes it: the
/// `durable-mcp` executable, and the benches, whose children serve as it does. A macro,
/// because a global allocator and jemalloc's configuration symbol must be defined in the
/// binary itself: a library's unreferenced symbol need not be linked.
#[macro_export]
macro_rules! jemalloc {
    () => {
        #[global_allocator]
        static ALLOCATOR: $crate::heap::tikv_jemallocator::Jemalloc =
            $crate::heap::tikv_jemallocator::Jemalloc;

        /// jemalloc reads its configuration from this symbol (`malloc_conf`, under the prefix
        /// tikv-jemalloc-sys builds it with) when it starts: a C string.
        #[allow(unsafe_code, non_upper_case_globals)]
        #[unsafe(export_name = "_rjem_malloc_conf")]
        static malloc_conf: &u8 = &$crate::heap::JEMALLOC_CONF[0];
    };
}

pub use tikv_jemallocator;

/// jemalloc's settings, as a C string (see the module's documentation).
pub const JEMALLOC_CONF: &[u8] = b"background_thread:true,dirty_decay_ms:1000,muzzy_decay_ms:0\0";

/// Returns the free pages of glibc's heap to the system: `malloc_trim`. SQLite allocates there
/// (the Rust side allocates from jemalloc, which purges on its own). glibc keeps what a
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
