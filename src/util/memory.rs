//! Giving memory back to the node: an idle sidecar should look idle.

/// Returns free heap pages to the system (glibc only; a no-op elsewhere).
pub fn release_free_memory() {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    // SAFETY: malloc_trim only releases memory malloc already considers free.
    unsafe {
        libc::malloc_trim(0);
    }
}
