/* hangtrace.hooks._fastrec: the per-collective hot path in C (optional).
 *
 * Same behaviour as the pure-Python code it replaces (``recorder.Recorder.issue`` /
 * ``complete`` and ``torch_dist._make_wrapper``); the pure-Python path stays the
 * reference and the fallback (no compiler, or HANGTRACE_PURE_PYTHON=1).
 *
 * Types:
 *   Ring       slot writer over the ring file's mmap (docs/FORMAT.md, version 1). Holds
 *              a Py_buffer of the mapping for its whole life, the record counter, the
 *              last index, the progress counter, the current step and phase. Methods
 *              issue(), complete(), slot(), touch(). The GIL makes the counter atomic.
 *   StateBase  C fields of torch_dist.State (rec -> its Ring, seq/groups/dtypes/shapes
 *              dicts, log, fault), so the wrapper reads them without attribute lookups;
 *              plus one-entry caches of the last group entry, shape and dtype seen.
 *   Call       the recording call of one wrapped torch.distributed function, installed
 *              as the function itself. Reads torch_dist's module global ``_state`` (again
 *              only when that module's globals changed; None = pass through; a
 *              plain-Python State = the Python wrapper ``slow``), keeps the per-thread
 *              nesting guard in ``Busy`` (torch_dist._busy), and calls back into Python only
 *              on cache misses and rare cases (async completion, group-relative peers,
 *              list/object payloads, failures).
 *   Busy       torch_dist._busy: {thread ident: 1}, the calling thread's entry a
 *              thread-local flag.
 *
 * Per call the common case costs (callgrind, world-size-1 gloo all_reduce, torch 2.13,
 * steady state): about 560 instructions; a plain tensor's dims and dtype are read from
 * its TensorImpl (TL below), torch's ``shape``/``dtype`` getters run only on cache misses.
 *
 * Never raises from recording into the caller: recording errors (subclasses of
 * Exception, as in Python) are reported through the state's log callable; the
 * wrapped function's return value and exception pass through untouched.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <structmember.h>
#include <pythread.h>
#include <stdint.h>
#include <string.h>
#include <time.h>
#include <errno.h>
#include <stdlib.h>
#include <unistd.h>
#include <signal.h>
#include <fcntl.h>

/* --- ring layout (docs/FORMAT.md; hangtrace/tracer/ring/layout.py) ----------------- */
#define HEADER_SIZE 4096
#define SLOT_SIZE 128
#define LIVE_ISSUE_OFF 512 /* next_idx, inflight_idx */
#define LIVE_DONE_OFF 520  /* inflight_idx, progress_mono_ns, progress_wall_ns, progress_count */
#define COMPLETE_OFF 72    /* state u8, 3 pad, err u32, t_end_mono_ns u64 */
#define S_ISSUED 1
#define S_COMPLETED 2
#define S_FAILED 3
#define F_ASYNC 1
#define PHASE_OFF 552 /* cur_phase u32, depth i32, step i64 */
#define K_PHASE_ENTER 4
#define K_PHASE_EXIT 5
#define K_STEP 6
#define K_MEM 9

/* --- a plain torch.Tensor's sizes and dtype read from its TensorImpl ----------------
 * The layout is not a public API, so it is never assumed: probe_tensor_layout() finds it
 * per process from tensors of known shapes and dtypes (torch's own ``_cdata`` gives each
 * one's TensorImpl address) and takes it only when exactly one candidate fits every probe.
 * Then, for an object of exactly torch.Tensor whose TensorImpl has the probed dense
 * tensors' vtable and at most TL_MAX_DIMS dims (kept inline), the wrapper compares the
 * dims and the raw dtype with the State's last ones instead of calling torch's ``shape``
 * and ``dtype`` getters (about 750 instructions per call). Every cache miss still calls
 * the getters and checks the raw read against them; a disagreement turns the layout off
 * for the process (tensor_layout() then says why). Source of the fields:
 * c10/core/TensorImpl.h (sizes_and_strides_, data_type_) and SizesAndStrides.h (size_
 * then inline storage of C10_SIZES_AND_STRIDES_MAX_INLINE_SIZE = 5 sizes). */
#define TL_MAX_DIMS 5
static struct {
    int ok;                 /* 1: the fields below were probed and still hold */
    Py_ssize_t cdata_off;   /* THPVariable: offset of the TensorImpl pointer */
    void *vtbl;             /* a plain dense TensorImpl's vtable pointer */
    Py_ssize_t sizes_off;   /* TensorImpl: size_t ndim, then ndim int64 sizes (inline) */
    Py_ssize_t dtype_off;   /* TensorImpl: uint16 TypeMeta index */
    const char *off_why;    /* why the layout is off (static string), NULL while never probed */
    PyObject *raw_dtypes[256]; /* borrowed torch.dtype (immortal in torch) seen per raw value */
} TL;

/* The TensorImpl of plain tensor ``obj`` when it can be read (probed layout, dense
 * vtable, inline sizes), else NULL. */
static inline const char *tensor_impl(PyObject *obj) {
    const char *impl;
    if (!TL.ok)
        return NULL;
    impl = *(const char *const *)((const char *)obj + TL.cdata_off);
    if (impl == NULL || *(void *const *)impl != TL.vtbl || *(const uint64_t *)(impl + TL.sizes_off) > TL_MAX_DIMS)
        return NULL;
    return impl;
}

static inline long long impl_ndim(const char *impl) { return (long long)*(const uint64_t *)(impl + TL.sizes_off); }
static inline const int64_t *impl_sizes(const char *impl) { return (const int64_t *)(impl + TL.sizes_off + 8); }
static inline int impl_dtype(const char *impl) { return *(const uint16_t *)(impl + TL.dtype_off); }

static void tl_off(const char *why) {
    TL.ok = 0;
    TL.off_why = why;
}

static PyObject *StructError; /* struct.error: what struct.pack_into raises on range errors */

static inline void put8(char *p, uint64_t v) { *(unsigned char *)p = (unsigned char)v; }
static inline void put32(char *p, uint32_t v) {
#if defined(__BYTE_ORDER__) && __BYTE_ORDER__ == __ORDER_BIG_ENDIAN__
    v = __builtin_bswap32(v);
#endif
    memcpy(p, &v, 4);
}
static inline void put64(char *p, uint64_t v) {
#if defined(__BYTE_ORDER__) && __BYTE_ORDER__ == __ORDER_BIG_ENDIAN__
    v = __builtin_bswap64(v);
#endif
    memcpy(p, &v, 8);
}

/* time.monotonic_ns() and time.time_ns() read these clocks (CPython, Linux). */
static inline uint64_t mono_ns(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}
static inline uint64_t wall_ns(void) {
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

/* The wall-clock time at monotonic time ``mono`` (ns): mono + the offset between the two
 * clocks, read again once the last reading is 100 ms old (monotonic), so a record costs
 * one clock read, not two. An NTP slew moves the offset by at most 0.5 ms per second
 * (adjtimex's limit, 500 ppm), i.e. < 50 us between readings; a step of the wall clock
 * (settimeofday) shows within 100 ms. Under the GIL (all callers hold it). */
static uint64_t wall_off_mono; /* monotonic time of the last reading, 0 = none */
static uint64_t wall_off;      /* wall - mono at that reading (mod 2^64) */

static inline uint64_t wall_at(uint64_t mono) {
    if (wall_off_mono == 0 || mono - wall_off_mono > 100000000ull) {
        wall_off = wall_ns() - mono;
        wall_off_mono = mono;
    }
    return mono + wall_off;
}

#define U8_MAX_ 255LL
#define U32_MAX_ 4294967295LL
#define I32_MIN_ (-2147483648LL)
#define I32_MAX_ 2147483647LL

/* struct.error with struct's own message for a value v outside [lo, hi]. */
static void range_error(long long lo, long long hi, long long v) {
    const char *msg = "argument out of range";
    if (hi == U8_MAX_)
        msg = "ubyte format requires 0 <= number <= 255";
    else if (hi == U32_MAX_ && v >= 0)
        msg = "'I' format requires 0 <= number <= 4294967295";
    else if (hi == I32_MAX_)
        msg = "'i' format requires -2147483648 <= number <= 2147483647";
    PyErr_SetString(StructError, msg);
}

/* An integer argument within [lo, hi] (struct's range check; error = struct.error). */
static int get_int(PyObject *o, long long lo, long long hi, long long *out) {
    long long v;
    if (!PyLong_Check(o) && !PyIndex_Check(o)) {
        PyErr_SetString(StructError, "required argument is not an integer");
        return -1;
    }
    v = PyLong_AsLongLong(o);
    if (v == -1 && PyErr_Occurred()) {
        if (PyErr_ExceptionMatches(PyExc_OverflowError)) {
            PyErr_Clear();
            PyErr_SetString(StructError, "argument out of range");
        }
        return -1;
    }
    if (v < lo || v > hi) {
        range_error(lo, hi, v);
        return -1;
    }
    *out = v;
    return 0;
}

/* =============================================================================== Ring */
typedef struct {
    PyObject_HEAD
    Py_buffer view;
    int have_view;
    char *base;
    unsigned long long nslots;
    unsigned long long counter;  /* last index handed out */
    unsigned long long last;     /* newest index written (Recorder._last) */
    unsigned long long progress; /* Recorder._progress */
    long long step;              /* Recorder._step */
    unsigned int cur_phase;      /* Recorder._cur_phase */
    PyObject *threads;           /* dict: thread ident -> thread name strid (Recorder._threads) */
    PyObject *phases;            /* dict: thread ident -> [(phase strid, name), ...] (Recorder._phase) */
    PyObject *thread_id;         /* callable() -> strid of the calling thread (cache miss) */
    PyObject *intern;            /* callable(text) -> strid */
    PyObject *strings;           /* dict text -> strid (Recorder._strings) or NULL: the phase API's intern cache */
    unsigned long long gen;      /* unique per Ring instance (the per-thread caches' key) */
    long long mem_last_ns;       /* monotonic time of the newest host memory sample written here, 0 none */
    long long mem_last_a[3];     /* that sample's RSS, cgroup usage, oom_kill count (phase_in's reuse) */
} RingObject;

static unsigned long long ring_gen_next; /* last Ring.gen handed out (under the GIL) */
/* Per-thread state of the C path, one block (one TLS address lookup per function):
 *   tid, tid_gen  the thread-name strid of this thread in the Ring of generation tid_gen
 *                 (Recorder._threads never drops or changes an entry while its Ring lives);
 *   ident, ident_val  threading.get_ident() of this thread as an int object (kept: saves
 *                 an allocation per call), and its value;
 *   busy          this thread is inside a wrapped call (its entry of torch_dist._busy). */
typedef struct {
    unsigned long long tid_gen, tid;
    unsigned long ident_val;
    PyObject *ident;
    int busy;
} TlsBlock;
static __thread TlsBlock tls;

#define UNLIKELY(x) __builtin_expect(!!(x), 0)
#define LIKELY(x) __builtin_expect(!!(x), 1)

/* threading.get_ident() of the calling thread as an int object (new reference). */
static PyObject *current_ident(void) {
    TlsBlock *T = &tls;
    unsigned long id = PyThread_get_thread_ident();
    if (T->ident == NULL || T->ident_val != id) {
        PyObject *o = PyLong_FromUnsignedLong(id);
        if (o == NULL)
            return NULL;
        Py_XSETREF(T->ident, o);
        T->ident_val = id;
    }
    Py_INCREF(T->ident);
    return T->ident;
}

static PyTypeObject RingType;

static int ring_check(RingObject *r) {
    if (r->base == NULL) {
        PyErr_SetString(PyExc_ValueError, "hangtrace ring released");
        return -1;
    }
    return 0;
}

static inline char *slot_ptr(RingObject *r, long long idx) {
    long long n = (long long)r->nslots;
    long long pos = (idx - 1) % n;
    if (pos < 0)
        pos += n; /* Python's modulo for odd indices */
    return r->base + HEADER_SIZE + pos * SLOT_SIZE;
}

/* Thread-name strid and innermost phase strid of the calling thread (its
 * threading.get_ident() object is made only when a dict is consulted). */
static int ring_thread_phase(RingObject *r, unsigned long long *tid, unsigned long long *phase) {
    TlsBlock *T = &tls;
    PyObject *v, *ident = NULL, *st;
    int truth = 0, rc = -1;
    long long t;
    if (LIKELY(T->tid_gen == r->gen && r->gen != 0)) {
        *tid = T->tid;
        if (LIKELY(PyDict_GET_SIZE(r->phases) == 0)) { /* no phase open on any thread */
            *phase = r->cur_phase;
            return 0;
        }
    }
    if ((ident = current_ident()) == NULL)
        return -1;
    if (T->tid_gen != r->gen || r->gen == 0) {
        v = PyDict_GetItemWithError(r->threads, ident); /* borrowed */
        if (v != NULL) {
            truth = PyObject_IsTrue(v);
            if (UNLIKELY(truth < 0))
                goto out;
        } else if (UNLIKELY(PyErr_Occurred())) {
            goto out;
        }
        if (truth) {
            Py_INCREF(v);
        } else {
            v = PyObject_CallNoArgs(r->thread_id);
            if (UNLIKELY(v == NULL))
                goto out;
        }
        int grc = get_int(v, 0, U32_MAX_, &t);
        Py_DECREF(v);
        if (UNLIKELY(grc < 0))
            goto out;
        *tid = (unsigned long long)t;
        T->tid = *tid;
        T->tid_gen = r->gen;
    }
    *phase = r->cur_phase;
    rc = 0;
    if (PyDict_GET_SIZE(r->phases) == 0)
        goto out;
    st = PyDict_GetItemWithError(r->phases, ident);
    if (UNLIKELY(st == NULL)) {
        rc = PyErr_Occurred() ? -1 : 0;
        goto out;
    }
    rc = -1;
    Py_INCREF(st);
    truth = PyObject_IsTrue(st);
    if (truth <= 0) {
        Py_DECREF(st);
        rc = truth < 0 ? -1 : 0;
        goto out;
    }
    PyObject *top = PySequence_GetItem(st, -1);
    Py_DECREF(st);
    if (UNLIKELY(top == NULL))
        goto out;
    PyObject *sid = PySequence_GetItem(top, 0);
    Py_DECREF(top);
    if (UNLIKELY(sid == NULL))
        goto out;
    int grc = get_int(sid, 0, U32_MAX_, &t);
    Py_DECREF(sid);
    if (UNLIKELY(grc < 0))
        goto out;
    *phase = (unsigned long long)t;
    rc = 0;
out:
    Py_DECREF(ident);
    return rc;
}

/* Write one full slot. Fields as in format.SLOT. Returns the index or 0 with an error set. */
static unsigned long long ring_write(RingObject *r, long long kind, long long flags, long long dtype,
                                     long long op, long long group, long long seq, long long numel, long long shape,
                                     long long peer, long long state, long long err, const long long *a,
                                     int header) {
    unsigned long long idx, tid = 0, phase = 0;
    uint64_t now, wall;
    char buf[SLOT_SIZE];
    if (UNLIKELY(ring_check(r) < 0))
        return 0;
    idx = ++r->counter;
    r->last = idx;
    if (ring_thread_phase(r, &tid, &phase) < 0)
        return 0;
    now = mono_ns();
    wall = wall_at(now);
    memset(buf, 0, sizeof(buf));
    put64(buf + 0, idx);
    put8(buf + 8, (uint64_t)kind);
    put8(buf + 9, (uint64_t)flags);
    put8(buf + 10, (uint64_t)dtype);
    put8(buf + 11, (uint64_t)op);
    put32(buf + 12, (uint32_t)group);
    put64(buf + 16, (uint64_t)seq);
    put64(buf + 24, (uint64_t)numel);
    put32(buf + 32, (uint32_t)shape);
    put32(buf + 36, (uint32_t)(int32_t)peer);
    put32(buf + 40, (uint32_t)tid);
    put32(buf + 44, (uint32_t)phase);
    put64(buf + 48, (uint64_t)r->step);
    put64(buf + 56, now);
    put64(buf + 64, wall);
    put8(buf + 72, (uint64_t)state);
    put32(buf + 76, (uint32_t)err);
    put64(buf + 80, state != S_ISSUED ? now : 0);
    if (a != NULL) {
        for (int i = 0; i < 5; i++)
            put64(buf + 88 + 8 * i, (uint64_t)a[i]);
    }
    memcpy(slot_ptr(r, (long long)idx), buf, SLOT_SIZE);
    if (header) {
        put64(r->base + LIVE_ISSUE_OFF, idx);
        put64(r->base + LIVE_ISSUE_OFF + 8, idx);
    }
    return idx;
}

/* One progress event at monotonic time ``now``: in-flight cleared, progress time and count
 * (the header's LIVE_DONE fields; Recorder._touch_progress). */
static void ring_touch(RingObject *r, uint64_t now) {
    char *p = r->base + LIVE_DONE_OFF;
    r->progress += 1;
    put64(p, 0);
    put64(p + 8, now);
    put64(p + 16, wall_at(now));
    put64(p + 24, r->progress);
}

/* Record ``idx`` as completed (no error): in place when not yet overwritten; progress. */
static int ring_complete_ok(RingObject *r, long long idx) {
    uint64_t now;
    char *p;
    if (UNLIKELY(ring_check(r) < 0))
        return -1;
    now = mono_ns();
    if ((long long)r->last - idx < (long long)r->nslots) {
        p = slot_ptr(r, idx) + COMPLETE_OFF;
        put8(p, S_COMPLETED);
        p[1] = p[2] = p[3] = 0;
        put32(p + 4, 0);
        put64(p + 8, now);
    }
    ring_touch(r, now);
    return 0;
}

static int ring_complete_err(RingObject *r, long long idx, PyObject *err) {
    uint64_t now;
    if (ring_check(r) < 0)
        return -1;
    now = mono_ns();
    if ((long long)r->last - idx < (long long)r->nslots) {
        PyObject *cut = PySequence_GetSlice(err, 0, 4000);
        if (cut == NULL)
            return -1;
        PyObject *sid = PyObject_CallOneArg(r->intern, cut);
        Py_DECREF(cut);
        if (sid == NULL)
            return -1;
        long long s;
        int rc = get_int(sid, 0, U32_MAX_, &s);
        Py_DECREF(sid);
        if (rc < 0)
            return -1;
        if (ring_check(r) < 0)
            return -1;
        char *p = slot_ptr(r, idx) + COMPLETE_OFF;
        put8(p, S_FAILED);
        p[1] = p[2] = p[3] = 0;
        put32(p + 4, (uint32_t)s);
        put64(p + 8, now);
    }
    put64(r->base + LIVE_DONE_OFF, 0); /* clear in-flight */
    return 0;
}

/* A record whose fields do not fit uses up an index and leaves its slot empty, as in
 * Python (struct.pack_into raises after next(counter); the slot is then zeroed). */
static void ring_burn(RingObject *r) {
    if (r->base != NULL) {
        r->last = ++r->counter;
        memset(slot_ptr(r, (long long)r->counter), 0, SLOT_SIZE);
    }
}

/* Ring(mm, nslots, threads, phases, thread_id, intern) */
static int Ring_init(RingObject *self, PyObject *args, PyObject *kwds) {
    PyObject *mm, *threads, *phases, *thread_id, *intern;
    unsigned long long nslots;
    static char *kwlist[] = {"mm", "nslots", "threads", "phases", "thread_id", "intern", NULL};
    if (!PyArg_ParseTupleAndKeywords(args, kwds, "OKO!O!OO:Ring", kwlist, &mm, &nslots, &PyDict_Type, &threads,
                                     &PyDict_Type, &phases, &thread_id, &intern))
        return -1;
    if (self->have_view) {
        PyErr_SetString(PyExc_RuntimeError, "Ring already initialised");
        return -1;
    }
    if (nslots == 0) {
        PyErr_SetString(PyExc_ValueError, "nslots must be > 0");
        return -1;
    }
    if (PyObject_GetBuffer(mm, &self->view, PyBUF_WRITABLE) < 0)
        return -1;
    self->have_view = 1;
    if ((unsigned long long)self->view.len < HEADER_SIZE + nslots * SLOT_SIZE) {
        PyErr_SetString(PyExc_ValueError, "buffer shorter than the header and slots");
        return -1;
    }
    self->base = (char *)self->view.buf;
    self->nslots = nslots;
    self->step = -1;
    self->gen = ++ring_gen_next;
    Py_INCREF(threads);
    Py_XSETREF(self->threads, threads);
    Py_INCREF(phases);
    Py_XSETREF(self->phases, phases);
    Py_INCREF(thread_id);
    Py_XSETREF(self->thread_id, thread_id);
    Py_INCREF(intern);
    Py_XSETREF(self->intern, intern);
    return 0;
}

static int Ring_traverse(RingObject *self, visitproc visit, void *arg) {
    Py_VISIT(self->threads);
    Py_VISIT(self->phases);
    Py_VISIT(self->thread_id);
    Py_VISIT(self->intern);
    Py_VISIT(self->strings);
    if (self->have_view)
        Py_VISIT(self->view.obj);
    return 0;
}

static void ring_release(RingObject *self) {
    self->base = NULL;
    if (self->have_view) {
        self->have_view = 0;
        PyBuffer_Release(&self->view);
    }
}

static int Ring_clear(RingObject *self) {
    Py_CLEAR(self->threads);
    Py_CLEAR(self->phases);
    Py_CLEAR(self->thread_id);
    Py_CLEAR(self->intern);
    Py_CLEAR(self->strings);
    ring_release(self);
    return 0;
}

static void Ring_dealloc(RingObject *self) {
    PyObject_GC_UnTrack(self);
    Ring_clear(self);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

static int ring_ready(RingObject *self) {
    if (self->threads == NULL) {
        PyErr_SetString(PyExc_ValueError, "Ring not initialised");
        return -1;
    }
    return ring_check(self);
}

PyDoc_STRVAR(Ring_issue_doc,
             "issue(kind, op, group, seq, numel, shape, dtype, peer, flags) -> idx\n\n"
             "Write a collective or p2p record (state issued) and the header's next/in-flight index.");

static PyObject *Ring_issue(RingObject *self, PyObject *const *args, Py_ssize_t nargs) {
    long long kind, op, group, seq, numel, shape, dtype, peer, flags;
    if (nargs != 9) {
        PyErr_Format(PyExc_TypeError, "issue() takes 9 arguments (%zd given)", nargs);
        return NULL;
    }
    if (ring_ready(self) < 0)
        return NULL;
    if (get_int(args[0], 0, U8_MAX_, &kind) < 0 || get_int(args[1], 0, U8_MAX_, &op) < 0 ||
        get_int(args[2], 0, U32_MAX_, &group) < 0 || get_int(args[3], LLONG_MIN, LLONG_MAX, &seq) < 0 ||
        get_int(args[4], LLONG_MIN, LLONG_MAX, &numel) < 0 || get_int(args[5], 0, U32_MAX_, &shape) < 0 ||
        get_int(args[6], 0, U8_MAX_, &dtype) < 0 || get_int(args[7], I32_MIN_, I32_MAX_, &peer) < 0 ||
        get_int(args[8], 0, U8_MAX_, &flags) < 0) {
        ring_burn(self);
        return NULL;
    }
    unsigned long long idx = ring_write(self, kind, flags, dtype, op, group, seq, numel, shape, peer,
                                        S_ISSUED, 0, NULL, 1);
    if (idx == 0)
        return NULL;
    return PyLong_FromUnsignedLongLong(idx);
}

PyDoc_STRVAR(Ring_complete_doc,
             "complete(idx, err=None)\n\n"
             "Mark record idx completed (or failed with the text err) in place unless the ring\n"
             "overwrote it meanwhile; count progress (completed) or clear the in-flight index (failed).");

static PyObject *Ring_complete(RingObject *self, PyObject *const *args, Py_ssize_t nargsf, PyObject *kwnames) {
    Py_ssize_t nargs = PyVectorcall_NARGS(nargsf);
    PyObject *idxo = NULL, *err = Py_None;
    Py_ssize_t nkw = kwnames ? PyTuple_GET_SIZE(kwnames) : 0;
    if (nargs > 2 || nargs + nkw > 2) {
        PyErr_SetString(PyExc_TypeError, "complete() takes idx and optional err");
        return NULL;
    }
    if (nargs >= 1)
        idxo = args[0];
    if (nargs == 2)
        err = args[1];
    for (Py_ssize_t i = 0; i < nkw; i++) {
        PyObject *k = PyTuple_GET_ITEM(kwnames, i);
        if (PyUnicode_CompareWithASCIIString(k, "err") == 0 && nargs < 2)
            err = args[nargs + i];
        else if (PyUnicode_CompareWithASCIIString(k, "idx") == 0 && nargs < 1)
            idxo = args[nargs + i];
        else {
            PyErr_Format(PyExc_TypeError, "complete() got an unexpected keyword argument %R", k);
            return NULL;
        }
    }
    if (idxo == NULL) {
        PyErr_SetString(PyExc_TypeError, "complete() missing argument 'idx'");
        return NULL;
    }
    if (ring_ready(self) < 0)
        return NULL;
    long long idx = PyLong_AsLongLong(idxo);
    if (idx == -1 && PyErr_Occurred())
        return NULL;
    if ((err == Py_None ? ring_complete_ok(self, idx) : ring_complete_err(self, idx, err)) < 0)
        return NULL;
    Py_RETURN_NONE;
}

PyDoc_STRVAR(Ring_slot_doc,
             "slot(kind, op, group, seq, numel, shape, dtype, peer, state, flags, err, a0, a1, a2, a3, a4) -> idx\n\n"
             "Write any record (Recorder._slot); completed/failed records get t_end = t_issue.");

static PyObject *Ring_slot(RingObject *self, PyObject *const *args, Py_ssize_t nargs) {
    long long v[11], a[5];
    static const long long lo[11] = {0, 0, 0, LLONG_MIN, LLONG_MIN, 0, 0, I32_MIN_, 0, 0, 0};
    static const long long hi[11] = {U8_MAX_, U8_MAX_, U32_MAX_, LLONG_MAX, LLONG_MAX, U32_MAX_, U8_MAX_, I32_MAX_,
                                     U8_MAX_, U8_MAX_, U32_MAX_};
    if (nargs != 16) {
        PyErr_Format(PyExc_TypeError, "slot() takes 16 arguments (%zd given)", nargs);
        return NULL;
    }
    if (ring_ready(self) < 0)
        return NULL;
    for (int i = 0; i < 11; i++)
        if (get_int(args[i], lo[i], hi[i], &v[i]) < 0) {
            ring_burn(self);
            return NULL;
        }
    for (int i = 0; i < 5; i++)
        if (get_int(args[11 + i], LLONG_MIN, LLONG_MAX, &a[i]) < 0) {
            ring_burn(self);
            return NULL;
        }
    /* kind, op, group, seq, numel, shape, dtype, peer, state, flags, err */
    unsigned long long idx =
        ring_write(self, v[0], v[9], v[6], v[1], v[2], v[3], v[4], v[5], v[7], v[8], v[10], a, 0);
    if (idx == 0)
        return NULL;
    return PyLong_FromUnsignedLongLong(idx);
}

static PyObject *Ring_touch(RingObject *self, PyObject *Py_UNUSED(ignored)) {
    if (ring_ready(self) < 0)
        return NULL;
    ring_touch(self, mono_ns());
    Py_RETURN_NONE;
}

static PyObject *Ring_release(RingObject *self, PyObject *Py_UNUSED(ignored)) {
    ring_release(self);
    Py_RETURN_NONE;
}

/* --- one host memory sample (hooks/mem/sampler.py, Sampler.sample) ---------------------
 * What the Python sampler does with os.pread and int(), in one call: in a training step,
 * between kernels that evict the caches, the Python path cost about 25 us per sample
 * against 3 us in a loop (benchmarks/README.md, issue 13). Same figures, same record. */
static int mem_pread(long long fd, char *buf, size_t cap) { /* text length, or -1 */
    ssize_t n;
    if (fd < 0)
        return -1;
    do {
        n = pread((int)fd, buf, cap - 1, 0);
    } while (n < 0 && errno == EINTR);
    if (n < 0)
        return -1;
    buf[n] = 0;
    return (int)n;
}

/* Python's int(text) for the kernel's decimal figures: blanks around one signed decimal. */
static int mem_int(const char *s, const char *end, long long *out) {
    char tmp[32], *stop;
    size_t n;
    while (s < end && (*s == ' ' || *s == '\t' || *s == '\n' || *s == '\r'))
        s++;
    while (end > s && (end[-1] == ' ' || end[-1] == '\t' || end[-1] == '\n' || end[-1] == '\r'))
        end--;
    n = (size_t)(end - s);
    if (n == 0 || n >= sizeof(tmp))
        return -1;
    memcpy(tmp, s, n);
    tmp[n] = 0;
    errno = 0;
    *out = strtoll(tmp, &stop, 10);
    return (stop == tmp + n && errno == 0) ? 0 : -1;
}

PyDoc_STRVAR(Ring_mem_host_doc,
             "mem_host(source, what, statm_fd, page, usage_fd, oom_fd, swap, limit) -> idx\n\n"
             "One host memory sample, as hooks/mem/sampler.Sampler.sample takes it: RSS = field 2 of\n"
             "/proc/PID/statm x page (bytes), the cgroup's usage (bytes) and its oom_kill count\n"
             "(the 'oom_kill N' line of memory.oom_control or memory.events), each read with\n"
             "pread from an open descriptor (-1: none); a figure that cannot be read or parsed is -1.\n"
             "Writes the K_MEM record (a = rss, swap, usage, limit, oom_kill) Recorder.memory writes.");

/* One host sample: v = source, host strid, statm fd, page, usage fd, oom fd, swap, limit
 * (fds -1: none). Returns the record index or 0 with an error set. */
static unsigned long long ring_mem_host(RingObject *self, const long long *v) {
    long long a[5];
    char buf[512];
    int n;
    a[0] = a[2] = a[4] = -1;
    a[1] = v[6];
    a[3] = v[7];
    if ((n = mem_pread(v[2], buf, 64)) > 0) { /* "size resident shared ...": field 2 */
        const char *p = buf, *end = buf + n, *f;
        long long pages;
        while (p < end && (*p == ' ' || *p == '\t' || *p == '\n'))
            p++;
        while (p < end && !(*p == ' ' || *p == '\t' || *p == '\n'))
            p++;
        while (p < end && (*p == ' ' || *p == '\t' || *p == '\n'))
            p++;
        f = p;
        while (p < end && !(*p == ' ' || *p == '\t' || *p == '\n'))
            p++;
        if (p > f && mem_int(f, p, &pages) == 0)
            a[0] = pages * v[3];
    }
    if ((n = mem_pread(v[4], buf, 64)) > 0) {
        long long usage;
        if (mem_int(buf, buf + n, &usage) == 0)
            a[2] = usage;
    }
    if ((n = mem_pread(v[5], buf, 512)) > 0) { /* the line "oom_kill N" */
        const char *line = buf, *end = buf + n;
        while (line < end) {
            const char *nl = memchr(line, '\n', (size_t)(end - line));
            const char *stop = nl ? nl : end;
            long long k;
            if (stop - line > 9 && memcmp(line, "oom_kill ", 9) == 0 && mem_int(line + 9, stop, &k) == 0) {
                a[4] = k;
                break;
            }
            line = stop + 1;
        }
    }
    unsigned long long idx = ring_write(self, K_MEM, 0, 0, v[0], v[1], 0, 0, 0, -1, S_COMPLETED, 0, a, 0);
    if (idx != 0) {
        self->mem_last_ns = (long long)mono_ns();
        self->mem_last_a[0] = a[0];
        self->mem_last_a[1] = a[2];
        self->mem_last_a[2] = a[4];
    }
    return idx;
}

static const long long mem_lo[8] = {0, 0, -1, 1, -1, -1, LLONG_MIN, LLONG_MIN};
static const long long mem_hi[8] = {U8_MAX_, U32_MAX_, INT32_MAX, LLONG_MAX, INT32_MAX, INT32_MAX, LLONG_MAX, LLONG_MAX};

static PyObject *Ring_mem_host(RingObject *self, PyObject *const *args, Py_ssize_t nargs) {
    long long v[8];
    if (nargs != 8) {
        PyErr_Format(PyExc_TypeError, "mem_host() takes 8 arguments (%zd given)", nargs);
        return NULL;
    }
    if (ring_ready(self) < 0)
        return NULL;
    for (int i = 0; i < 8; i++)
        if (get_int(args[i], mem_lo[i], mem_hi[i], &v[i]) < 0)
            return NULL;
    unsigned long long idx = ring_mem_host(self, v);
    if (idx == 0)
        return NULL;
    return PyLong_FromUnsignedLongLong(idx);
}

/* --- the phase/step API in one call per boundary (tracer/api.py, issue 13) ----------
 * What _FastRecorder.phase_enter / phase_exit / step and Sampler.sample do in Python, the
 * same records in the same order: inside a training step, between kernels that evict the
 * caches, each Python frame of that path comes back cold (benchmarks/README.md). ``mem``:
 * None (no sample) or the 7 figures of Sampler.fast_args() (mem_host's arguments after the
 * source).
 *
 * api_mem_args: v = source, then the 7 figures of ``mem`` (a tuple, not None). 0, or -1
 * with an error set. */
static int api_mem_args(long long source, PyObject *mem, long long *v) {
    if (!PyTuple_Check(mem) || PyTuple_GET_SIZE(mem) != 7) {
        PyErr_SetString(PyExc_TypeError, "mem must be None or a tuple of 7 ints");
        return -1;
    }
    v[0] = source;
    for (int i = 1; i < 8; i++)
        if (get_int(PyTuple_GET_ITEM(mem, i - 1), mem_lo[i], mem_hi[i], &v[i]) < 0)
            return -1;
    return 0;
}

static int api_mem(RingObject *r, long long source, PyObject *mem) {
    long long v[8];
    if (mem == Py_None)
        return 0;
    if (api_mem_args(source, mem, v) < 0)
        return -1;
    return ring_mem_host(r, v) == 0 ? -1 : 0;
}

/* A phase's MEM_ENTER: when the newest host sample written here (its reads, not a reuse) is
 * younger than ``gap`` ns, its RSS, usage and oom_kill figures again, without reading
 * (swap and limit from ``mem``, as always); else a fresh sample (api_mem). Why: a phase
 * entered just after a phase left or a step began would read the same figures again, and
 * inside a training step those reads come back cold (~15 us, issue 13). */
static int api_mem_recent(RingObject *r, long long source, PyObject *mem, long long gap) {
    long long v[8], a[5];
    if (mem == Py_None || gap <= 0 || r->mem_last_ns <= 0 || (long long)mono_ns() - r->mem_last_ns >= gap)
        return api_mem(r, source, mem);
    if (api_mem_args(source, mem, v) < 0)
        return -1;
    a[0] = r->mem_last_a[0];
    a[1] = v[6];
    a[2] = r->mem_last_a[1];
    a[3] = v[7];
    a[4] = r->mem_last_a[2];
    return ring_write(r, K_MEM, 0, 0, v[0], v[1], 0, 0, 0, -1, S_COMPLETED, 0, a, 0) == 0 ? -1 : 0;
}

static void api_header(RingObject *r, long long depth) {
    char *p = r->base + PHASE_OFF;
    put32(p, (uint32_t)r->cur_phase);
    put32(p + 4, (uint32_t)(int32_t)depth);
    put64(p + 8, (uint64_t)r->step);
}

/* int(o) as Python's int() does it (a float is truncated), into *out. */
static int api_int(PyObject *o, long long *out) {
    PyObject *n = PyLong_Check(o) ? (Py_INCREF(o), o) : PyNumber_Long(o);
    if (n == NULL)
        return -1;
    *out = PyLong_AsLongLong(n);
    Py_DECREF(n);
    return (*out == -1 && PyErr_Occurred()) ? -1 : 0;
}

/* The strid of ``name`` (new reference): Recorder._strings, else Recorder.intern. */
static PyObject *api_intern(RingObject *r, PyObject *name) {
    if (r->strings != NULL && PyDict_Check(r->strings) && PyUnicode_CheckExact(name)) {
        PyObject *sid = PyDict_GetItemWithError(r->strings, name);
        if (sid != NULL) {
            Py_INCREF(sid);
            return sid;
        }
        if (PyErr_Occurred())
            return NULL;
    }
    return PyObject_CallOneArg(r->intern, name);
}

PyDoc_STRVAR(Ring_phase_in_doc,
             "phase_in(name: str, step: int | None, mem: tuple | None, gap_ns: int = 0) -> None\n\n"
             "Enter phase ``name`` on the calling thread: _FastRecorder.phase_enter's records (step set when\n"
             "given, the thread's phase stack, header, K_PHASE_ENTER, progress), then the MEM_ENTER sample;\n"
             "when the newest host sample read here is younger than ``gap_ns``, that sample's RSS, usage and\n"
             "oom_kill figures again, without reading (api.STEP_SAMPLE_GAP_NS).");

static PyObject *Ring_phase_in(RingObject *self, PyObject *const *args, Py_ssize_t nargs) {
    long long step, sid;
    long long gap = 0;
    if (nargs != 3 && nargs != 4) {
        PyErr_Format(PyExc_TypeError, "phase_in() takes 3 or 4 arguments (%zd given)", nargs);
        return NULL;
    }
    if (nargs == 4 && get_int(args[3], 0, LLONG_MAX, &gap) < 0)
        return NULL;
    if (ring_ready(self) < 0)
        return NULL;
    if (args[1] != Py_None) {
        if (api_int(args[1], &step) < 0)
            return NULL;
        self->step = step;
    }
    PyObject *sido = api_intern(self, args[0]);
    if (sido == NULL)
        return NULL;
    if (get_int(sido, 0, U32_MAX_, &sid) < 0) {
        Py_DECREF(sido);
        return NULL;
    }
    PyObject *ident = current_ident();
    if (ident == NULL) {
        Py_DECREF(sido);
        return NULL;
    }
    PyObject *st = PyDict_GetItemWithError(self->phases, ident); /* borrowed */
    if (st == NULL) {
        if (PyErr_Occurred() || (st = PyList_New(0)) == NULL || PyDict_SetItem(self->phases, ident, st) < 0) {
            Py_XDECREF(st);
            Py_DECREF(ident);
            Py_DECREF(sido);
            return NULL;
        }
        Py_DECREF(st); /* the dict holds it */
    }
    Py_DECREF(ident);
    PyObject *entry = PyTuple_Pack(2, sido, args[0]);
    Py_DECREF(sido);
    if (entry == NULL || PyList_Append(st, entry) < 0) {
        Py_XDECREF(entry);
        return NULL;
    }
    Py_DECREF(entry);
    Py_ssize_t depth = PyList_GET_SIZE(st);
    if (ring_check(self) < 0) /* (intern may have grown the string table: never the mapping) */
        return NULL;
    self->cur_phase = (unsigned int)sid;
    api_header(self, depth);
    if (ring_write(self, K_PHASE_ENTER, 0, 0, 0, 0, 0, 0, 0, -1, S_COMPLETED, 0, NULL, 0) == 0)
        return NULL;
    ring_touch(self, mono_ns());
    if (api_mem_recent(self, 2, args[2], gap) < 0) /* MEM_ENTER */
        return NULL;
    Py_RETURN_NONE;
}

PyDoc_STRVAR(Ring_phase_out_doc,
             "phase_out(name: str, mem: tuple | None, error: str | None = None) -> None\n\n"
             "Leave phase ``name``: the MEM_EXIT sample, then _FastRecorder.phase_exit's records (K_PHASE_EXIT,\n"
             "failed with the first 2000 characters of ``error`` when given, the thread's stack cut at its\n"
             "innermost ``name``, header, progress).");

static PyObject *Ring_phase_out(RingObject *self, PyObject *const *args, Py_ssize_t nargs) {
    long long esid = 0;
    int failed = 0;
    if (nargs != 2 && nargs != 3) {
        PyErr_Format(PyExc_TypeError, "phase_out() takes 2 or 3 arguments (%zd given)", nargs);
        return NULL;
    }
    if (ring_ready(self) < 0)
        return NULL;
    if (api_mem(self, 3, args[1]) < 0) /* MEM_EXIT */
        return NULL;
    if (nargs == 3 && args[2] != Py_None) {
        if ((failed = PyObject_IsTrue(args[2])) < 0)
            return NULL;
        if (failed) {
            PyObject *cut = PySequence_GetSlice(args[2], 0, 2000), *sido;
            if (cut == NULL)
                return NULL;
            sido = api_intern(self, cut);
            Py_DECREF(cut);
            if (sido == NULL)
                return NULL;
            int grc = get_int(sido, 0, U32_MAX_, &esid); /* (0: the string table is full) */
            Py_DECREF(sido);
            if (grc < 0 || ring_check(self) < 0)
                return NULL;
        }
    }
    if (ring_write(self, K_PHASE_EXIT, 0, 0, 0, 0, 0, 0, 0, -1, failed ? S_FAILED : S_COMPLETED, esid, NULL, 0) == 0)
        return NULL;
    PyObject *ident = current_ident();
    if (ident == NULL)
        return NULL;
    PyObject *st = PyDict_GetItemWithError(self->phases, ident); /* borrowed */
    Py_DECREF(ident);
    Py_ssize_t depth = 0;
    unsigned long long cur = 0;
    if (st == NULL && PyErr_Occurred())
        return NULL;
    if (st != NULL && PyList_Check(st)) {
        for (Py_ssize_t i = PyList_GET_SIZE(st) - 1; i >= 0; i--) {
            PyObject *e = PyList_GET_ITEM(st, i);
            if (PyTuple_Check(e) && PyTuple_GET_SIZE(e) == 2) {
                int eq = PyObject_RichCompareBool(PyTuple_GET_ITEM(e, 1), args[0], Py_EQ);
                if (eq < 0)
                    return NULL;
                if (eq) {
                    if (PyList_SetSlice(st, i, PyList_GET_SIZE(st), NULL) < 0)
                        return NULL;
                    break;
                }
            }
        }
        depth = PyList_GET_SIZE(st);
        if (depth > 0) {
            PyObject *top = PyList_GET_ITEM(st, depth - 1);
            long long t;
            if (!PyTuple_Check(top) || get_int(PyTuple_GET_ITEM(top, 0), 0, U32_MAX_, &t) < 0)
                return NULL;
            cur = (unsigned long long)t;
        }
    }
    self->cur_phase = (unsigned int)cur;
    api_header(self, depth);
    ring_touch(self, mono_ns());
    Py_RETURN_NONE;
}

PyDoc_STRVAR(Ring_step_to_doc,
             "step_to(n: int, mem: tuple | None, gap_ns: int) -> None\n\n"
             "_FastRecorder.step(n)'s records (step, header, K_STEP, progress), then the MEM_STEP sample unless\n"
             "the newest sample written here is younger than ``gap_ns`` (api.STEP_SAMPLE_GAP_NS).");

static PyObject *Ring_step_to(RingObject *self, PyObject *const *args, Py_ssize_t nargs) {
    long long n, gap;
    if (nargs != 3) {
        PyErr_Format(PyExc_TypeError, "step_to() takes 3 arguments (%zd given)", nargs);
        return NULL;
    }
    if (ring_ready(self) < 0 || api_int(args[0], &n) < 0 || get_int(args[2], 0, LLONG_MAX, &gap) < 0)
        return NULL;
    self->step = n;
    char *p = self->base + PHASE_OFF;
    int32_t depth;
    memcpy(&depth, p + 4, 4);
#if defined(__BYTE_ORDER__) && __BYTE_ORDER__ == __ORDER_BIG_ENDIAN__
    depth = (int32_t)__builtin_bswap32((uint32_t)depth);
#endif
    api_header(self, depth);
    if (ring_write(self, K_STEP, 0, 0, 0, 0, n, 0, 0, -1, S_COMPLETED, 0, NULL, 0) == 0)
        return NULL;
    ring_touch(self, mono_ns());
    if (args[1] != Py_None && (long long)mono_ns() - self->mem_last_ns >= gap && api_mem(self, 4, args[1]) < 0)
        return NULL; /* MEM_STEP */
    Py_RETURN_NONE;
}

static PyMethodDef Ring_methods[] = {
    {"issue", (PyCFunction)(void (*)(void))Ring_issue, METH_FASTCALL, Ring_issue_doc},
    {"complete", (PyCFunction)(void (*)(void))Ring_complete, METH_FASTCALL | METH_KEYWORDS, Ring_complete_doc},
    {"slot", (PyCFunction)(void (*)(void))Ring_slot, METH_FASTCALL, Ring_slot_doc},
    {"mem_host", (PyCFunction)(void (*)(void))Ring_mem_host, METH_FASTCALL, Ring_mem_host_doc},
    {"touch", (PyCFunction)Ring_touch, METH_NOARGS, "Count one progress event (header progress fields)."},
    {"phase_in", (PyCFunction)(void (*)(void))Ring_phase_in, METH_FASTCALL, Ring_phase_in_doc},
    {"phase_out", (PyCFunction)(void (*)(void))Ring_phase_out, METH_FASTCALL, Ring_phase_out_doc},
    {"step_to", (PyCFunction)(void (*)(void))Ring_step_to, METH_FASTCALL, Ring_step_to_doc},
    {"release", (PyCFunction)Ring_release, METH_NOARGS, "Drop the buffer (later writes raise ValueError)."},
    {NULL, NULL, 0, NULL},
};

static PyMemberDef Ring_members[] = {
    {"nslots", T_ULONGLONG, offsetof(RingObject, nslots), READONLY, "number of slots"},
    {"counter", T_ULONGLONG, offsetof(RingObject, counter), 0, "last record index handed out"},
    {"last", T_ULONGLONG, offsetof(RingObject, last), 0, "newest record index written"},
    {"progress", T_ULONGLONG, offsetof(RingObject, progress), 0, "progress events so far"},
    {"step", T_LONGLONG, offsetof(RingObject, step), 0, "current step (-1 none)"},
    {"cur_phase", T_UINT, offsetof(RingObject, cur_phase), 0, "strid of the process's current phase"},
    {"mem_last_ns", T_LONGLONG, offsetof(RingObject, mem_last_ns), 0,
     "monotonic ns of the newest host memory sample written through this Ring (0: none)"},
    {"strings", T_OBJECT, offsetof(RingObject, strings), 0,
     "dict text -> strid consulted by phase_in before intern (Recorder._strings), or None"},
    {NULL, 0, 0, 0, NULL},
};

static PyTypeObject RingType = {
    PyVarObject_HEAD_INIT(NULL, 0).tp_name = "hangtrace.hooks._fastrec.Ring",
    .tp_basicsize = sizeof(RingObject),
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_GC,
    .tp_doc = "Ring(mm, nslots, threads, phases, thread_id, intern): C slot writer of a ring file.",
    .tp_new = PyType_GenericNew,
    .tp_init = (initproc)Ring_init,
    .tp_dealloc = (destructor)Ring_dealloc,
    .tp_traverse = (traverseproc)Ring_traverse,
    .tp_clear = (inquiry)Ring_clear,
    .tp_methods = Ring_methods,
    .tp_members = Ring_members,
};

/* ============================================================================== Busy */
/* torch_dist._busy: the threads inside a wrapped call (their nested calls are not recorded
 * again). A mapping ``{thread ident: 1}`` as the dict it replaces (``ident in busy``,
 * ``busy[ident] = 1``, ``del busy[ident]``), but the calling thread's own entry is a
 * thread-local flag, so the C path tests and sets it without a dict operation. Entries
 * for other threads' idents (never made by torch_dist) live in a plain dict. */

typedef struct {
    PyObject_HEAD
    PyObject *other; /* dict: idents of other threads -> value */
} BusyObject;

static PyTypeObject BusyType;

/* 1: ``key`` is the calling thread's ident; 0: another int; -1: error (not an int). */
static int busy_own(PyObject *key) {
    unsigned long v;
    if (!PyLong_Check(key)) {
        PyErr_Format(PyExc_TypeError, "thread ident must be an int, not %.100s", Py_TYPE(key)->tp_name);
        return -1;
    }
    v = PyLong_AsUnsignedLong(key);
    if (v == (unsigned long)-1 && PyErr_Occurred()) {
        PyErr_Clear();
        return 0; /* negative or too large: never a thread ident */
    }
    return v == PyThread_get_thread_ident();
}

static int Busy_contains(BusyObject *self, PyObject *key) {
    int own = busy_own(key);
    if (own < 0)
        return -1;
    if (own)
        return tls.busy;
    return self->other != NULL ? PyDict_Contains(self->other, key) : 0;
}

static Py_ssize_t Busy_len(BusyObject *self) {
    return (Py_ssize_t)(tls.busy != 0) + (self->other != NULL ? PyDict_GET_SIZE(self->other) : 0);
}

static PyObject *Busy_getitem(BusyObject *self, PyObject *key) {
    int own = busy_own(key);
    if (own < 0)
        return NULL;
    if (own) {
        if (tls.busy)
            return PyLong_FromLong(1);
    } else if (self->other != NULL) {
        PyObject *v = PyDict_GetItemWithError(self->other, key);
        if (v != NULL) {
            Py_INCREF(v);
            return v;
        }
        if (PyErr_Occurred())
            return NULL;
    }
    PyErr_SetObject(PyExc_KeyError, key);
    return NULL;
}

/* busy[ident] = value / del busy[ident]. The calling thread's entry keeps no value (reads give 1). */
static int Busy_setitem(BusyObject *self, PyObject *key, PyObject *value) {
    int own = busy_own(key);
    if (own < 0)
        return -1;
    if (own) {
        if (value == NULL && !tls.busy) {
            PyErr_SetObject(PyExc_KeyError, key);
            return -1;
        }
        tls.busy = value != NULL;
        return 0;
    }
    if (self->other == NULL && (self->other = PyDict_New()) == NULL)
        return -1;
    return value == NULL ? PyDict_DelItem(self->other, key) : PyDict_SetItem(self->other, key, value);
}

static void Busy_dealloc(BusyObject *self) {
    Py_CLEAR(self->other);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

static PyMappingMethods Busy_as_mapping = {
    .mp_length = (lenfunc)Busy_len,
    .mp_subscript = (binaryfunc)Busy_getitem,
    .mp_ass_subscript = (objobjargproc)Busy_setitem,
};

static PySequenceMethods Busy_as_sequence = {
    .sq_contains = (objobjproc)Busy_contains,
};

static PyTypeObject BusyType = {
    PyVarObject_HEAD_INIT(NULL, 0).tp_name = "hangtrace.hooks._fastrec.Busy",
    .tp_basicsize = sizeof(BusyObject),
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = "Threads inside a wrapped call: {thread ident: 1}, the calling thread's entry thread-local.",
    .tp_new = PyType_GenericNew,
    .tp_dealloc = (destructor)Busy_dealloc,
    .tp_as_mapping = &Busy_as_mapping,
    .tp_as_sequence = &Busy_as_sequence,
};

/* ========================================================================== Counter */
/* A sequence counter cell: behaves as a one-item list of an int (``cell[0] += 1`` in the
 * Python paths) and is advanced in C without making an int object. */
typedef struct {
    PyObject_HEAD
    long long v;
} CounterObject;

static Py_ssize_t Counter_len(PyObject *self) { return 1; }

static PyObject *Counter_item(CounterObject *self, Py_ssize_t i) {
    if (i != 0) {
        PyErr_SetString(PyExc_IndexError, "Counter index out of range (one item)");
        return NULL;
    }
    return PyLong_FromLongLong(self->v);
}

static int Counter_ass_item(CounterObject *self, Py_ssize_t i, PyObject *value) {
    long long x;
    if (i != 0 || value == NULL) {
        PyErr_SetString(value == NULL ? PyExc_TypeError : PyExc_IndexError,
                        value == NULL ? "a Counter's item cannot be deleted" : "Counter index out of range (one item)");
        return -1;
    }
    x = PyLong_AsLongLong(value);
    if (x == -1 && PyErr_Occurred())
        return -1;
    self->v = x;
    return 0;
}

static PyObject *Counter_repr(CounterObject *self) { return PyUnicode_FromFormat("Counter([%lld])", self->v); }

static PySequenceMethods Counter_as_sequence = {
    .sq_length = Counter_len,
    .sq_item = (ssizeargfunc)Counter_item,
    .sq_ass_item = (ssizeobjargproc)Counter_ass_item,
};

static PyTypeObject CounterType = {
    PyVarObject_HEAD_INIT(NULL, 0).tp_name = "hangtrace.hooks._fastrec.Counter",
    .tp_basicsize = sizeof(CounterObject),
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = "Counter(): a sequence counter cell, a one-item sequence [0] whose item C advances in place.",
    .tp_new = PyType_GenericNew,
    .tp_repr = (reprfunc)Counter_repr,
    .tp_as_sequence = &Counter_as_sequence,
};

/* ========================================================================= FindSpec */
/* FindSpec(find, hooks, hooked): the replacement of PathFinder.find_spec that
 * hooks/importhook.py installs (as a classmethod). Called as (cls, fullname, path=None,
 * target=None): spec = find(fullname, path, target); when fullname is a key of dict
 * `hooks`, returns hooked(spec, fullname, path, target), else spec. The same as the Python
 * wrapper it replaces, without a Python frame per import (about 1,100 of them in
 * `import torch.distributed`). */
typedef struct {
    PyObject_HEAD
    PyObject *find, *hooks, *hooked;
    vectorcallfunc vectorcall;
} FindSpecObject;

static PyObject *FindSpec_vectorcall(FindSpecObject *self, PyObject *const *args, size_t nargsf, PyObject *kwnames) {
    Py_ssize_t nargs = PyVectorcall_NARGS(nargsf), nkw = kwnames ? PyTuple_GET_SIZE(kwnames) : 0, i;
    PyObject *spec, *out, *a[4] = {NULL, NULL, Py_None, Py_None}; /* spec, fullname, path, target */
    int hit;
    if (nargs < 1) {
        PyErr_SetString(PyExc_TypeError, "find_spec: called without its class");
        return NULL;
    }
    /* args[0] is the class: the original is bound already */
    spec = PyObject_Vectorcall(self->find, args + 1, (size_t)(nargs - 1), kwnames);
    if (spec == NULL)
        return NULL;
    for (i = 1; i < nargs && i < 4; i++)
        a[i] = args[i];
    for (i = 0; i < nkw; i++) { /* fullname=, path=, target= by keyword */
        PyObject *k = PyTuple_GET_ITEM(kwnames, i);
        int j = PyUnicode_CompareWithASCIIString(k, "fullname") == 0 ? 1
              : PyUnicode_CompareWithASCIIString(k, "path") == 0 ? 2
              : PyUnicode_CompareWithASCIIString(k, "target") == 0 ? 3 : 0;
        if (j)
            a[j] = args[nargs + i];
    }
    hit = (a[1] != NULL && PyUnicode_CheckExact(a[1])) ? PyDict_Contains(self->hooks, a[1]) : 0;
    if (hit <= 0) {
        if (hit < 0)
            PyErr_Clear();
        return spec;
    }
    /* a hooked name (rare): hooked(spec, fullname, path, target) */
    a[0] = spec;
    out = PyObject_Vectorcall(self->hooked, a, 4, NULL);
    Py_DECREF(spec);
    return out;
}

static PyObject *FindSpec_new(PyTypeObject *type, PyObject *args, PyObject *kw) {
    PyObject *find, *hooks, *hooked;
    FindSpecObject *self;
    if (!PyArg_ParseTuple(args, "OO!O:FindSpec", &find, &PyDict_Type, &hooks, &hooked))
        return NULL;
    self = (FindSpecObject *)type->tp_alloc(type, 0);
    if (self == NULL)
        return NULL;
    Py_INCREF(find);
    Py_INCREF(hooks);
    Py_INCREF(hooked);
    self->find = find;
    self->hooks = hooks;
    self->hooked = hooked;
    self->vectorcall = (vectorcallfunc)FindSpec_vectorcall;
    return (PyObject *)self;
}

static int FindSpec_traverse(FindSpecObject *self, visitproc visit, void *arg) {
    Py_VISIT(self->find);
    Py_VISIT(self->hooks);
    Py_VISIT(self->hooked);
    return 0;
}

static int FindSpec_clear(FindSpecObject *self) {
    Py_CLEAR(self->find);
    Py_CLEAR(self->hooks);
    Py_CLEAR(self->hooked);
    return 0;
}

static void FindSpec_dealloc(FindSpecObject *self) {
    PyObject_GC_UnTrack(self);
    FindSpec_clear(self);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

static PyTypeObject FindSpecType = {
    PyVarObject_HEAD_INIT(NULL, 0).tp_name = "hangtrace.hooks._fastrec.FindSpec",
    .tp_basicsize = sizeof(FindSpecObject),
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_GC | Py_TPFLAGS_HAVE_VECTORCALL,
    .tp_doc = "FindSpec(find, hooks, hooked): called as (cls, fullname, path=None, target=None); returns "
              "find(fullname, path, target), or hooked(spec, fullname, path, target) when fullname is a key of "
              "dict hooks (hooks/importhook.py).",
    .tp_new = FindSpec_new,
    .tp_call = PyVectorcall_Call,
    .tp_vectorcall_offset = offsetof(FindSpecObject, vectorcall),
    .tp_traverse = (traverseproc)FindSpec_traverse,
    .tp_clear = (inquiry)FindSpec_clear,
    .tp_dealloc = (destructor)FindSpec_dealloc,
};

/* ========================================================================= StateBase */
typedef struct {
    PyObject_HEAD
    PyObject *rec;
    RingObject *ring; /* rec._fast when it is a Ring, else NULL */
    PyObject *log, *seq, *groups, *dtypes, *shapes;
    int fault;
    /* The C path's one-entry caches of the dict lookups above (strong references; each
     * valid while the dict it came from is still the State's, and for groups until
     * clear_groups()). A group entry holds its group object, so a cached group pointer
     * is never reused by another object while cached. */
    unsigned long long groups_ver;  /* bumped by clear_groups() */
    PyObject *c_group;              /* the group argument last seen (Py_None: the default group) */
    PyObject *c_group_entry;        /* its entry tuple */
    PyObject *c_groups;             /* the groups dict it came from */
    unsigned long long c_groups_ver;
    PyObject *c_dtype, *c_dtypes;   /* torch.dtype last seen, the dtypes dict it came from */
    long long c_dtype_id;
    PyObject *c_shape, *c_shapes;   /* torch.Size last seen (a tuple), the shapes dict */
    long long c_shape_id, c_numel;
    /* The same two entries as read from the TensorImpl (tensor_impl(); valid only while the
     * entries above are): number of dims (-1: none) and sizes; raw dtype (-1: none). */
    long long c_nd, c_sizes[TL_MAX_DIMS];
    int c_raw_dtype;
} StateObject;

static PyTypeObject StateType;

static int State_traverse(StateObject *self, visitproc visit, void *arg) {
    Py_VISIT(self->rec);
    Py_VISIT(self->ring);
    Py_VISIT(self->log);
    Py_VISIT(self->seq);
    Py_VISIT(self->groups);
    Py_VISIT(self->dtypes);
    Py_VISIT(self->shapes);
    Py_VISIT(self->c_group);
    Py_VISIT(self->c_group_entry);
    Py_VISIT(self->c_groups);
    Py_VISIT(self->c_dtype);
    Py_VISIT(self->c_dtypes);
    Py_VISIT(self->c_shape);
    Py_VISIT(self->c_shapes);
    return 0;
}

static void state_drop_caches(StateObject *self) {
    self->c_nd = -1;
    self->c_raw_dtype = -1;
    Py_CLEAR(self->c_group);
    Py_CLEAR(self->c_group_entry);
    Py_CLEAR(self->c_groups);
    Py_CLEAR(self->c_dtype);
    Py_CLEAR(self->c_dtypes);
    Py_CLEAR(self->c_shape);
    Py_CLEAR(self->c_shapes);
}

static int State_clear(StateObject *self) {
    state_drop_caches(self);
    Py_CLEAR(self->rec);
    Py_CLEAR(self->ring);
    Py_CLEAR(self->log);
    Py_CLEAR(self->seq);
    Py_CLEAR(self->groups);
    Py_CLEAR(self->dtypes);
    Py_CLEAR(self->shapes);
    return 0;
}

static void State_dealloc(StateObject *self) {
    PyObject_GC_UnTrack(self);
    State_clear(self);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

static PyObject *State_get_rec(StateObject *self, void *closure) {
    if (self->rec == NULL)
        Py_RETURN_NONE;
    Py_INCREF(self->rec);
    return self->rec;
}

static int State_set_rec(StateObject *self, PyObject *value, void *closure) {
    RingObject *ring = NULL;
    if (value == NULL)
        value = Py_None;
    if (value != Py_None) {
        PyObject *f = PyObject_GetAttrString(value, "_fast");
        if (f == NULL) {
            if (!PyErr_ExceptionMatches(PyExc_AttributeError))
                return -1;
            PyErr_Clear();
        } else if (PyObject_TypeCheck(f, &RingType)) {
            ring = (RingObject *)f;
        } else {
            Py_DECREF(f);
        }
    }
    Py_INCREF(value);
    Py_XSETREF(self->rec, value);
    Py_XSETREF(self->ring, ring);
    return 0;
}

static PyObject *State_get_fault(StateObject *self, void *closure) { return PyBool_FromLong(self->fault); }

static int State_set_fault(StateObject *self, PyObject *value, void *closure) {
    int t = value == NULL ? 0 : PyObject_IsTrue(value);
    if (t < 0)
        return -1;
    self->fault = t;
    return 0;
}

static PyObject *State_get_fast(StateObject *self, void *closure) { return PyBool_FromLong(self->ring != NULL); }

PyDoc_STRVAR(State_clear_groups_doc, "clear_groups(): empty ``groups`` (the cached group entries) and the C path's caches.");

static PyObject *State_clear_groups(StateObject *self, PyObject *Py_UNUSED(ignored)) {
    self->groups_ver++;
    state_drop_caches(self);
    if (self->groups != NULL && PyDict_Check(self->groups))
        PyDict_Clear(self->groups);
    Py_RETURN_NONE;
}

static PyMethodDef State_methods[] = {
    {"clear_groups", (PyCFunction)State_clear_groups, METH_NOARGS, State_clear_groups_doc},
    {NULL, NULL, 0, NULL},
};

static PyGetSetDef State_getset[] = {
    {"rec", (getter)State_get_rec, (setter)State_set_rec, "the Recorder (its C Ring is used when it has one)", NULL},
    {"fault", (getter)State_get_fault, (setter)State_set_fault, "test fault injection flag", NULL},
    {"fast", (getter)State_get_fast, NULL, "True when the C path records (the recorder has a C Ring)", NULL},
    {NULL, NULL, NULL, NULL, NULL},
};

static PyMemberDef State_members[] = {
    {"log", T_OBJECT, offsetof(StateObject, log), 0, NULL},
    {"seq", T_OBJECT, offsetof(StateObject, seq), 0, NULL},
    {"groups", T_OBJECT, offsetof(StateObject, groups), 0, NULL},
    {"dtypes", T_OBJECT, offsetof(StateObject, dtypes), 0, NULL},
    {"shapes", T_OBJECT, offsetof(StateObject, shapes), 0, NULL},
    {NULL, 0, 0, 0, NULL},
};

static PyTypeObject StateType = {
    PyVarObject_HEAD_INIT(NULL, 0).tp_name = "hangtrace.hooks._fastrec.StateBase",
    .tp_basicsize = sizeof(StateObject),
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_BASETYPE | Py_TPFLAGS_HAVE_GC,
    .tp_doc = "C fields of torch_dist.State read by Call.",
    .tp_new = PyType_GenericNew,
    .tp_dealloc = (destructor)State_dealloc,
    .tp_traverse = (traverseproc)State_traverse,
    .tp_clear = (inquiry)State_clear,
    .tp_getset = State_getset,
    .tp_members = State_members,
    .tp_methods = State_methods,
};

/* ============================================================================== Call */
enum { PK_NONE = 0, PK_T, PK_TL, PK_O, PK_OL };

typedef struct {
    PyObject_HEAD
    vectorcallfunc vectorcall;
    PyObject *wrapped;  /* the original torch function */
    PyObject *slow;     /* the pure-Python recording call (same arguments) */
    PyObject *name;     /* op name */
    PyObject *globals;  /* torch_dist's module dict: "_state" is read per call */
    PyObject *busy;     /* torch_dist._busy (a Busy; the C path uses its thread-local flag) */
    PyObject *tparam;   /* payload parameter name or None */
    PyObject *pkind_s;  /* payload kind string for the Python payload() callback */
    PyObject *peer_names[2];
    Py_ssize_t peer_pos[2];
    int peer_isgroup[2];
    int npeers;
    Py_ssize_t tpos, gpos, apos;
    int op_id, kind, is_p2p, pkind, always_async;
    PyObject *cb_group, *cb_shape, *cb_dtype, *cb_payload, *cb_work, *cb_fail, *cb_grank;
    PyObject *rec_key, *done_key;
    PyObject *dict; /* __name__, __qualname__, __module__, __doc__ of the original (set by torch_dist) */
    uint64_t gver;    /* globals' dict version when gstate was read (CPython < 3.12) */
    PyObject *gstate; /* borrowed: globals["_state"] at that version, NULL = not read */
} CallObject;

static PyObject *TensorType; /* torch.Tensor (set_tensor_type), or NULL */
static getter tg_shape, tg_dtype; /* its shape/dtype getters (resolve_getters) */
static void *tc_shape, *tc_dtype;
static unsigned int tg_tag;
static inline PyObject *tensor_attr(PyObject *obj, int dtype);
static PyObject *s_state, *s_group, *s_async_op, *s_numel, *s_shape, *s_dtype;

static PyObject *getarg(PyObject *const *args, Py_ssize_t n, PyObject *kwnames, Py_ssize_t pos, PyObject *name) {
    if (pos < n)
        return args[pos];
    if (kwnames != NULL && name != Py_None) {
        Py_ssize_t nk = PyTuple_GET_SIZE(kwnames), i;
        for (i = 0; i < nk; i++)
            if (PyTuple_GET_ITEM(kwnames, i) == name)
                return args[n + i];
        for (i = 0; i < nk; i++)
            if (PyUnicode_Compare(PyTuple_GET_ITEM(kwnames, i), name) == 0)
                return args[n + i];
        if (PyErr_Occurred())
            PyErr_Clear();
    }
    return NULL;
}

/* 1: torch.Size ``a`` equals the cached ``b`` (item by item); 0 otherwise (errors cleared). */
static int same_shape(PyObject *a, PyObject *b) {
    Py_ssize_t n;
    if (a == b)
        return 1;
    if (!PyTuple_Check(a) || !PyTuple_Check(b) || (n = PyTuple_GET_SIZE(a)) != PyTuple_GET_SIZE(b))
        return 0;
    for (Py_ssize_t i = 0; i < n; i++) {
        PyObject *x = PyTuple_GET_ITEM(a, i), *y = PyTuple_GET_ITEM(b, i);
        if (x == y)
            continue;
        if (!PyLong_CheckExact(x) || !PyLong_CheckExact(y))
            return 0;
        int eq = PyObject_RichCompareBool(x, y, Py_EQ);
        if (eq != 1) {
            if (eq < 0)
                PyErr_Clear();
            return 0;
        }
    }
    return 1;
}

/* Product of the sizes of torch.Size ``shp``, or -1 when it is not a tuple of
 * non-negative ints or overflows. */
static long long shape_numel(PyObject *shp) {
    long long prod = 1;
    if (!PyTuple_Check(shp))
        return -1;
    for (Py_ssize_t i = 0; i < PyTuple_GET_SIZE(shp); i++) {
        PyObject *d = PyTuple_GET_ITEM(shp, i);
        long long x = PyLong_CheckExact(d) ? PyLong_AsLongLong(d) : -1;
        if (x < 0 || (x > 0 && prod > LLONG_MAX / x)) {
            PyErr_Clear();
            return -1;
        }
        prod *= x;
    }
    return prod;
}

/* 1: the TensorImpl read ``impl`` agrees with torch.Size ``shp`` from torch's getter. */
static int raw_shape_agrees(const char *impl, PyObject *shp) {
    long long nd = impl_ndim(impl);
    const int64_t *sz = impl_sizes(impl);
    if (!PyTuple_Check(shp) || PyTuple_GET_SIZE(shp) != nd)
        return 0;
    for (Py_ssize_t i = 0; i < nd; i++) {
        PyObject *d = PyTuple_GET_ITEM(shp, i);
        long long x = PyLong_CheckExact(d) ? PyLong_AsLongLong(d) : -1;
        if (x == -1 && PyErr_Occurred())
            PyErr_Clear();
        if (x != sz[i])
            return 0;
    }
    return 1;
}

/* 1: ``impl``'s dims are the State's cached raw ones (at most TL_MAX_DIMS: no memcmp call). */
static inline int same_raw_shape(const StateObject *S, const char *impl) {
    long long nd = impl_ndim(impl);
    const int64_t *sz = impl_sizes(impl);
    if (S->c_nd != nd)
        return 0;
    for (long long i = 0; i < nd; i++)
        if (S->c_sizes[i] != sz[i])
            return 0;
    return 1;
}

/* Keep the raw form of the State's cached shape (``impl`` NULL: none). */
static inline void cache_raw_shape(StateObject *S, const char *impl) {
    if (impl == NULL) {
        S->c_nd = -1;
        return;
    }
    S->c_nd = impl_ndim(impl);
    memcpy(S->c_sizes, impl_sizes(impl), (size_t)S->c_nd * sizeof(int64_t));
}

/* The TensorImpl of plain tensor ``obj`` if it can be read now: torch.Tensor unchanged
 * since its getters were resolved (a patched ``shape`` is honoured), layout probed. */
static inline const char *readable_impl(PyObject *obj) {
#ifdef Py_TPFLAGS_VALID_VERSION_TAG
    PyTypeObject *tp = Py_TYPE(obj);
    if (tg_tag != 0 && tp->tp_version_tag == tg_tag && (tp->tp_flags & Py_TPFLAGS_VALID_VERSION_TAG))
        return tensor_impl(obj);
#endif
    return NULL;
}

/* numel, shape strid, dtype id of a tensor payload (errors: caller zeroes them). A plain
 * torch.Tensor's dims and raw dtype, read from its TensorImpl (tensor_impl()), are compared
 * with the State's last ones first; else its shape and dtype (torch's getters) are compared
 * with the last ones (same shape: same numel and strid; same dtype object: same id), then
 * looked up. */
static int tensor_payload(CallObject *self, StateObject *S, PyObject *obj, long long *numel, long long *shape,
                          long long *dtype) {
    PyObject *v, *shp, *dt;
    int exact = TensorType != NULL && (PyObject *)Py_TYPE(obj) == TensorType;
    const char *impl = exact ? readable_impl(obj) : NULL;
    long long n = -1;
    int raw_dt = -1;
    shp = NULL;
    if (impl != NULL) {
        raw_dt = impl_dtype(impl);
        if (UNLIKELY(raw_dt > 255)) {
            impl = NULL;
        } else if (S->c_shape != NULL && S->c_shapes == S->shapes && same_raw_shape(S, impl)) {
            *numel = S->c_numel;
            *shape = S->c_shape_id;
            goto dtype;
        }
    }
    if (exact) {
        shp = tensor_attr(obj, 0);
        if (UNLIKELY(shp == NULL))
            return -1;
        if (impl != NULL && UNLIKELY(!raw_shape_agrees(impl, shp))) {
            tl_off("a tensor's sizes read from its TensorImpl disagreed with its shape");
            impl = NULL;
        }
        if (S->c_shape != NULL && S->c_shapes == S->shapes && same_shape(shp, S->c_shape)) {
            *numel = S->c_numel;
            *shape = S->c_shape_id;
            cache_raw_shape(S, impl);
            Py_DECREF(shp);
            goto dtype;
        }
        n = shape_numel(shp); /* a plain torch.Tensor: numel() is the product of its sizes (saves a call) */
    }
    if (UNLIKELY(n < 0)) {
        Py_CLEAR(shp);
        v = PyObject_CallMethodNoArgs(obj, s_numel);
        if (UNLIKELY(v == NULL))
            return -1;
        *numel = PyLong_AsLongLong(v);
        Py_DECREF(v);
        if (*numel == -1 && PyErr_Occurred())
            return -1;
        shp = PyObject_GetAttr(obj, s_shape);
        if (UNLIKELY(shp == NULL))
            return -1;
    } else {
        *numel = n;
    }
    v = PyDict_GetItemWithError(S->shapes, shp);
    if (v != NULL) {
        Py_INCREF(v);
    } else if (!PyErr_Occurred()) {
        v = PyObject_CallOneArg(self->cb_shape, shp);
    }
    if (UNLIKELY(v == NULL)) {
        Py_DECREF(shp);
        return -1;
    }
    *shape = PyLong_AsLongLong(v);
    Py_DECREF(v);
    if (*shape == -1 && PyErr_Occurred()) {
        Py_DECREF(shp);
        return -1;
    }
    if (n >= 0) {
        Py_XSETREF(S->c_shape, shp); /* takes the reference */
        Py_INCREF(S->shapes);
        Py_XSETREF(S->c_shapes, S->shapes);
        S->c_shape_id = *shape;
        S->c_numel = n;
        cache_raw_shape(S, impl);
    } else {
        Py_DECREF(shp);
    }
dtype:
    if (impl != NULL && S->c_dtype != NULL && S->c_dtypes == S->dtypes && S->c_raw_dtype == raw_dt) {
        *dtype = S->c_dtype_id;
        return 0;
    }
    dt = exact ? tensor_attr(obj, 1) : PyObject_GetAttr(obj, s_dtype);
    if (UNLIKELY(dt == NULL))
        return -1;
    if (impl != NULL) {
        if (TL.raw_dtypes[raw_dt] == NULL) {
            TL.raw_dtypes[raw_dt] = dt; /* borrowed: torch.dtype objects live as long as torch */
        } else if (UNLIKELY(TL.raw_dtypes[raw_dt] != dt)) {
            tl_off("one raw dtype read from a TensorImpl stood for two torch.dtype objects");
            impl = NULL;
        }
    }
    if (dt == S->c_dtype && S->c_dtypes == S->dtypes) {
        Py_DECREF(dt);
        *dtype = S->c_dtype_id;
        S->c_raw_dtype = impl != NULL ? raw_dt : -1;
        return 0;
    }
    v = PyDict_GetItemWithError(S->dtypes, dt);
    if (v != NULL) {
        Py_INCREF(v);
    } else if (!PyErr_Occurred()) {
        v = PyObject_CallOneArg(self->cb_dtype, obj);
    }
    if (UNLIKELY(v == NULL)) {
        Py_DECREF(dt);
        return -1;
    }
    *dtype = PyLong_AsLongLong(v);
    Py_DECREF(v);
    if (*dtype == -1 && PyErr_Occurred()) {
        Py_DECREF(dt);
        return -1;
    }
    if (exact) {
        Py_XSETREF(S->c_dtype, dt); /* takes the reference */
        Py_INCREF(S->dtypes);
        Py_XSETREF(S->c_dtypes, S->dtypes);
        S->c_dtype_id = *dtype;
        S->c_raw_dtype = impl != NULL ? raw_dt : -1;
    } else {
        Py_DECREF(dt);
    }
    return 0;
}

static int other_payload(CallObject *self, PyObject *obj, long long *numel, long long *shape, long long *dtype) {
    PyObject *r = PyObject_CallFunctionObjArgs(self->cb_payload, self->pkind_s, obj, NULL);
    if (r == NULL)
        return -1;
    if (!PyTuple_Check(r) || PyTuple_GET_SIZE(r) != 3) {
        Py_DECREF(r);
        PyErr_SetString(PyExc_TypeError, "payload() must return a 3-tuple");
        return -1;
    }
    *numel = PyLong_AsLongLong(PyTuple_GET_ITEM(r, 0));
    *shape = PyLong_AsLongLong(PyTuple_GET_ITEM(r, 1));
    *dtype = PyLong_AsLongLong(PyTuple_GET_ITEM(r, 2));
    Py_DECREF(r);
    return PyErr_Occurred() ? -1 : 0;
}

/* cell[0] += 1 (a Counter, or a one-item list holding an int); *seq = the new value. */
static int seq_next(PyObject *cell, long long *seq) {
    if (LIKELY(Py_IS_TYPE(cell, &CounterType))) {
        *seq = ++((CounterObject *)cell)->v;
        return 0;
    }
    PyObject *cur = PyList_GET_ITEM(cell, 0);
    long long v = PyLong_AsLongLong(cur);
    if (v == -1 && PyErr_Occurred())
        return -1;
    PyObject *nv = PyLong_FromLongLong(v + 1);
    if (UNLIKELY(nv == NULL))
        return -1;
    PyList_SET_ITEM(cell, 0, nv);
    Py_DECREF(cur);
    *seq = v + 1;
    return 0;
}

/* The counter of ``key`` in ``seqs`` (a cell, created as [0] when missing) advanced by
 * one; *seq = the new value. A value that is not a cell fails, as ``cell[0] += 1`` does. */
static int seq_next_in(PyObject *seqs, PyObject *key, long long *seq) {
    PyObject *cur = PyDict_GetItemWithError(seqs, key);
    if (cur == NULL) {
        if (PyErr_Occurred())
            return -1;
        cur = PyType_GenericNew(&CounterType, NULL, NULL); /* as State.seq_cell makes it */
        if (cur == NULL)
            return -1;
        int rc = PyDict_SetItem(seqs, key, cur);
        Py_DECREF(cur); /* the dict holds it */
        if (rc < 0)
            return -1;
    }
    if (!Py_IS_TYPE(cur, &CounterType) && (!PyList_CheckExact(cur) || PyList_GET_SIZE(cur) != 1)) {
        PyErr_Format(PyExc_TypeError, "sequence counter of %R is not a Counter or a one-item list", key);
        return -1;
    }
    return seq_next(cur, seq);
}

/* Everything of the Python wrapper's ``try:`` block. 0 ok (*pidx set), -1 error set. */
static int call_record(CallObject *self, StateObject *S, RingObject *ring, PyObject *const *args,
                       Py_ssize_t n, PyObject *kwnames, unsigned long long *pidx, int *pasync) {
    PyObject *group = getarg(args, n, kwnames, self->gpos, s_group);
    PyObject *gkey, *g, *key = NULL, *peer_o = NULL;
    long long gsid, peer = -1, numel = 0, shape = 0, dtype = 0, seq = 0;
    int async_op = 0, rc = -1, peer_bad = 0;

    if (group == Py_None)
        group = NULL;
    /* group entry (strid, name, pg[, seq cell]), cached by id(group) (None = default group);
     * the last one also in the State (no int object, no dict lookup) */
    if (S->c_group_entry != NULL && S->c_group == (group ? group : Py_None) && S->c_groups == S->groups &&
        S->c_groups_ver == S->groups_ver && PyDict_GET_SIZE(S->groups) != 0) {
        g = S->c_group_entry;
        Py_INCREF(g);
    } else {
        if (group == NULL) {
            gkey = Py_None;
            Py_INCREF(gkey);
        } else {
            gkey = PyLong_FromVoidPtr(group);
            if (UNLIKELY(gkey == NULL))
                return -1;
        }
        g = PyDict_GetItemWithError(S->groups, gkey);
        Py_DECREF(gkey);
        if (g != NULL && ((PyTuple_Check(g) && PyTuple_GET_SIZE(g) > 0) || PyObject_IsTrue(g) == 1)) {
            Py_INCREF(g);
        } else {
            if (UNLIKELY(PyErr_Occurred()))
                return -1;
            g = PyObject_CallOneArg(self->cb_group, group ? group : Py_None);
            if (UNLIKELY(g == NULL))
                return -1;
        }
        if (PyTuple_CheckExact(g) && PyTuple_GET_SIZE(g) >= 3 &&
            PyTuple_GET_ITEM(g, 2) == (group ? group : Py_None)) { /* holds its group: cacheable */
            Py_INCREF(g);
            Py_XSETREF(S->c_group_entry, g);
            Py_INCREF(PyTuple_GET_ITEM(g, 2));
            Py_XSETREF(S->c_group, PyTuple_GET_ITEM(g, 2));
            Py_INCREF(S->groups);
            Py_XSETREF(S->c_groups, S->groups);
            S->c_groups_ver = S->groups_ver;
        }
    }
    if (!PyTuple_Check(g) || PyTuple_GET_SIZE(g) < 2) {
        PyErr_SetString(PyExc_TypeError, "group entry must be a (strid, name, pg) tuple");
        goto done;
    }
    gsid = PyLong_AsLongLong(PyTuple_GET_ITEM(g, 0));
    if (gsid == -1 && PyErr_Occurred())
        goto done;

    /* root / peer: first given of the peer parameters; group-relative ones translated */
    for (int i = 0; i < self->npeers; i++) {
        PyObject *v = getarg(args, n, kwnames, self->peer_pos[i], self->peer_names[i]);
        if (v != NULL && v != Py_None) {
            PyObject *gv;
            if (self->peer_isgroup[i] && group != NULL)
                gv = PyObject_CallFunctionObjArgs(self->cb_grank, group, v, NULL);
            else {
                gv = v;
                Py_INCREF(gv);
            }
            if (UNLIKELY(gv == NULL))
                goto done;
            peer_o = PyNumber_Long(gv);
            Py_DECREF(gv);
            if (UNLIKELY(peer_o == NULL))
                goto done;
            peer = PyLong_AsLongLong(peer_o);
            if (peer == -1 && PyErr_Occurred()) { /* too large: fails at the write, as in Python */
                PyErr_Clear();
                peer_bad = 1;
            }
            break;
        }
    }

    if (self->pkind != PK_NONE) {
        PyObject *obj = getarg(args, n, kwnames, self->tpos, self->tparam);
        if (obj != NULL && obj != Py_None) {
            int prc = self->pkind == PK_T ? tensor_payload(self, S, obj, &numel, &shape, &dtype)
                                          : other_payload(self, obj, &numel, &shape, &dtype);
            if (UNLIKELY(prc < 0)) {
                /* a wrong argument type: torch raises it to the user; we still record the call */
                if (!PyErr_ExceptionMatches(PyExc_Exception))
                    goto done;
                PyErr_Clear();
                numel = shape = dtype = 0;
            }
        }
    }

    if (self->always_async) {
        async_op = 1;
    } else {
        PyObject *a = getarg(args, n, kwnames, self->apos, s_async_op);
        if (a != NULL) {
            async_op = PyObject_IsTrue(a);
            if (UNLIKELY(async_op < 0))
                goto done;
        }
    }

    /* per-group sequence number: collectives by group name, p2p by (group name, peer); the
     * counter is a cell (a Counter, or a one-item list) in S->seq, for collectives also the entry's 4th item */
    if (!self->is_p2p && PyTuple_GET_SIZE(g) >= 4 &&
        (Py_IS_TYPE(PyTuple_GET_ITEM(g, 3), &CounterType) ||
         (PyList_CheckExact(PyTuple_GET_ITEM(g, 3)) && PyList_GET_SIZE(PyTuple_GET_ITEM(g, 3)) == 1))) {
        if (seq_next(PyTuple_GET_ITEM(g, 3), &seq) < 0)
            goto done;
    } else {
        if (self->is_p2p) {
            if (UNLIKELY(peer_o == NULL)) {
                peer_o = PyLong_FromLongLong(peer);
                if (UNLIKELY(peer_o == NULL))
                    goto done;
            }
            key = PyTuple_Pack(2, PyTuple_GET_ITEM(g, 1), peer_o);
            if (UNLIKELY(key == NULL))
                goto done;
        } else {
            key = PyTuple_GET_ITEM(g, 1);
            Py_INCREF(key);
        }
        if (seq_next_in(S->seq, key, &seq) < 0)
            goto done;
    }

    if (peer_bad || gsid < 0 || gsid > U32_MAX_ || shape < 0 || shape > U32_MAX_ || dtype < 0 || dtype > U8_MAX_ ||
        peer < I32_MIN_ || peer > I32_MAX_) {
        if (peer_bad)
            PyErr_SetString(StructError, "argument out of range");
        else if (gsid < 0 || gsid > U32_MAX_)
            range_error(0, U32_MAX_, gsid);
        else if (dtype < 0 || dtype > U8_MAX_)
            range_error(0, U8_MAX_, dtype);
        else if (shape < 0 || shape > U32_MAX_)
            range_error(0, U32_MAX_, shape);
        else
            range_error(I32_MIN_, I32_MAX_, peer);
        ring_burn(ring);
        goto done;
    }
    *pidx = ring_write(ring, self->kind, async_op ? F_ASYNC : 0, dtype, self->op_id, gsid, seq, numel, shape,
                       peer, S_ISSUED, 0, NULL, 1);
    if (*pidx == 0)
        goto done;
    *pasync = async_op;
    rc = 0;
done:
    Py_DECREF(g);
    Py_XDECREF(key);
    Py_XDECREF(peer_o);
    return rc;
}

/* The C path records for this state: it has a Ring, its caches are dicts, no fault injection. */
static inline int state_ready(StateObject *S) {
    return S->ring != NULL && !S->fault && S->groups != NULL && PyDict_CheckExact(S->groups) && S->seq != NULL &&
           PyDict_CheckExact(S->seq) && S->shapes != NULL && PyDict_CheckExact(S->shapes) && S->dtypes != NULL &&
           PyDict_CheckExact(S->dtypes);
}

/* Report the current exception once through the state's log callable; clear it. */
static void log_error(StateObject *S, const char *fmt, PyObject *name, PyObject *key) {
    PyObject *t, *v, *tb;
    PyErr_Fetch(&t, &v, &tb);
    PyErr_NormalizeException(&t, &v, &tb);
    PyObject *msg = PyUnicode_FromFormat(fmt, name, v ? v : Py_None);
    if (msg != NULL && S->log != NULL && S->log != Py_None) {
        PyObject *r = PyObject_CallFunctionObjArgs(S->log, msg, key, NULL);
        Py_XDECREF(r);
    }
    Py_XDECREF(msg);
    PyErr_Clear();
    Py_XDECREF(t);
    Py_XDECREF(v);
    Py_XDECREF(tb);
}

static PyObject *Call_vectorcall(CallObject *self, PyObject *const *args, size_t nargsf, PyObject *kwnames) {
    Py_ssize_t n = PyVectorcall_NARGS(nargsf);
    PyObject *st;
#if PY_VERSION_HEX < 0x030C0000
    /* torch_dist's globals unchanged since the last call (dict version, PEP 509): the same
     * ``_state`` (borrowed: the dict holds it, and rebinding it changes the version) */
    uint64_t gver = ((PyDictObject *)self->globals)->ma_version_tag;
    if (gver == self->gver && self->gstate != NULL) {
        st = self->gstate;
    } else {
        st = PyDict_GetItemWithError(self->globals, s_state);
        self->gver = gver;
        self->gstate = st;
    }
#else
    st = PyDict_GetItemWithError(self->globals, s_state); /* borrowed */
#endif
    if (UNLIKELY(st == NULL)) {
        if (UNLIKELY(PyErr_Occurred()))
            PyErr_Clear();
        return PyObject_Vectorcall(self->wrapped, args, nargsf, kwnames);
    }
    if (st == Py_None)
        return PyObject_Vectorcall(self->wrapped, args, nargsf, kwnames);
    if (!PyObject_TypeCheck(st, &StateType) || !state_ready((StateObject *)st))
        return PyObject_Vectorcall(self->slow, args, nargsf, kwnames);

    StateObject *S = (StateObject *)st;
    RingObject *ring = S->ring;
    TlsBlock *T = &tls;
    if (T->busy) /* nested call on this thread: not recorded again */
        return PyObject_Vectorcall(self->wrapped, args, nargsf, kwnames);
    Py_INCREF(S);
    Py_INCREF(ring);

    unsigned long long idx = 0;
    int async_op = 0;
    PyObject *result = NULL;
    if (call_record(self, S, ring, args, n, kwnames, &idx, &async_op) < 0) {
        idx = 0;
        if (!PyErr_ExceptionMatches(PyExc_Exception))
            goto out; /* KeyboardInterrupt & co. propagate, as in the Python wrapper */
        log_error(S, "recording %U failed: %R", self->name, self->rec_key);
    }
    T->busy = 1;
    result = PyObject_Vectorcall(self->wrapped, args, nargsf, kwnames);
    if (UNLIKELY(result == NULL)) {
        PyObject *t, *v, *tb;
        PyErr_Fetch(&t, &v, &tb);
        T->busy = 0;
        if (idx) {
            PyErr_NormalizeException(&t, &v, &tb);
            if (tb != NULL && v != NULL)
                PyException_SetTraceback(v, tb);
            PyObject *io = PyLong_FromUnsignedLongLong(idx);
            PyObject *r = io ? PyObject_CallFunctionObjArgs(self->cb_fail, io, v ? v : Py_None, NULL) : NULL;
            Py_XDECREF(io);
            Py_XDECREF(r);
            PyErr_Clear();
        }
        PyErr_Restore(t, v, tb);
        goto out;
    }
    T->busy = 0;
    if (idx) {
        int rc;
        if (async_op && result != Py_None) {
            PyObject *io = PyLong_FromUnsignedLongLong(idx);
            PyObject *r = io ? PyObject_CallFunctionObjArgs(self->cb_work, io, result, NULL) : NULL;
            Py_XDECREF(io);
            rc = r == NULL ? -1 : 0;
            Py_XDECREF(r);
        } else {
            rc = ring_complete_ok(ring, (long long)idx);
        }
        if (UNLIKELY(rc < 0)) {
            if (!PyErr_ExceptionMatches(PyExc_Exception)) {
                Py_CLEAR(result);
                goto out;
            }
            log_error(S, "completing %U failed: %R", self->name, self->done_key);
        }
    }
out:
    Py_DECREF(ring);
    Py_DECREF(S);
    return result;
}

/* Call(wrapped, slow, name, op_id, kind, is_p2p, pkind, tparam, tpos, gpos, apos, peers, always_async,
 *      globals, busy, callbacks)
 * peers: tuple of (position, name, is_group_rank); pkind: "t", "tl", "o", "ol" or None;
 * callbacks: (group_entry, shape_id, dtype_id, payload, on_work_done, finish_error, global_rank). */
static int Call_init(CallObject *self, PyObject *args, PyObject *kwds) {
    PyObject *wrapped, *slow, *name, *pkind, *tparam, *peers, *globals, *busy, *cbs;
    int op_id, kind, is_p2p, always_async;
    Py_ssize_t tpos, gpos, apos;
    if (kwds != NULL && PyDict_GET_SIZE(kwds)) {
        PyErr_SetString(PyExc_TypeError, "Call() takes positional arguments only");
        return -1;
    }
    if (!PyArg_ParseTuple(args, "OOUiipOOnnnO!pO!OO!:Call", &wrapped, &slow, &name, &op_id, &kind, &is_p2p, &pkind,
                          &tparam, &tpos, &gpos, &apos, &PyTuple_Type, &peers, &always_async, &PyDict_Type, &globals,
                          &busy, &PyTuple_Type, &cbs))
        return -1;
    if (Py_TYPE(busy) != &BusyType) {
        PyErr_SetString(PyExc_TypeError, "busy must be a _fastrec.Busy");
        return -1;
    }
    if (PyTuple_GET_SIZE(cbs) != 7) {
        PyErr_SetString(PyExc_TypeError, "callbacks must be a 7-tuple");
        return -1;
    }
    if (PyTuple_GET_SIZE(peers) > 2) {
        PyErr_SetString(PyExc_ValueError, "at most 2 peer parameters");
        return -1;
    }
    if (pkind == Py_None)
        self->pkind = PK_NONE;
    else if (PyUnicode_Check(pkind) && PyUnicode_CompareWithASCIIString(pkind, "t") == 0)
        self->pkind = PK_T;
    else if (PyUnicode_Check(pkind) && PyUnicode_CompareWithASCIIString(pkind, "tl") == 0)
        self->pkind = PK_TL;
    else if (PyUnicode_Check(pkind) && PyUnicode_CompareWithASCIIString(pkind, "o") == 0)
        self->pkind = PK_O;
    else if (PyUnicode_Check(pkind) && PyUnicode_CompareWithASCIIString(pkind, "ol") == 0)
        self->pkind = PK_OL;
    else {
        PyErr_SetString(PyExc_ValueError, "unknown payload kind");
        return -1;
    }
    self->npeers = (int)PyTuple_GET_SIZE(peers);
    for (int i = 0; i < self->npeers; i++) {
        PyObject *p = PyTuple_GET_ITEM(peers, i), *pn;
        Py_ssize_t pos;
        int isg;
        if (!PyArg_ParseTuple(p, "nUp:peer", &pos, &pn, &isg))
            return -1;
        self->peer_pos[i] = pos;
        Py_INCREF(pn);
        PyUnicode_InternInPlace(&pn);
        Py_XSETREF(self->peer_names[i], pn);
        self->peer_isgroup[i] = isg;
    }
#define SET(field, val)          \
    do {                         \
        PyObject *v_ = (val);    \
        Py_INCREF(v_);           \
        Py_XSETREF(self->field, v_); \
    } while (0)
    SET(wrapped, wrapped);
    SET(slow, slow);
    SET(name, name);
    SET(pkind_s, pkind);
    if (PyUnicode_Check(tparam)) {
        Py_INCREF(tparam);
        PyUnicode_InternInPlace(&tparam);
        Py_XSETREF(self->tparam, tparam);
    } else {
        SET(tparam, Py_None);
    }
    SET(globals, globals);
    SET(busy, busy);
    SET(cb_group, PyTuple_GET_ITEM(cbs, 0));
    SET(cb_shape, PyTuple_GET_ITEM(cbs, 1));
    SET(cb_dtype, PyTuple_GET_ITEM(cbs, 2));
    SET(cb_payload, PyTuple_GET_ITEM(cbs, 3));
    SET(cb_work, PyTuple_GET_ITEM(cbs, 4));
    SET(cb_fail, PyTuple_GET_ITEM(cbs, 5));
    SET(cb_grank, PyTuple_GET_ITEM(cbs, 6));
#undef SET
    Py_XSETREF(self->rec_key, PyUnicode_FromFormat("rec-%U", name));
    Py_XSETREF(self->done_key, PyUnicode_FromFormat("done-%U", name));
    if (self->rec_key == NULL || self->done_key == NULL)
        return -1;
    self->op_id = op_id;
    self->kind = kind;
    self->is_p2p = is_p2p;
    self->always_async = always_async;
    self->tpos = tpos;
    self->gpos = gpos;
    self->apos = apos;
    self->vectorcall = (vectorcallfunc)Call_vectorcall;
    return 0;
}

static int Call_traverse(CallObject *self, visitproc visit, void *arg) {
    Py_VISIT(self->dict);
    Py_VISIT(self->wrapped);
    Py_VISIT(self->slow);
    Py_VISIT(self->globals);
    Py_VISIT(self->busy);
    Py_VISIT(self->cb_group);
    Py_VISIT(self->cb_shape);
    Py_VISIT(self->cb_dtype);
    Py_VISIT(self->cb_payload);
    Py_VISIT(self->cb_work);
    Py_VISIT(self->cb_fail);
    Py_VISIT(self->cb_grank);
    return 0;
}

static int Call_clear(CallObject *self) {
    Py_CLEAR(self->dict);
    Py_CLEAR(self->wrapped);
    Py_CLEAR(self->slow);
    Py_CLEAR(self->name);
    Py_CLEAR(self->globals);
    Py_CLEAR(self->busy);
    Py_CLEAR(self->tparam);
    Py_CLEAR(self->pkind_s);
    Py_CLEAR(self->peer_names[0]);
    Py_CLEAR(self->peer_names[1]);
    Py_CLEAR(self->cb_group);
    Py_CLEAR(self->cb_shape);
    Py_CLEAR(self->cb_dtype);
    Py_CLEAR(self->cb_payload);
    Py_CLEAR(self->cb_work);
    Py_CLEAR(self->cb_fail);
    Py_CLEAR(self->cb_grank);
    Py_CLEAR(self->rec_key);
    Py_CLEAR(self->done_key);
    return 0;
}

static void Call_dealloc(CallObject *self) {
    PyObject_GC_UnTrack(self);
    Call_clear(self);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

static PyObject *Call_call(CallObject *self, PyObject *args, PyObject *kwargs) {
    if (self->vectorcall == NULL) {
        PyErr_SetString(PyExc_ValueError, "Call not initialised");
        return NULL;
    }
    return PyVectorcall_Call((PyObject *)self, args, kwargs);
}

/* Bound like a plain function: installed in place of one (``torch.distributed.all_reduce``),
 * a Call read through an instance (a class attribute) binds that instance as its first argument. */
static PyObject *Call_descr_get(PyObject *self, PyObject *obj, PyObject *type) {
    if (obj == NULL || obj == Py_None) {
        Py_INCREF(self);
        return self;
    }
    return PyMethod_New(self, obj);
}

/* Pickled by reference, as the function it replaces: ``__module__`` + ``__qualname__``. */
static PyObject *Call_reduce(PyObject *self, PyObject *Py_UNUSED(ignored)) {
    return PyObject_GetAttrString(self, "__qualname__");
}

static PyMethodDef Call_methods[] = {
    {"__reduce__", Call_reduce, METH_NOARGS, "pickled by reference (module + qualified name), as a function"},
    {NULL, NULL, 0, NULL},
};

static PyGetSetDef Call_getset[] = {
    {"__dict__", PyObject_GenericGetDict, PyObject_GenericSetDict, NULL, NULL},
    {NULL, NULL, NULL, NULL, NULL},
};

static PyMemberDef Call_members[] = {
    {"__wrapped__", T_OBJECT, offsetof(CallObject, wrapped), READONLY, "the original function"},
    {"name", T_OBJECT, offsetof(CallObject, name), READONLY, "op name"},
    {NULL, 0, 0, 0, NULL},
};

static PyTypeObject CallType = {
    PyVarObject_HEAD_INIT(NULL, 0).tp_name = "hangtrace.hooks._fastrec.Call",
    .tp_basicsize = sizeof(CallObject),
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_GC | Py_TPFLAGS_HAVE_VECTORCALL,
    .tp_doc = "The C recording call of one wrapped torch.distributed function, installed in its place (see torchdist/torch_install._wrap).",
    .tp_new = PyType_GenericNew,
    .tp_init = (initproc)Call_init,
    .tp_dealloc = (destructor)Call_dealloc,
    .tp_traverse = (traverseproc)Call_traverse,
    .tp_clear = (inquiry)Call_clear,
    .tp_call = (ternaryfunc)Call_call,
    .tp_vectorcall_offset = offsetof(CallObject, vectorcall),
    .tp_members = Call_members,
    .tp_methods = Call_methods,
    .tp_getset = Call_getset,
    .tp_descr_get = Call_descr_get,
    .tp_dictoffset = offsetof(CallObject, dict),
};

/* ============================================================================ module */
/* The C getters of torch.Tensor's ``shape`` and ``dtype`` (getset descriptors of
 * torch._C.TensorBase), called directly for a plain torch.Tensor: the same function
 * ``tensor.shape`` runs, without the attribute lookup around it. Valid while the type's
 * version tag is the one seen at resolution (any change to torch.Tensor or a base class
 * resets it), else the attribute is read as usual. */

static void resolve_getters(PyTypeObject *tp) {
    tg_shape = tg_dtype = NULL;
    tg_tag = 0;
#ifdef Py_TPFLAGS_VALID_VERSION_TAG
    if (tp == NULL || tp->tp_getattro != PyObject_GenericGetAttr)
        return;
    PyObject *ds = _PyType_Lookup(tp, s_shape), *dd = _PyType_Lookup(tp, s_dtype); /* borrowed */
    if (ds == NULL || dd == NULL || Py_TYPE(ds) != &PyGetSetDescr_Type || Py_TYPE(dd) != &PyGetSetDescr_Type ||
        !(tp->tp_flags & Py_TPFLAGS_VALID_VERSION_TAG) || tp->tp_version_tag == 0)
        return;
    PyGetSetDef *gs = ((PyGetSetDescrObject *)ds)->d_getset, *gd = ((PyGetSetDescrObject *)dd)->d_getset;
    if (gs->get == NULL || gd->get == NULL)
        return;
    tg_shape = gs->get;
    tc_shape = gs->closure;
    tg_dtype = gd->get;
    tc_dtype = gd->closure;
    tg_tag = tp->tp_version_tag;
#endif
}

/* ``obj.shape`` / ``obj.dtype`` of a plain torch.Tensor ``obj`` (new reference or NULL;
 * the caller checked Py_TYPE(obj) == TensorType). */
static inline PyObject *tensor_attr(PyObject *obj, int dtype) {
#ifdef Py_TPFLAGS_VALID_VERSION_TAG
    PyTypeObject *tp = Py_TYPE(obj);
    if (tg_tag == 0 || tp->tp_version_tag != tg_tag || !(tp->tp_flags & Py_TPFLAGS_VALID_VERSION_TAG))
        resolve_getters(tp); /* torch.Tensor (or a base) changed since: look the getters up again */
    if (tg_tag != 0)
        return dtype ? tg_dtype(obj, tc_dtype) : tg_shape(obj, tc_shape);
#endif
    return PyObject_GetAttr(obj, dtype ? s_dtype : s_shape);
}

static PyObject *set_tensor_type(PyObject *m, PyObject *tp) {
    if (tp != Py_None && !PyType_Check(tp)) {
        PyErr_SetString(PyExc_TypeError, "a type or None");
        return NULL;
    }
    Py_XDECREF(TensorType);
    TensorType = tp == Py_None ? NULL : tp;
    Py_XINCREF(TensorType);
    resolve_getters((PyTypeObject *)TensorType);
    Py_RETURN_NONE;
}

static PyObject *direct_getters(PyObject *m, PyObject *Py_UNUSED(ignored)) {
#ifdef Py_TPFLAGS_VALID_VERSION_TAG
    if (TensorType != NULL) {
        PyTypeObject *tp = (PyTypeObject *)TensorType;
        if (tg_tag == 0 || tp->tp_version_tag != tg_tag || !(tp->tp_flags & Py_TPFLAGS_VALID_VERSION_TAG))
            resolve_getters(tp);
        if (tg_tag != 0)
            Py_RETURN_TRUE;
    }
#endif
    Py_RETURN_FALSE;
}

/* probe_tensor_layout(probes): see TL. ``probes`` is a sequence of (tensor, TensorImpl
 * address, sizes tuple, dtype label) of plain, dense tensors; equal labels mean equal
 * dtypes. The layout is taken only when exactly one THPVariable offset holds every
 * TensorImpl address, all share one vtable, exactly one TensorImpl offset holds every
 * probe's (ndim, sizes) and exactly one 2-byte offset after it tells the labels apart
 * (equal labels: equal values, different labels: different values). The sizes are
 * looked for in the first TL_SCAN bytes of a TensorImpl and the dtype at most 48 bytes past
 * the sizes and strides (a torch 2.13 TensorImpl is about 200 bytes: sizes at 56, dtype at 160). */
#define TL_SCAN 192
#define TL_MAX_PROBES 64

static PyObject *probe_tensor_layout(PyObject *m, PyObject *arg) {
    PyObject *seq = PySequence_Fast(arg, "probe_tensor_layout: a sequence of (tensor, address, sizes, label)");
    PyObject *objs[TL_MAX_PROBES];
    const char *impls[TL_MAX_PROBES];
    long long nds[TL_MAX_PROBES], sizes[TL_MAX_PROBES][TL_MAX_DIMS], labels[TL_MAX_PROBES];
    Py_ssize_t n, i, off, found;
    Py_ssize_t cdata_off = -1, sizes_off = -1, dtype_off = -1;
    const char *why = NULL;
    if (seq == NULL)
        return NULL;
    n = PySequence_Fast_GET_SIZE(seq);
    TL.ok = 0;
    memset(TL.raw_dtypes, 0, sizeof(TL.raw_dtypes));
    if (TensorType == NULL || n < 4 || n > TL_MAX_PROBES) {
        why = "probe_tensor_layout needs torch.Tensor set and 4 to 64 probes";
        goto done;
    }
    for (i = 0; i < n; i++) {
        PyObject *p = PySequence_Fast_GET_ITEM(seq, i), *szs;
        unsigned long long addr;
        if (!PyTuple_Check(p) || PyTuple_GET_SIZE(p) != 4 || (PyObject *)Py_TYPE(PyTuple_GET_ITEM(p, 0)) != TensorType ||
            !PyTuple_Check(szs = PyTuple_GET_ITEM(p, 2)) || PyTuple_GET_SIZE(szs) > TL_MAX_DIMS) {
            why = "a probe is not (plain torch.Tensor, address, sizes of at most 5 dims, label)";
            goto done;
        }
        objs[i] = PyTuple_GET_ITEM(p, 0);
        addr = PyLong_AsUnsignedLongLong(PyTuple_GET_ITEM(p, 1));
        labels[i] = PyLong_AsLongLong(PyTuple_GET_ITEM(p, 3));
        nds[i] = PyTuple_GET_SIZE(szs);
        for (Py_ssize_t d = 0; d < nds[i]; d++)
            sizes[i][d] = PyLong_AsLongLong(PyTuple_GET_ITEM(szs, d));
        if (PyErr_Occurred()) {
            Py_DECREF(seq);
            return NULL;
        }
        impls[i] = (const char *)(uintptr_t)addr;
        if (impls[i] == NULL) {
            why = "a probe's TensorImpl address is 0";
            goto done;
        }
    }
    /* THPVariable: PyObject_HEAD, then the Tensor (one TensorImpl pointer) */
    for (found = 0, off = (Py_ssize_t)sizeof(PyObject); off < (Py_ssize_t)sizeof(PyObject) + 32; off += sizeof(void *)) {
        for (i = 0; i < n && *(const char *const *)((const char *)objs[i] + off) == impls[i]; i++)
            ;
        if (i == n) {
            cdata_off = off;
            found++;
        }
    }
    if (found != 1) {
        why = "no single THPVariable offset holds every probe's TensorImpl";
        goto done;
    }
    for (i = 1; i < n; i++)
        if (*(void *const *)impls[i] != *(void *const *)impls[0]) {
            why = "the probes' TensorImpls differ in vtable";
            goto done;
        }
    for (found = 0, off = 8; off + 8 * (1 + TL_MAX_DIMS) <= TL_SCAN; off += 8) {
        for (i = 0; i < n; i++) {
            if (*(const uint64_t *)(impls[i] + off) != (uint64_t)nds[i] ||
                memcmp(impls[i] + off + 8, sizes[i], (size_t)nds[i] * sizeof(int64_t)) != 0)
                break;
        }
        if (i == n) {
            sizes_off = off;
            found++;
        }
    }
    if (found != 1) {
        why = "no single TensorImpl offset holds every probe's sizes";
        goto done;
    }
    /* data_type_ follows the sizes and strides (8 + 2 * 5 * 8 bytes), storage_offset_ and numel_ */
    for (found = 0, off = sizes_off + 8 + 16 * TL_MAX_DIMS; off < sizes_off + 8 + 16 * TL_MAX_DIMS + 48; off += 2) {
        Py_ssize_t j;
        for (i = 0; i < n; i++) {
            uint16_t vi = *(const uint16_t *)(impls[i] + off);
            if (vi > 255)
                break;
            for (j = 0; j < i; j++)
                if ((labels[i] == labels[j]) != (vi == *(const uint16_t *)(impls[j] + off)))
                    break;
            if (j < i)
                break;
        }
        if (i == n) {
            dtype_off = off;
            found++;
        }
    }
    if (found != 1) {
        why = "no single TensorImpl offset tells the probes' dtypes apart";
        goto done;
    }
    TL.cdata_off = cdata_off;
    TL.vtbl = *(void *const *)impls[0];
    TL.sizes_off = sizes_off;
    TL.dtype_off = dtype_off;
    TL.ok = 1;
done:
    Py_DECREF(seq);
    TL.off_why = TL.ok ? NULL : why;
    return PyBool_FromLong(TL.ok);
}

static PyObject *tensor_layout(PyObject *m, PyObject *Py_UNUSED(ignored)) {
    if (TL.ok)
        return Py_BuildValue("{s:n,s:n,s:n}", "cdata_off", TL.cdata_off, "sizes_off", TL.sizes_off, "dtype_off",
                             TL.dtype_off);
    return PyUnicode_FromString(TL.off_why != NULL ? TL.off_why : "not probed");
}

/* ---- the process's real exit status in the ring's header (glibc on_exit) --------------
 * Python's at-exit handlers cannot know the status of ``raise SystemExit(3)`` or of the
 * ``exit(3)`` builtin (neither calls ``sys.exit``; the interpreter keeps the code in a C
 * local until ``exit()``). glibc's ``on_exit`` handlers are given it: the handler below
 * rewrites the exit code of the ring header's EXIT field when the recorded one differs.
 * It writes with pwrite on the ring file's descriptor (coherent with the MAP_SHARED
 * mapping through the page cache), only in the process that registered it (a forked
 * child inherits the registration), and only over an EXITED state (Python's exit record
 * written). Source: glibc manual, on_exit(3). */
static int exit_fd = -1;
static off_t exit_off = -1;
static pid_t exit_pid = 0;
static int exit_registered = 0;

static void on_process_exit(int status, void *arg) {
    int32_t field[2]; /* state, exit_code (layout.EXIT: "<iiQ") */
    int32_t code = status & 0xff;
    (void)arg;
    if (exit_fd < 0 || getpid() != exit_pid)
        return;
    if (pread(exit_fd, field, sizeof field, exit_off) != (ssize_t)sizeof field)
        return;
    if (field[0] != 2 /* ST_EXITED */ || field[1] == code)
        return;
    if (pwrite(exit_fd, &code, sizeof code, exit_off + 4) != (ssize_t)sizeof code)
        return;
}

static PyObject *exit_status_target(PyObject *m, PyObject *args) {
    int fd;
    long long off;
    (void)m;
    if (!PyArg_ParseTuple(args, "iL", &fd, &off))
        return NULL;
    if (fd < 0 || off < 0) {
        PyErr_SetString(PyExc_ValueError, "exit_status_target: fd and offset must be >= 0");
        return NULL;
    }
    exit_fd = fd;
    exit_off = (off_t)off;
    exit_pid = getpid();
    if (!exit_registered) {
        if (on_exit(on_process_exit, NULL) != 0) {
            exit_fd = -1;
            PyErr_SetString(PyExc_OSError, "on_exit() failed");
            return NULL;
        }
        exit_registered = 1;
    }
    Py_RETURN_NONE;
}


/* ---- who sent SIGTERM: one line in the SIGTERM stack file (sigterm_sender_target) --------
 * faulthandler's dump says where the process was, not who asked it to stop: a launcher, a
 * node agent's preemption, Ray's raylet, a user's kill. A SIGTERM from kill(2)/sigqueue(3)
 * carries the sender's pid and uid (si_code <= 0: SI_USER, SI_QUEUE, SI_TKILL; sigaction(2),
 * siginfo_t). This handler, installed on top of faulthandler's (SA_NODEFER like it, so the
 * previous handler's raise() reaches the program's own handler or the default at once),
 * writes "hangtrace: SIGTERM from pid N uid U: <its /proc/N/cmdline>" to the stack file's
 * descriptor, then calls the previous handler. Only async-signal-safe calls (open, read,
 * write, close; signal-safety(7)). faulthandler's chain re-registers itself on top after
 * the first SIGTERM: later ones are not annotated. */
static int sender_fd = -1;
static pid_t sender_owner = 0;
static struct sigaction sender_prev;
static volatile sig_atomic_t sender_prev_set = 0;

static size_t put_str(char *dst, size_t at, size_t cap, const char *src) {
    while (*src && at + 1 < cap)
        dst[at++] = *src++;
    return at;
}

static size_t put_long(char *dst, size_t at, size_t cap, long v) {
    char tmp[24];
    int n = 0;
    unsigned long u = v < 0 ? (unsigned long)(-v) : (unsigned long)v;
    if (v < 0 && at + 1 < cap)
        dst[at++] = '-';
    do {
        tmp[n++] = (char)('0' + (u % 10));
        u /= 10;
    } while (u && n < (int)sizeof tmp);
    while (n > 0 && at + 1 < cap)
        dst[at++] = tmp[--n];
    return at;
}

static void on_sigterm(int sig, siginfo_t *info, void *uctx) {
    int saved = errno;
    if (sender_fd >= 0 && getpid() == sender_owner && info != NULL && info->si_code <= 0) {
        char line[512], path[48];
        size_t n = 0, p = 0;
        ssize_t got = 0;
        int fd;
        n = put_str(line, n, sizeof line, "hangtrace: SIGTERM from pid ");
        n = put_long(line, n, sizeof line, (long)info->si_pid);
        n = put_str(line, n, sizeof line, " uid ");
        n = put_long(line, n, sizeof line, (long)info->si_uid);
        n = put_str(line, n, sizeof line, ": ");
        p = put_str(path, p, sizeof path, "/proc/");
        p = put_long(path, p, sizeof path, (long)info->si_pid);
        p = put_str(path, p, sizeof path, "/cmdline");
        path[p] = 0;
        fd = open(path, O_RDONLY | O_CLOEXEC);
        if (fd >= 0) {
            got = read(fd, line + n, sizeof line - n - 2);
            close(fd);
            if (got > 0) {
                ssize_t i;
                while (got > 0 && line[n + got - 1] == 0)
                    got--;
                for (i = 0; i < got; i++)
                    if (line[n + i] == 0 || line[n + i] == '\n')
                        line[n + i] = ' ';
                n += (size_t)got;
            }
        }
        if (got <= 0) { /* a zombie or an exited sender: its comm, while /proc keeps it */
            p = put_str(path, 0, sizeof path, "/proc/");
            p = put_long(path, p, sizeof path, (long)info->si_pid);
            p = put_str(path, p, sizeof path, "/comm");
            path[p] = 0;
            fd = open(path, O_RDONLY | O_CLOEXEC);
            got = 0;
            if (fd >= 0) {
                got = read(fd, line + n, 32);
                close(fd);
            }
            while (got > 0 && (line[n + got - 1] == '\n' || line[n + got - 1] == 0))
                got--;
            if (got > 0) {
                n += (size_t)got;
                n = put_str(line, n, sizeof line, " (exited)");
            } else {
                n = put_str(line, n, sizeof line, "(gone)");
            }
        }
        line[n++] = '\n';
        if (write(sender_fd, line, n) < 0) {
            /* nothing to do: the dump that follows still says where the process was */
        }
    }
    errno = saved;
    if (!sender_prev_set)
        return;
    if (sender_prev.sa_flags & SA_SIGINFO) {
        if (sender_prev.sa_sigaction != NULL)
            sender_prev.sa_sigaction(sig, info, uctx);
    } else if (sender_prev.sa_handler == SIG_DFL) {
        sigaction(sig, &sender_prev, NULL);
        raise(sig);
    } else if (sender_prev.sa_handler != SIG_IGN && sender_prev.sa_handler != NULL) {
        sender_prev.sa_handler(sig);
    }
}

static PyObject *sigterm_sender_target(PyObject *m, PyObject *args) {
    int fd;
    struct sigaction cur, act;
    (void)m;
    if (!PyArg_ParseTuple(args, "i", &fd))
        return NULL;
    if (fd < 0) {
        PyErr_SetString(PyExc_ValueError, "sigterm_sender_target: fd must be >= 0");
        return NULL;
    }
    if (sigaction(SIGTERM, NULL, &cur) != 0)
        return PyErr_SetFromErrno(PyExc_OSError);
    sender_fd = fd;
    sender_owner = getpid();
    if ((cur.sa_flags & SA_SIGINFO) && cur.sa_sigaction == on_sigterm)
        Py_RETURN_NONE; /* already on top */
    memset(&act, 0, sizeof act);
    act.sa_sigaction = on_sigterm;
    sigemptyset(&act.sa_mask);
    act.sa_flags = SA_SIGINFO | SA_RESTART | SA_NODEFER | SA_ONSTACK;
    sender_prev_set = 0;
    sender_prev = cur;
    sender_prev_set = 1;
    if (sigaction(SIGTERM, &act, NULL) != 0) {
        sender_fd = -1;
        return PyErr_SetFromErrno(PyExc_OSError);
    }
    Py_RETURN_NONE;
}

static PyMethodDef mod_methods[] = {
    {"set_tensor_type", set_tensor_type, METH_O,
     "set_tensor_type(torch.Tensor): tensors of exactly this type get numel = product of their shape, and their"
     " shape and dtype getters are called directly."},
    {"probe_tensor_layout", probe_tensor_layout, METH_O,
     "probe_tensor_layout([(tensor, tensor._cdata, tuple(tensor.shape), dtype label), ...]) -> bool: find where a"
     " plain tensor's TensorImpl keeps its sizes and dtype, so the wrapper reads them without torch's getters."},
    {"tensor_layout", tensor_layout, METH_NOARGS,
     "tensor_layout() -> dict of offsets while the probed layout is used, else a str saying why not."},
    {"exit_status_target", exit_status_target, METH_VARARGS,
     "exit_status_target(fd, exit_off): at this process's exit(), the status given to exit() replaces the exit"
     " code of the ring header's EXIT field at exit_off in file fd when it differs and the state is EXITED"
     " (glibc on_exit). Raises ValueError for a negative fd or offset, OSError when on_exit fails."},
    {"sigterm_sender_target", sigterm_sender_target, METH_VARARGS,
     "sigterm_sender_target(fd): a SIGTERM sent by a process (kill, sigqueue) writes 'hangtrace: SIGTERM from pid"
     " N uid U: <cmdline>' to fd, then runs the handler that was installed before this call (put it on top of"
     " faulthandler's). Again after another handler was installed: on top again. Raises ValueError for a"
     " negative fd, OSError when sigaction fails."},
    {"direct_getters", direct_getters, METH_NOARGS,
     "direct_getters() -> bool: whether a plain tensor's shape/dtype getters are called directly (looked up"
     " again first when torch.Tensor changed)."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef fastrec_module = {
    PyModuleDef_HEAD_INIT, "hangtrace.hooks._fastrec",
    "C hot path of hangtrace's recorder and torch.distributed wrappers (optional; see recorder.py).", -1,
    mod_methods,
};

PyMODINIT_FUNC PyInit__fastrec(void) {
    PyObject *m, *structmod;
    if (PyType_Ready(&RingType) < 0 || PyType_Ready(&StateType) < 0 || PyType_Ready(&CallType) < 0 ||
        PyType_Ready(&BusyType) < 0 || PyType_Ready(&CounterType) < 0 || PyType_Ready(&FindSpecType) < 0)
        return NULL;
    structmod = PyImport_ImportModule("struct");
    if (structmod == NULL)
        return NULL;
    StructError = PyObject_GetAttrString(structmod, "error");
    Py_DECREF(structmod);
    if (StructError == NULL)
        return NULL;
    s_state = PyUnicode_InternFromString("_state");
    s_group = PyUnicode_InternFromString("group");
    s_async_op = PyUnicode_InternFromString("async_op");
    s_numel = PyUnicode_InternFromString("numel");
    s_shape = PyUnicode_InternFromString("shape");
    s_dtype = PyUnicode_InternFromString("dtype");
    if (!s_state || !s_group || !s_async_op || !s_numel || !s_shape || !s_dtype)
        return NULL;
    m = PyModule_Create(&fastrec_module);
    if (m == NULL)
        return NULL;
    Py_INCREF(&RingType);
    Py_INCREF(&StateType);
    Py_INCREF(&CallType);
    Py_INCREF(&BusyType);
    Py_INCREF(&CounterType);
    Py_INCREF(&FindSpecType);
    if (PyModule_AddObject(m, "Ring", (PyObject *)&RingType) < 0 ||
        PyModule_AddObject(m, "StateBase", (PyObject *)&StateType) < 0 ||
        PyModule_AddObject(m, "Call", (PyObject *)&CallType) < 0 ||
        PyModule_AddObject(m, "Busy", (PyObject *)&BusyType) < 0 ||
        PyModule_AddObject(m, "Counter", (PyObject *)&CounterType) < 0 ||
        PyModule_AddObject(m, "FindSpec", (PyObject *)&FindSpecType) < 0 ||
        PyModule_AddIntConstant(m, "SLOT_SIZE", SLOT_SIZE) < 0 ||
        PyModule_AddIntConstant(m, "HEADER_SIZE", HEADER_SIZE) < 0) {
        Py_DECREF(m);
        return NULL;
    }
    return m;
}
