//! An `LD_PRELOAD` shim, compiled by the test that needs it, that swaps a file for a symlink
//! at the moment the process under test opens it: a deterministic stand-in for an attacker
//! who wins the race between a scan (which only `lstat`s) and the later open.
//!
//! The shim wraps `open`, `open64`, `openat`, `openat64` and `opendir`. When the file name opened is
//! that of `RHC_SHIM_SWAP_PATH` (whatever directory path led there) and the file `RHC_SHIM_SWAP_ARMED_BY` exists (when that variable is
//! set), it replaces the path, once, by a symlink to `RHC_SHIM_SWAP_TARGET` (atomically:
//! a symlink made beside it, renamed over it; a directory is first moved aside to
//! `<path>.shim-orig`), writes `RHC_SHIM_SWAP_DONE`, and then lets the
//! real open run on the path. Needs a C compiler (`cc`) and a dynamically linked glibc binary.

use std::path::{Path, PathBuf};
use std::process::Command;

const SOURCE: &str = r#"
#define _GNU_SOURCE
#include <dirent.h>
#include <dlfcn.h>
#include <errno.h>
#include <fcntl.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

static int swapped;

static void maybe_swap(const char *path) {
    if (!path || __atomic_load_n(&swapped, __ATOMIC_SEQ_CST)) return;
    const char *want = getenv("RHC_SHIM_SWAP_PATH");
    const char *target = getenv("RHC_SHIM_SWAP_TARGET");
    if (!want || !target) return;
    /* The process may reach the file through another path (a session_latest link): the
       file names are compared. */
    const char *a = strrchr(path, '/'), *b = strrchr(want, '/');
    if (strcmp(a ? a + 1 : path, b ? b + 1 : want) != 0) return;
    const char *armed = getenv("RHC_SHIM_SWAP_ARMED_BY");
    if (armed && access(armed, F_OK) != 0) return;
    if (__atomic_exchange_n(&swapped, 1, __ATOMIC_SEQ_CST)) return;
    char tmp[4200];
    snprintf(tmp, sizeof tmp, "%s.shim-link", want);
    unlink(tmp);
    if (symlink(target, tmp) != 0) return;
    if (rename(tmp, want) != 0) {
        /* A directory cannot be renamed over: move it aside first. */
        char orig[4200];
        snprintf(orig, sizeof orig, "%s.shim-orig", want);
        if ((errno != EISDIR && errno != ENOTEMPTY && errno != EEXIST) || rename(want, orig) != 0
            || rename(tmp, want) != 0) return;
    }
    const char *done = getenv("RHC_SHIM_SWAP_DONE");
    if (done) {
        int (*real_open)(const char *, int, ...) = dlsym(RTLD_NEXT, "open");
        int fd = real_open(done, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
        if (fd >= 0) close(fd);
    }
}

#define MODE_ARG(flags, mode) \
    mode_t mode = 0; \
    if ((flags) & (O_CREAT | O_TMPFILE)) { va_list ap; va_start(ap, flags); mode = va_arg(ap, int); va_end(ap); }

int open(const char *path, int flags, ...) {
    MODE_ARG(flags, mode);
    maybe_swap(path);
    int (*real)(const char *, int, ...) = dlsym(RTLD_NEXT, "open");
    return real(path, flags, mode);
}

int open64(const char *path, int flags, ...) {
    MODE_ARG(flags, mode);
    maybe_swap(path);
    int (*real)(const char *, int, ...) = dlsym(RTLD_NEXT, "open64");
    return real(path, flags, mode);
}

int openat(int dir, const char *path, int flags, ...) {
    MODE_ARG(flags, mode);
    maybe_swap(path);
    int (*real)(int, const char *, int, ...) = dlsym(RTLD_NEXT, "openat");
    return real(dir, path, flags, mode);
}

DIR *opendir(const char *path) {
    maybe_swap(path);
    DIR *(*real)(const char *) = dlsym(RTLD_NEXT, "opendir");
    return real(path);
}

int openat64(int dir, const char *path, int flags, ...) {
    MODE_ARG(flags, mode);
    maybe_swap(path);
    int (*real)(int, const char *, int, ...) = dlsym(RTLD_NEXT, "openat64");
    return real(dir, path, flags, mode);
}
"#;

/// The compiled shim, in a directory removed when this is dropped.
pub struct SwapShim {
    /// The shared object, for `LD_PRELOAD`.
    pub lib: PathBuf,
    _dir: tempfile::TempDir,
}

impl SwapShim {
    /// Compiles the shim with `cc`; the error says why it could not.
    pub fn build() -> Result<SwapShim, String> {
        let dir = tempfile::tempdir().map_err(|e| format!("temp dir: {e}"))?;
        let src = dir.path().join("swap_shim.c");
        let lib = dir.path().join("libswapshim.so");
        std::fs::write(&src, SOURCE).map_err(|e| format!("writing {}: {e}", src.display()))?;
        let out = Command::new("cc")
            .args(["-shared", "-fPIC", "-O1", "-o"])
            .arg(&lib)
            .arg(&src)
            .arg("-ldl")
            .output()
            .map_err(|e| format!("running cc: {e}"))?;
        if !out.status.success() {
            return Err(format!(
                "cc failed: {}",
                String::from_utf8_lossy(&out.stderr)
            ));
        }
        Ok(SwapShim { lib, _dir: dir })
    }

    /// The environment that makes a process swap `path` for a symlink to `target` when it
    /// first opens `path` after `armed_by` exists (at once when `None`), and write `done`.
    pub fn env(
        &self,
        path: &Path,
        target: &Path,
        armed_by: Option<&Path>,
        done: &Path,
    ) -> Vec<(String, String)> {
        let s = |p: &Path| p.to_string_lossy().into_owned();
        let mut env = vec![
            ("LD_PRELOAD".to_string(), s(&self.lib)),
            ("RHC_SHIM_SWAP_PATH".to_string(), s(path)),
            ("RHC_SHIM_SWAP_TARGET".to_string(), s(target)),
            ("RHC_SHIM_SWAP_DONE".to_string(), s(done)),
        ];
        if let Some(a) = armed_by {
            env.push(("RHC_SHIM_SWAP_ARMED_BY".to_string(), s(a)));
        }
        env
    }
}
