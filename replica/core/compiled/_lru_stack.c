/* SHARDS's inner exact LRU stack, compiled: replica/core/analysis/lru_stack.py's LruStack, the same
 * state and the same answers (tests/replica/core/analysis/test_lru_stack.py drives both with the same
 * random calls). See there for the method: a Fenwick tree over dead timestamps. */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#define INF_DIST INT64_MAX  /* lru_stack.INF = 2**63 - 1 */

/* block -> latest timestamp (0: absent), open addressing, backward-shift deletion, grows */
typedef struct { uint64_t *key; int64_t *val; uint64_t mask; Py_ssize_t used; } Map;

static inline uint64_t mix(uint64_t x) {
    x ^= x >> 30; x *= 0xbf58476d1ce4e5b9ULL;
    x ^= x >> 27; x *= 0x94d049bb133111ebULL;
    return x ^ (x >> 31);
}

static int map_init(Map *m, uint64_t size) {
    m->key = calloc(size, sizeof(uint64_t));
    m->val = calloc(size, sizeof(int64_t));  /* val 0: empty slot */
    m->mask = size - 1;
    m->used = 0;
    return m->key && m->val ? 0 : -1;
}

static inline int64_t map_get(const Map *m, uint64_t k) {
    for (uint64_t i = mix(k) & m->mask;; i = (i + 1) & m->mask) {
        if (!m->val[i]) return 0;
        if (m->key[i] == k) return m->val[i];
    }
}

static int map_put(Map *m, uint64_t k, int64_t v);

static int map_grow(Map *m) {
    Map old = *m;
    if (map_init(m, (old.mask + 1) * 2) < 0) { free(m->key); free(m->val); *m = old; return -1; }
    for (uint64_t i = 0; i <= old.mask; i++)
        if (old.val[i]) map_put(m, old.key[i], old.val[i]);
    free(old.key); free(old.val);
    return 0;
}

static int map_put(Map *m, uint64_t k, int64_t v) {  /* v > 0 */
    uint64_t i = mix(k) & m->mask;
    for (; m->val[i]; i = (i + 1) & m->mask)
        if (m->key[i] == k) { m->val[i] = v; return 0; }
    m->key[i] = k; m->val[i] = v; m->used++;
    if ((uint64_t)m->used * 2 > m->mask + 1) return map_grow(m);
    return 0;
}

static int64_t map_pop(Map *m, uint64_t k) {
    uint64_t i = mix(k) & m->mask;
    for (;; i = (i + 1) & m->mask) {
        if (!m->val[i]) return 0;
        if (m->key[i] == k) break;
    }
    int64_t v = m->val[i];
    for (uint64_t j = i;;) {  /* backward shift */
        j = (j + 1) & m->mask;
        if (!m->val[j]) break;
        uint64_t home = mix(m->key[j]) & m->mask;
        if (((j - home) & m->mask) >= ((j - i) & m->mask)) {
            m->key[i] = m->key[j]; m->val[i] = m->val[j];
            i = j;
        }
    }
    m->val[i] = 0;
    m->used--;
    return v;
}

typedef struct {
    PyObject_HEAD
    Map ts;
    int64_t *dead;   /* Fenwick tree over dead timestamps, size + 1 */
    double *time;    /* timestamp -> seconds (NAN: none); NULL until a step has a time */
    int64_t size, ndead, next;
    /* a step's scratch */
    int64_t *olds, *stale;
    Py_ssize_t scratch;
} Stack;

static void Stack_dealloc(Stack *s) {
    free(s->ts.key); free(s->ts.val); free(s->dead); free(s->time); free(s->olds); free(s->stale);
    Py_TYPE(s)->tp_free((PyObject *)s);
}

static int Stack_init(Stack *s, PyObject *args, PyObject *kw) {
    static char *names[] = {"initial_size", NULL};
    Py_ssize_t initial = 1024;
    if (!PyArg_ParseTupleAndKeywords(args, kw, "|n", names, &initial)) return -1;
    int64_t want = initial - 1 > 15 ? initial - 1 : 15, size = 1;  /* 1 << max(initial - 1, 15).bit_length() */
    while (want) { size <<= 1; want >>= 1; }
    s->size = size; s->ndead = 0; s->next = 1;
    s->dead = calloc((size_t)size + 1, sizeof(int64_t));
    if (!s->dead || map_init(&s->ts, 1024) < 0) { PyErr_NoMemory(); return -1; }
    return 0;
}

static int ensure_scratch(Stack *s, Py_ssize_t n) {
    if (n <= s->scratch) return 0;
    int64_t *a = realloc(s->olds, (size_t)n * sizeof(int64_t)), *b = a ? realloc(s->stale, (size_t)n * sizeof(int64_t)) : NULL;
    if (a) s->olds = a;
    if (b) s->stale = b;
    if (!a || !b) return -1;
    s->scratch = n;
    return 0;
}

static inline void fenwick_add(Stack *s, int64_t i) {
    for (; i <= s->size; i += i & -i) s->dead[i]++;
}

typedef struct { int64_t ts; uint64_t key; } Row;
static int by_ts(const void *a, const void *b) {
    int64_t x = ((const Row *)a)->ts, y = ((const Row *)b)->ts;
    return x < y ? -1 : x > y;
}

/* Renumber live timestamps 1..k (oldest first), none dead; grow so half the slots stay free. */
static int make_room(Stack *s, Py_ssize_t n) {
    Py_ssize_t live = s->ts.used;
    int64_t size = s->size;
    if (2 * (live + n) > size) {
        int64_t want = 2 * (live + n) - 1;
        size = 1;
        while (want) { size <<= 1; want >>= 1; }
    }
    Row *rows = malloc(((size_t)live + 1) * sizeof(Row));
    int64_t *dead = calloc((size_t)size + 1, sizeof(int64_t));
    double *time = s->time ? malloc(((size_t)size + 1) * sizeof(double)) : NULL;
    if (!rows || !dead || (s->time && !time)) { free(rows); free(dead); free(time); return -1; }
    Py_ssize_t m = 0;
    for (uint64_t i = 0; i <= s->ts.mask; i++)
        if (s->ts.val[i]) { rows[m].ts = s->ts.val[i]; rows[m].key = s->ts.key[i]; m++; }
    qsort(rows, (size_t)m, sizeof(Row), by_ts);
    if (time) {
        for (int64_t t = 0; t <= size; t++) time[t] = NAN;
        for (Py_ssize_t j = 0; j < m; j++) time[j + 1] = s->time[rows[j].ts];
        free(s->time);
        s->time = time;
    }
    for (Py_ssize_t j = 0; j < m; j++) map_put(&s->ts, rows[j].key, j + 1);
    free(rows);
    free(s->dead);
    s->dead = dead; s->size = size; s->ndead = 0; s->next = live + 1;
    return 0;
}

/* LruStack.step of blocks[0..n) at `now` (has_now false: None): distances into dist, reuse
 * times into dts; returns how many reuse times, or -1 (out of memory). */
static Py_ssize_t step(Stack *s, const uint64_t *blocks, Py_ssize_t n, int has_now, double now, int64_t *dist,
                       double *dts) {
    if (s->next + n > s->size + 1 && make_room(s, n) < 0) return -1;
    if (ensure_scratch(s, n) < 0) return -1;
    if (has_now && !s->time) {
        s->time = malloc(((size_t)s->size + 1) * sizeof(double));
        if (!s->time) return -1;
        for (int64_t t = 0; t <= s->size; t++) s->time[t] = NAN;
    }
    int64_t a = s->next, after = a - 1 - s->ndead;
    Py_ssize_t nstale = 0, ndts = 0;
    for (Py_ssize_t i = 0; i < n; i++) {
        int64_t t = map_get(&s->ts, blocks[i]);
        s->olds[i] = t;
        if (t) {
            int64_t d = after - t;
            for (int64_t j = t; j; j &= j - 1) d += s->dead[j];
            dist[i] = d;
            s->stale[nstale++] = t;
            if (has_now && !isnan(s->time[t])) dts[ndts++] = now - s->time[t];
        } else {
            dist[i] = INF_DIST;
        }
    }
    /* each block's new timestamp, b_0 newest; a repeated block keeps its first place (dict.fromkeys)
     * and its old timestamp dies once */
    int64_t m = 0;
    for (Py_ssize_t i = 0; i < n; i++) {  /* count distinct blocks: a repeat finds itself stamped below a */
        int64_t cur = map_get(&s->ts, blocks[i]);
        if (cur >= a) continue;
        if (map_put(&s->ts, blocks[i], a + n + i) < 0) return -1;  /* provisional: a + n + first index */
        m++;
    }
    for (Py_ssize_t j = 0; j < nstale; j++) {  /* distinct stale timestamps die */
        int64_t t = s->stale[j];
        int seen = 0;
        if (m < n)
            for (Py_ssize_t q = 0; q < j && !seen; q++) seen = s->stale[q] == t;
        if (!seen) { fenwick_add(s, t); s->ndead++; }
    }
    int64_t rank = 0;
    for (Py_ssize_t i = 0; i < n; i++) {  /* the k-th distinct block gets a + m - 1 - k */
        int64_t cur = map_get(&s->ts, blocks[i]);
        if (cur == a + n + i) {
            map_put(&s->ts, blocks[i], a + m - 1 - rank);
            rank++;
        }
    }
    if (has_now)
        for (int64_t t = a; t < a + m; t++) s->time[t] = now;
    s->next = a + m;
    return ndts;
}

static int read_blocks(PyObject *obj, uint64_t **out, Py_ssize_t *n) {
    PyObject *seq = PySequence_Fast(obj, "blocks must be a sequence of ints");
    if (!seq) return -1;
    *n = PySequence_Fast_GET_SIZE(seq);
    *out = malloc(((size_t)*n + 1) * sizeof(uint64_t));
    if (!*out) { Py_DECREF(seq); PyErr_NoMemory(); return -1; }
    PyObject **items = PySequence_Fast_ITEMS(seq);
    for (Py_ssize_t i = 0; i < *n; i++) {
        (*out)[i] = PyLong_AsUnsignedLongLongMask(items[i]);
        if ((*out)[i] == (uint64_t)-1 && PyErr_Occurred()) { Py_DECREF(seq); free(*out); return -1; }
    }
    Py_DECREF(seq);
    return 0;
}

/* step(blocks, now) -> (distances, reuse times): LruStack.step */
static PyObject *Stack_step(Stack *s, PyObject *args) {
    PyObject *blocks, *now_obj;
    if (!PyArg_ParseTuple(args, "OO", &blocks, &now_obj)) return NULL;
    int has_now = now_obj != Py_None;
    double now = has_now ? PyFloat_AsDouble(now_obj) : 0.0;
    if (has_now && now == -1.0 && PyErr_Occurred()) return NULL;
    uint64_t *keys;
    Py_ssize_t n;
    if (read_blocks(blocks, &keys, &n) < 0) return NULL;
    int64_t *dist = malloc(((size_t)n + 1) * sizeof(int64_t));
    double *dts = malloc(((size_t)n + 1) * sizeof(double));
    Py_ssize_t nd = dist && dts ? step(s, keys, n, has_now, now, dist, dts) : -1;
    PyObject *d = NULL, *t = NULL, *out = NULL;
    if (nd < 0) { PyErr_NoMemory(); goto done; }
    d = PyList_New(n); t = PyList_New(nd);
    if (!d || !t) goto done;
    for (Py_ssize_t i = 0; i < n; i++) PyList_SET_ITEM(d, i, PyLong_FromLongLong(dist[i]));
    for (Py_ssize_t i = 0; i < nd; i++) PyList_SET_ITEM(t, i, PyFloat_FromDouble(dts[i]));
    out = PyTuple_Pack(2, d, t);
done:
    Py_XDECREF(d); Py_XDECREF(t);
    free(keys); free(dist); free(dts);
    return out;
}

static int buffer(PyObject *o, Py_buffer *b, Py_ssize_t itemsize, const char *what) {
    if (PyObject_GetBuffer(o, b, PyBUF_C_CONTIGUOUS | PyBUF_FORMAT | PyBUF_WRITABLE) < 0
        && (PyErr_Clear(), PyObject_GetBuffer(o, b, PyBUF_C_CONTIGUOUS | PyBUF_FORMAT) < 0))
        return -1;
    if (b->itemsize != itemsize) {
        PyErr_Format(PyExc_TypeError, "%s: items of %zd bytes expected", what, itemsize);
        PyBuffer_Release(b);
        return -1;
    }
    return 0;
}

/* step_many(blocks u64, offsets i64, times f64 or None, dists i64 out, dts f64 out) -> reuse times written */
static PyObject *Stack_step_many(Stack *s, PyObject *args) {
    PyObject *o[5];
    if (!PyArg_ParseTuple(args, "OOOOO", &o[0], &o[1], &o[2], &o[3], &o[4])) return NULL;
    Py_buffer b[5];
    int got[5] = {0};
    PyObject *result = NULL;
    const char *what[5] = {"blocks", "offsets", "times", "dists", "dts"};
    for (int i = 0; i < 5; i++) {
        if (i == 2 && o[2] == Py_None) continue;
        if (buffer(o[i], &b[i], 8, what[i]) < 0) goto done;
        got[i] = 1;
    }
    Py_ssize_t nblocks = b[0].len / 8, nreq = b[1].len / 8 - 1;
    const int64_t *off = b[1].buf;
    if (b[3].readonly || b[4].readonly || b[3].len / 8 < nblocks || b[4].len / 8 < nblocks
        || (got[2] && b[2].len / 8 < nreq) || nreq < 0 || (nreq >= 0 && off[nreq] > nblocks)) {
        PyErr_SetString(PyExc_ValueError, "step_many: array lengths do not match");
        goto done;
    }
    Py_ssize_t written = 0;
    for (Py_ssize_t k = 0; k < nreq; k++) {
        Py_ssize_t lo = off[k], hi = off[k + 1];
        if (lo < 0 || hi < lo || hi > nblocks) { PyErr_SetString(PyExc_ValueError, "step_many: bad offsets"); goto done; }
        if (lo == hi) continue;
        Py_ssize_t nd = step(s, (const uint64_t *)b[0].buf + lo, hi - lo, got[2], got[2] ? ((double *)b[2].buf)[k] : 0.0,
                             (int64_t *)b[3].buf + lo, (double *)b[4].buf + written);
        if (nd < 0) { PyErr_NoMemory(); goto done; }
        written += nd;
    }
    result = PyLong_FromSsize_t(written);
done:
    for (int i = 0; i < 5; i++) if (got[i]) PyBuffer_Release(&b[i]);
    return result;
}

static PyObject *Stack_forget(Stack *s, PyObject *blocks) {
    uint64_t *keys;
    Py_ssize_t n, gone = 0;
    if (read_blocks(blocks, &keys, &n) < 0) return NULL;
    for (Py_ssize_t i = 0; i < n; i++) {
        int64_t t = map_pop(&s->ts, keys[i]);
        if (t) { fenwick_add(s, t); gone++; }  /* popped: a repeat finds nothing, so each dies once */
    }
    s->ndead += gone;
    free(keys);
    return PyLong_FromSsize_t(gone);
}

static PyObject *Stack_tracked(Stack *s, void *c) { (void)c; return PyLong_FromSsize_t(s->ts.used); }
static PyObject *Stack_size(Stack *s, void *c) { (void)c; return PyLong_FromLongLong(s->size); }

static PyGetSetDef Stack_getset[] = {
    {"tracked", (getter)Stack_tracked, NULL, "blocks tracked", NULL},
    {"size", (getter)Stack_size, NULL, "timestamp slots", NULL},
    {NULL, NULL, NULL, NULL, NULL},
};

static PyMethodDef Stack_methods[] = {
    {"step", (PyCFunction)Stack_step, METH_VARARGS, "LruStack.step(blocks, now) -> (distances, reuse times)."},
    {"step_many", (PyCFunction)Stack_step_many, METH_VARARGS, "LruStack.step_many."},
    {"forget", (PyCFunction)Stack_forget, METH_O, "LruStack.forget(blocks) -> how many were tracked."},
    {NULL, NULL, 0, NULL},
};

static PyTypeObject StackType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "replica.core.compiled._lru_stack.LruStack",
    .tp_basicsize = sizeof(Stack),
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = "SHARDS's exact LRU stack, compiled (replica/core/analysis/lru_stack.py is its definition).",
    .tp_new = PyType_GenericNew,
    .tp_init = (initproc)Stack_init,
    .tp_dealloc = (destructor)Stack_dealloc,
    .tp_methods = Stack_methods,
    .tp_getset = Stack_getset,
};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "_lru_stack", "SHARDS's exact LRU stack, compiled.", -1,
                                    NULL};

#ifndef SOURCE_SHA256
#define SOURCE_SHA256 ""
#endif

PyMODINIT_FUNC PyInit__lru_stack(void) {
    if (PyType_Ready(&StackType) < 0) return NULL;
    PyObject *m = PyModule_Create(&module);
    if (!m) return NULL;
    Py_INCREF(&StackType);
    if (PyModule_AddObject(m, "LruStack", (PyObject *)&StackType) < 0
        || PyModule_AddStringConstant(m, "SOURCE_SHA256", SOURCE_SHA256) < 0) {
        Py_DECREF(m);
        return NULL;
    }
    return m;
}
