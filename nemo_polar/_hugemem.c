// SPDX-License-Identifier: Apache-2.0
/* CPython's object arenas on transparent huge pages, for the serving processes (`proxy/tuning.py`, "Huge pages").
 *
 *   install() -> bool: from now on, pymalloc's arenas come from this module (True; False where it cannot: not Linux);
 *   stats() -> dict:   chunks mapped, arenas carved from them, arenas handed out again, arenas kept free, released.
 *
 * CPython keeps its small objects (everything up to 512 bytes: dicts, frames' locals, ints, floats, short strings)
 * in 1 MiB arenas it maps one at a time with `mmap`, so a serving process's interpreter state is spread over 4 KiB
 * pages, and every call's walk through it costs TLB misses; at concurrency 1 the TLB is refilled after each switch
 * to the client or the engine. Here arenas are cut from 32 MiB chunks aligned to 2 MiB and marked `MADV_HUGEPAGE`,
 * so the kernel backs them with 2 MiB pages where it can (THP in `madvise` or `always` mode).
 *
 * An arena CPython frees is kept on a free list and handed out again (no unmapping, no fresh zeroed pages), up to
 * `KEEP_FREE` of them; beyond that it is unmapped (a part of a huge page then goes back as small pages). Requests of
 * any other size (CPython's frame stack chunks use the same allocator) go to `mmap` / `munmap` as CPython's default
 * allocator does, so only arenas change. The allocator is only called with the GIL held; a mutex still guards the
 * free list and the current chunk, for interpreters with a GIL of their own (3.12+).
 *
 * `install` may run after the interpreter has made arenas: those stay where they are, and when freed join the free
 * list (they are 1 MiB mappings too). The objects that live longest (modules, code, the server's objects) should be
 * made after it, which is why the serving commands call it before they import the server (`tuning.py`).
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>

#if defined(__linux__)
#include <pthread.h>
#include <stdint.h>
#include <sys/mman.h>

#define ARENA_BYTES ((size_t)1 << 20) /* CPython 3.10+'s arena size on 64-bit builds; other sizes pass through */
#define HUGE_BYTES ((size_t)2 << 20)
#define CHUNK_BYTES ((size_t)32 << 20)
#define KEEP_FREE 256 /* free arenas kept for reuse (256 MiB); more are unmapped */

static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;
static char *cur, *end;    /* the part of the current chunk not yet carved */
static void *free_list;    /* freed arenas, linked through their first word */
static Py_ssize_t n_free, n_chunks, n_carved, n_reused, n_released;
static int installed;

static void *plain_map(size_t size) {
    void *p = mmap(NULL, size, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    return p == MAP_FAILED ? NULL : p;
}

/* a new chunk of CHUNK_BYTES aligned to HUGE_BYTES (the slack around it unmapped), or 0 */
static int new_chunk(void) {
    char *m = plain_map(CHUNK_BYTES + HUGE_BYTES);
    if (m == NULL)
        return 0;
    char *a = (char *)(((uintptr_t)m + HUGE_BYTES - 1) & ~(uintptr_t)(HUGE_BYTES - 1));
    if (a > m)
        munmap(m, (size_t)(a - m));
    char *tail = a + CHUNK_BYTES, *stop = m + CHUNK_BYTES + HUGE_BYTES;
    if (stop > tail)
        munmap(tail, (size_t)(stop - tail));
    (void)madvise(a, CHUNK_BYTES, MADV_HUGEPAGE); /* refused (THP off): small pages, as before */
    cur = a;
    end = tail;
    n_chunks++;
    return 1;
}

static void *huge_alloc(void *ctx, size_t size) {
    (void)ctx;
    if (size != ARENA_BYTES)
        return plain_map(size);
    void *p = NULL;
    pthread_mutex_lock(&lock);
    if (free_list != NULL) {
        p = free_list;
        free_list = *(void **)p;
        n_free--;
        n_reused++;
    } else if ((cur != NULL && (size_t)(end - cur) >= size) || new_chunk()) {
        p = cur;
        cur += size;
        n_carved++;
    }
    pthread_mutex_unlock(&lock);
    return p; /* NULL: CPython falls back to its raw allocator for the object */
}

static void huge_free(void *ctx, void *ptr, size_t size) {
    (void)ctx;
    if (size != ARENA_BYTES) {
        munmap(ptr, size);
        return;
    }
    pthread_mutex_lock(&lock);
    if (n_free < KEEP_FREE) {
        *(void **)ptr = free_list;
        free_list = ptr;
        n_free++;
        ptr = NULL;
    } else {
        n_released++;
    }
    pthread_mutex_unlock(&lock);
    if (ptr != NULL)
        munmap(ptr, size);
}

static PyObject *install(PyObject *self, PyObject *noargs) {
    (void)self;
    (void)noargs;
    if (!installed) {
        PyObjectArenaAllocator mine = {NULL, huge_alloc, huge_free};
        PyObject_SetArenaAllocator(&mine);
        installed = 1;
    }
    Py_RETURN_TRUE;
}

static PyObject *stats(PyObject *self, PyObject *noargs) {
    (void)self;
    (void)noargs;
    pthread_mutex_lock(&lock);
    Py_ssize_t c = n_chunks, k = n_carved, r = n_reused, f = n_free, rel = n_released;
    pthread_mutex_unlock(&lock);
    return Py_BuildValue("{s:O,s:n,s:n,s:n,s:n,s:n}", "installed", installed ? Py_True : Py_False, "chunks", c,
                         "carved", k, "reused", r, "free", f, "released", rel);
}
#else
static PyObject *install(PyObject *self, PyObject *noargs) {
    (void)self;
    (void)noargs;
    Py_RETURN_FALSE;
}

static PyObject *stats(PyObject *self, PyObject *noargs) {
    (void)self;
    (void)noargs;
    return Py_BuildValue("{s:O,s:n,s:n,s:n,s:n,s:n}", "installed", Py_False, "chunks", (Py_ssize_t)0, "carved",
                         (Py_ssize_t)0, "reused", (Py_ssize_t)0, "free", (Py_ssize_t)0, "released", (Py_ssize_t)0);
}
#endif

static PyMethodDef methods[] = {
    {"install", install, METH_NOARGS, "Take over pymalloc's arenas: 1 MiB arenas cut from 2 MiB-aligned huge-page chunks."},
    {"stats", stats, METH_NOARGS, "Chunks mapped, arenas carved, reused, kept free and released."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "_hugemem", NULL, -1, methods};

PyMODINIT_FUNC PyInit__hugemem(void) { return PyModule_Create(&module); }
