/* A failure-injection shim for the spool durability tests (tests/spool_durability.rs), built
 * by the test with `cc` and loaded into the collector with LD_PRELOAD. Test-only: nothing in
 * the collector refers to it.
 *
 * For each intercepted call (fsync, fdatasync, ftruncate/ftruncate64; open/open64 with
 * O_CREAT as "open", without it as "openr") it looks for a rule file $RHC_FAULT_DIR/<call>
 * holding "<errno> <count> <text>":
 * a call on a path containing <text> (ending with it, when <text> ends with '$') fails with
 * <errno>, <count> times, after which the rule file is removed. Every fsync, fdatasync and
 * ftruncate is logged to $RHC_FAULT_DIR/log as "<call> <path> ok|fail".
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/types.h>
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
            err = e;
            count -= 1;
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
        pthread_mutex_unlock(&mu);                                     \
        errno = err ? err : saved;                                     \
        return r;                                                      \
    }

FD_CALL(fsync, (int fd), (fd))
FD_CALL(fdatasync, (int fd), (fd))
FD_CALL(ftruncate, (int fd, off_t len), (fd, len))
FD_CALL(ftruncate64, (int fd, off_t len), (fd, len))

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
