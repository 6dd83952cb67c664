/* LD_PRELOAD shim for linux.uml (Debian 6.1) on hosts whose XSAVE area is larger than UML's.
 *
 * Why: UML 6.1 saves/restores a task's FP state with PTRACE_{GET,SET}REGSET NT_X86_XSTATE
 * using its own 832-byte buffer (x87/SSE + header + AVX). Host kernels require SETREGSET to
 * pass the whole XSAVE area (10688 bytes with AVX-512 and AMX), so on such CPUs every
 * restore fails with EFAULT and the UML kernel panics as soon as init runs
 * ("userspace - ptrace set fp regs failed, errno = 14").
 * What: GET fetches the full area, hands UML its prefix and remembers the rest keyed by
 * UML's buffer (one buffer per UML task); SET rebuilds the full area from UML's prefix and
 * that task's remembered rest (AVX-512 state etc.), so no state is lost or mixed between
 * tasks. When UML's buffer is already large enough, calls pass through unchanged. */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ptrace.h>
#include <sys/syscall.h>
#include <sys/types.h>
#include <sys/uio.h>
#include <unistd.h>

#define NT_X86_XSTATE 0x202
#define BIG 65536
#define HDR 512
#define SLOTS 4096

struct slot { void *key; unsigned char *ext; };
static struct slot slots[SLOTS];
static size_t full_size;
static unsigned char big[BIG] __attribute__((aligned(64)));

static long raw(long req, pid_t pid, void *addr, void *data) { return syscall(SYS_ptrace, req, pid, addr, data); }

static struct slot *find(void *key, int create) {
    size_t h = ((uintptr_t)key >> 4) % SLOTS;
    for (size_t i = 0; i < SLOTS; i++) {
        struct slot *s = &slots[(h + i) % SLOTS];
        if (s->key == key) return s;
        if (!s->key) { if (!create) return NULL; s->key = key; return s; }
    }
    return NULL;
}

long ptrace(enum __ptrace_request req, ...) {
    va_list ap; va_start(ap, req);
    pid_t pid = va_arg(ap, pid_t); void *addr = va_arg(ap, void *); void *data = va_arg(ap, void *);
    va_end(ap);
    if ((req == PTRACE_GETREGSET || req == PTRACE_SETREGSET) && (uintptr_t)addr == NT_X86_XSTATE && data) {
        struct iovec *iov = data;
        struct iovec b = { big, BIG };
        long r = raw(PTRACE_GETREGSET, pid, addr, &b);
        if (r < 0) return r;
        full_size = b.iov_len;
        size_t n = iov->iov_len;
        if (n >= full_size || n < HDR + 64) goto plain;
        if (req == PTRACE_GETREGSET) {
            memcpy(iov->iov_base, big, n);
            struct slot *s = find(iov->iov_base, 1);
            if (s) {
                if (!s->ext) s->ext = malloc(full_size);
                if (s->ext) memcpy(s->ext, big, full_size);
            }
            return 0;
        }
        /* SET: components inside UML's buffer from UML, the rest as last saved for this buffer. */
        struct slot *s = find(iov->iov_base, 0);
        if (s && s->ext) memcpy(big, s->ext, full_size);
        uint64_t hi_bv; memcpy(&hi_bv, big + HDR, 8);
        uint64_t lo_bv; memcpy(&lo_bv, (unsigned char *)iov->iov_base + HDR, 8);
        uint64_t lo_mask = n >= 832 ? 0x7 : 0x3;
        memcpy(big, iov->iov_base, n);
        uint64_t bv = (lo_bv & lo_mask) | (hi_bv & ~lo_mask);
        memcpy(big + HDR, &bv, 8);
        b.iov_len = full_size;
        return raw(PTRACE_SETREGSET, pid, addr, &b);
    }
plain:;
    static long (*real)(enum __ptrace_request, ...);
    if (!real) real = dlsym(RTLD_NEXT, "ptrace");
    return real(req, pid, addr, data);
}
