//! How the process takes memory from the kernel.

/// Turns off transparent huge pages for this process. mimalloc asks for them on its arenas, so
/// the first touch of each 2 MiB region zeroes all of it: the first large requests after start
/// (or after mimalloc returned idle memory) took 25-40 ms longer each, and the process held
/// twice the memory, for no gain in steady state (docs/benchmarks.md). Linux only; elsewhere, and
/// where the kernel refuses, nothing changes.
pub fn no_transparent_huge_pages() {
    #[cfg(target_os = "linux")]
    // SAFETY: PR_SET_THP_DISABLE takes an integer flag and touches no memory of ours.
    unsafe {
        libc::prctl(libc::PR_SET_THP_DISABLE, 1, 0, 0, 0);
    }
}
