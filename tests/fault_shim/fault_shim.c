/* A failure-injection shim for the spool durability tests (tests/spool_durability.rs), built
 * by the test with `cc` and loaded into the collector with LD_PRELOAD. Test-only: nothing in
 * the collector refers to it.
 *
 * For each intercepted call (fsync, fdatasync, ftruncate/ftruncate64, writev; open/open64 with
 * O_CREAT as "open", without it as "openr"; write) it looks for a rule file
 * $RHC_FAULT_DIR/<call> holding "<errno> <count> <text>":
 * a call on a path containing <text> (ending with it, when <text> ends with '$') fails with
 * <errno>, <count> times, after which the rule file is removed. The errno -9 is a kill -9
 * instead: the first <count> - 1 matching calls go through and the process sends itself
 * SIGKILL at the <count>th, before it is made (a crash at a chosen step). A write fails as a disk
 * filling up makes it fail: it first writes half of its bytes for real and returns that
 * short count, and the next write to the same descriptor fails with <errno> (one of
 * <count>); a write of one byte fails at once. Every fsync, fdatasync and ftruncate, and
 * every injected write failure, is logged to $RHC_FAULT_DIR/log as
 * "<call> <path> ok|fail". Every fsync and fdatasync that succeeds on a regular file is also
 * logged to $RHC_FAULT_DIR/synced as "<dev> <inode> <size>": what a power loss would keep
 * of the file (a test cuts what came after, see testkit's `Faults::lose_unsynced`). A
 * syncfs (the spool's sync of a group of more than 32 files, on its lock file) is logged as
 * "syncfs <path> ok|fail", can be failed by a rule "syncfs" like the calls above, and when it
 * succeeds logs to "synced" every regular file below the folder of its descriptor (the
 * spool), at the size it had when the call started: what it made durable (review r40m: a
 * power loss otherwise emptied the files of such a group, all synced).
 * The <count>th lstat-like statx on a path matching the rule file "pause" waits until the
 * file "resume" exists (see maybe_pause).
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <ftw.h>
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/types.h>
#include <sys/uio.h>
#include <unistd.h>

static pthread_mutex_t mu = PTHREAD_RECURSIVE_MUTEX_INITIALIZER_NP;
static __thread int busy;

static void fd_path(int fd, char *out, size_t n) {
    char link[64];
    snprintf(link, sizeof link, "/proc/self/fd/%d", fd);
    ssize_t k = readlink(link, out, n - 1);
    out[k < 0 ? 0 : k] = 0;
}

static int matches(const char *path, const char *text) {
    size_t t = strlen(text);
    if (t > 0 && text[t - 1] == '$') {
        size_t p = strlen(path);
        return p >= t - 1 && strncmp(path + p - (t - 1), text, t - 1) == 0;
    }
    return strstr(path, text) != NULL;
}

/* The errno to fail with, or 0. Called with `mu` held. */
static int injected(const char *call, const char *path) {
    const char *dir = getenv("RHC_FAULT_DIR");
    if (!dir || busy) return 0;
    busy = 1;
    char rule[4096];
    snprintf(rule, sizeof rule, "%s/%s", dir, call);
    int err = 0;
    FILE *f = fopen(rule, "r");
    if (f) {
        int e = 0, count = 0;
        char text[2048] = {0};
        if (fscanf(f, "%d %d %2047s", &e, &count, text) == 3 && matches(path, text)) {
            err = e == -9 ? 0 : e;
            count -= 1;
            if (e == -9 && count <= 0) {
                fclose(f);
                unlink(rule);
                kill(getpid(), SIGKILL);
            }
            fclose(f);
            f = NULL;
            if (count <= 0) {
                unlink(rule);
            } else {
                FILE *w = fopen(rule, "w");
                if (w) {
                    fprintf(w, "%d %d %s\n", e, count, text);
                    fclose(w);
                }
            }
        }
        if (f) fclose(f);
    }
    busy = 0;
    return err;
}

static void log_call(const char *call, const char *path, int err) {
    const char *dir = getenv("RHC_FAULT_DIR");
    if (!dir || busy) return;
    busy = 1;
    char log[4096];
    snprintf(log, sizeof log, "%s/log", dir);
    FILE *f = fopen(log, "a");
    if (f) {
        fprintf(f, "%s %s %s\n", call, path, err ? "fail" : "ok");
        fclose(f);
    }
    busy = 0;
}

/* Records the size of the regular file `fd` just synced. Called with `mu` held. */
static void log_synced(int fd) {
    const char *dir = getenv("RHC_FAULT_DIR");
    if (!dir || busy) return;
    struct stat st;
    if (fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) return;
    busy = 1;
    char log[4096];
    snprintf(log, sizeof log, "%s/synced", dir);
    FILE *f = fopen(log, "a");
    if (f) {
        fprintf(f, "%llu %llu %lld\n", (unsigned long long)st.st_dev,
                (unsigned long long)st.st_ino, (long long)st.st_size);
        fclose(f);
    }
    busy = 0;
}

#define FD_CALL(name, params, args)                                    \
    int name params {                                                  \
        static int (*real) params;                                     \
        if (!real) real = dlsym(RTLD_NEXT, #name);                     \
        char path[4096];                                               \
        fd_path(fd, path, sizeof path);                                \
        pthread_mutex_lock(&mu);                                       \
        int err = injected(#name, path);                               \
        pthread_mutex_unlock(&mu);                                     \
        int r;                                                         \
        if (err) {                                                     \
            r = -1;                                                    \
        } else {                                                       \
            r = real args;                                             \
        }                                                              \
        int saved = errno;                                             \
        pthread_mutex_lock(&mu);                                       \
        log_call(#name, path, err || r != 0);                          \
        if (!err && r == 0 && strstr(#name, "sync")) log_synced(fd);   \
        pthread_mutex_unlock(&mu);                                     \
        errno = err ? err : saved;                                     \
        return r;                                                      \
    }

FD_CALL(fsync, (int fd), (fd))
FD_CALL(fdatasync, (int fd), (fd))
FD_CALL(ftruncate, (int fd, off_t len), (fd, len))
FD_CALL(ftruncate64, (int fd, off_t len), (fd, len))

/* The descriptor whose next write fails (after a short write), and with what. */
static int short_fd = -1;
static int short_err;

ssize_t write(int fd, const void *buf, size_t n) {
    static ssize_t (*real)(int, const void *, size_t);
    if (!real) real = dlsym(RTLD_NEXT, "write");
    const char *dir = getenv("RHC_FAULT_DIR");
    if (!dir || busy) return real(fd, buf, n);
    /* Cheap while nothing is armed: one access(2) per write, no path lookup. */
    char rule[4096];
    snprintf(rule, sizeof rule, "%s/write", dir);
    if (__atomic_load_n(&short_fd, __ATOMIC_SEQ_CST) != fd && access(rule, F_OK) != 0)
        return real(fd, buf, n);
    char path[4096];
    fd_path(fd, path, sizeof path);
    pthread_mutex_lock(&mu);
    int err = 0;
    if (short_fd == fd) {
        err = short_err;
        short_fd = -1;
        short_err = 0;
    } else {
        err = injected("write", path);
        if (err && n >= 2) {
            ssize_t r = real(fd, buf, n / 2);
            if (r > 0) {
                short_fd = fd;
                short_err = err;
                pthread_mutex_unlock(&mu);
                return r;
            }
        }
    }
    if (err) log_call("write", path, err);
    pthread_mutex_unlock(&mu);
    if (!err) return real(fd, buf, n);
    errno = err;
    return -1;
}

#define OPEN_CALL(name)                                                \
    int name(const char *path, int flags, ...) {                       \
        static int (*real)(const char *, int, ...);                    \
        if (!real) real = dlsym(RTLD_NEXT, #name);                     \
        mode_t mode = 0;                                               \
        if (flags & O_CREAT) {                                         \
            va_list ap;                                                \
            va_start(ap, flags);                                       \
            mode = va_arg(ap, mode_t);                                 \
            va_end(ap);                                                \
            pthread_mutex_lock(&mu);                                   \
            int err = injected("open", path);                          \
            pthread_mutex_unlock(&mu);                                 \
            if (err) {                                                 \
                errno = err;                                           \
                return -1;                                             \
            }                                                          \
        } else {                                                       \
            pthread_mutex_lock(&mu);                                   \
            int err = injected("openr", path);                         \
            pthread_mutex_unlock(&mu);                                 \
            if (err) {                                                 \
                errno = err;                                           \
                return -1;                                             \
            }                                                          \
        }                                                              \
        return real(path, flags, mode);                                \
    }

OPEN_CALL(open)
OPEN_CALL(open64)

/* writev (how the spool appends its lines): fails as a full disk would, before writing
 * anything. Not logged (it is called for every group). */
ssize_t writev(int fd, const struct iovec *iov, int iovcnt) {
    static ssize_t (*real)(int, const struct iovec *, int);
    if (!real) real = dlsym(RTLD_NEXT, "writev");
    const char *dir = getenv("RHC_FAULT_DIR");
    if (dir && !busy) {
        char rule[4096];
        snprintf(rule, sizeof rule, "%s/writev", dir);
        if (access(rule, F_OK) == 0) {
            char path[4096];
            fd_path(fd, path, sizeof path);
            pthread_mutex_lock(&mu);
            int err = injected("writev", path);
            pthread_mutex_unlock(&mu);
            if (err) {
                errno = err;
                return -1;
            }
        }
    }
    return real(fd, iov, iovcnt);
}

/* Pauses the caller of an lstat-like statx (AT_SYMLINK_NOFOLLOW, as Rust's
 * fs::symlink_metadata makes; not the following stat of a directory watcher's walk) on a path
 * matching the text of the rule file "pause", holding "<count> <text>": the <count>th such
 * call (then the rule is removed) creates the file "paused", then the call waits (at most 60 s, holding no lock) until the file "resume"
 * exists. A test acts between two steps of the collector so. */
static void maybe_pause(const char *path, int flags) {
    const char *dir = getenv("RHC_FAULT_DIR");
    if (!dir || busy || !path || !(flags & AT_SYMLINK_NOFOLLOW)) return;
    char rule[4096];
    snprintf(rule, sizeof rule, "%s/pause", dir);
    if (access(rule, F_OK) != 0) return;
    busy = 1;
    char text[2048] = {0};
    int hit = 0, count = 0;
    pthread_mutex_lock(&mu);
    FILE *f = fopen(rule, "r");
    if (f) {
        if (fscanf(f, "%d %2047s", &count, text) == 2 && matches(path, text)) {
            count -= 1;
            fclose(f);
            f = NULL;
            if (count <= 0) {
                hit = 1;
                unlink(rule);
            } else {
                FILE *w = fopen(rule, "w");
                if (w) {
                    fprintf(w, "%d %s\n", count, text);
                    fclose(w);
                }
            }
        }
        if (f) fclose(f);
    }
    pthread_mutex_unlock(&mu);
    if (hit) {
        char mark[4096], resume[4096];
        snprintf(mark, sizeof mark, "%s/paused", dir);
        snprintf(resume, sizeof resume, "%s/resume", dir);
        FILE *m = fopen(mark, "w");
        if (m) fclose(m);
        for (int i = 0; i < 6000 && access(resume, F_OK) != 0; i++) usleep(10000);
    }
    busy = 0;
}

/* statx (how Rust's std reads metadata): the birth time hidden while the rule file "nobtime"
 * exists; a pause first when the rule file "pause" names the path (see maybe_pause). */
int statx(int dirfd, const char *path, int flags, unsigned int mask, struct statx *buf) {
    static int (*real)(int, const char *, int, unsigned int, struct statx *);
    if (!real) real = dlsym(RTLD_NEXT, "statx");
    if (!real) {
        /* A libc without statx: the caller falls back to fstat. */
        errno = ENOSYS;
        return -1;
    }
    maybe_pause(path, flags);
    int r = real(dirfd, path, flags, mask, buf);
    int saved = errno;
    const char *dir = getenv("RHC_FAULT_DIR");
    if (r == 0 && dir && !busy) {
        char rule[4096];
        snprintf(rule, sizeof rule, "%s/nobtime", dir);
        if (access(rule, F_OK) == 0) {
            buf->stx_mask &= ~(unsigned int)STATX_BTIME;
            buf->stx_btime.tv_sec = 0;
            buf->stx_btime.tv_nsec = 0;
        }
    }
    errno = saved;
    return r;
}

/* syncfs: the files below the folder of `fd` (the spool: its descriptor is the spool's lock
 * file) are recorded as synced at the sizes they had before the call, once it succeeded. */
static char *walk_buf;
static size_t walk_len, walk_cap;

static int walk_one(const char *p, const struct stat *st, int flag, struct FTW *ftw) {
    (void)p;
    (void)ftw;
    if (flag != FTW_F || !S_ISREG(st->st_mode)) return 0;
    if (walk_len + 80 > walk_cap) {
        size_t cap = walk_cap ? walk_cap * 2 : 1 << 16;
        char *b = realloc(walk_buf, cap);
        if (!b) return 1;
        walk_buf = b;
        walk_cap = cap;
    }
    walk_len += snprintf(walk_buf + walk_len, walk_cap - walk_len, "%llu %llu %lld\n",
                         (unsigned long long)st->st_dev, (unsigned long long)st->st_ino,
                         (long long)st->st_size);
    return 0;
}

int syncfs(int fd) {
    static int (*real)(int);
    if (!real) real = dlsym(RTLD_NEXT, "syncfs");
    const char *dir = getenv("RHC_FAULT_DIR");
    char path[4096];
    fd_path(fd, path, sizeof path);
    pthread_mutex_lock(&mu);
    int err = injected("syncfs", path);
    walk_len = 0;
    if (!err && dir && !busy) {
        char top[4096];
        struct stat st;
        snprintf(top, sizeof top, "%s", path);
        if (fstat(fd, &st) == 0 && !S_ISDIR(st.st_mode)) {
            char *slash = strrchr(top, '/');
            if (slash && slash != top) *slash = 0;
        }
        busy = 1;
        nftw(top, walk_one, 32, FTW_PHYS);
        busy = 0;
    }
    int r = err ? -1 : real(fd);
    int saved = errno;
    log_call("syncfs", path, err || r != 0);
    if (!err && r == 0 && dir && walk_len && !busy) {
        char log[4096];
        snprintf(log, sizeof log, "%s/synced", dir);
        busy = 1;
        FILE *f = fopen(log, "a");
        if (f) {
            fwrite(walk_buf, 1, walk_len, f);
            fclose(f);
        }
        busy = 0;
    }
    pthread_mutex_unlock(&mu);
    errno = err ? err : saved;
    return r;
}
