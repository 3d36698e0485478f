//! Hints about how the operating system backs large buffers.

/// Asks the kernel to back the whole 2 MiB pages inside `buf` with transparent huge pages,
/// for a buffer streamed in full on every step (a large weight matrix): with 4 KiB pages each
/// of its pages costs a TLB miss per step. Call it on fresh, untouched memory (a large
/// `vec![0; n]` is), so the first writes fault in huge pages; later it only lets the kernel
/// collapse pages in the background. Only a hint: ignored where huge pages are off or not
/// Linux, and never changes the contents.
pub fn advise_huge_pages<T>(buf: &mut [T]) {
    #[cfg(target_os = "linux")]
    {
        const HUGE: usize = 2 << 20;
        let at = buf.as_mut_ptr() as usize;
        let (start, end) = (
            at.next_multiple_of(HUGE),
            (at + std::mem::size_of_val(buf)) / HUGE * HUGE,
        );
        if end > start {
            // SAFETY: `start..end` lies inside `buf`, which we borrow mutably; MADV_HUGEPAGE
            // changes how the kernel backs the pages, never their contents. The result is
            // ignored: the hint is optional.
            unsafe { libc::madvise(start as *mut libc::c_void, end - start, libc::MADV_HUGEPAGE) };
        }
    }
    #[cfg(not(target_os = "linux"))]
    let _ = buf;
}
