//! A clear last word when a memory-mapped model file fails under the process.
//!
//! Weights are read straight from the mapped model files. When such a file is truncated or
//! replaced while oxgen runs (or its disk fails), the next read of a lost page raises SIGBUS,
//! whose default action kills the process without a word, which under a service manager
//! looks like a silent crash. The handler writes what happened and what to do to stderr,
//! then restores the default action and returns: the faulting read runs again and the
//! process dies of SIGBUS as before (exit status 135 in a shell, a core dump where enabled).
//! Only async-signal-safe calls are made: `write` and `sigaction`.

const MESSAGE: &[u8] = b"\noxgen: fatal: SIGBUS: a memory-mapped file could not be read. A model \
file was most likely truncated or replaced while oxgen was using it (or its disk failed). \
Do not change a model's files in place while it is served: write a new version to a new \
folder and restart oxgen on it.\n";

extern "C" fn on_sigbus(_: libc::c_int) {
    // SAFETY: write(2) and sigaction(2) are async-signal-safe; MESSAGE is a static buffer.
    unsafe {
        libc::write(libc::STDERR_FILENO, MESSAGE.as_ptr().cast(), MESSAGE.len());
        let mut default: libc::sigaction = std::mem::zeroed();
        default.sa_sigaction = libc::SIG_DFL;
        libc::sigaction(libc::SIGBUS, &default, std::ptr::null_mut());
    }
}

/// Installs the SIGBUS handler for the whole process (once, at start).
pub fn install() {
    // SAFETY: a plain handler with an empty mask; `on_sigbus` is async-signal-safe.
    unsafe {
        let mut action: libc::sigaction = std::mem::zeroed();
        action.sa_sigaction = on_sigbus as extern "C" fn(libc::c_int) as libc::sighandler_t;
        libc::sigemptyset(&mut action.sa_mask);
        libc::sigaction(libc::SIGBUS, &action, std::ptr::null_mut());
    }
}
