/* The block pool serving requests one at a time, compiled: the cache-only replay's kernel.
 *
 * What it computes is defined by the Python pool (replica/core/pool.py, BlockPool.serve with
 * nothing pinned) and the policies replica/core/policies/lru.py and s3fifo.py: every hit, every
 * victim, the residency order, the footprints and the metrics come out identical (tests/replica/
 * core/test_replay.py compares the whole state after random traces). replica/core/replay.py
 * drives it and writes its state back into the Python pool; see there for when it is used.
 *
 * Layout: blocks live in node slots (key, owner, flags, prev/next links of one intrusive list);
 * a table of 2^k int32 entries maps a key to its slot (linear probing, deletion by backward
 * shift, so no tombstones). LRU keeps one list, its order; S3-FIFO keeps small and main as two
 * lists over the same links and its ghost as a second keys-only table with its own list.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#define NIL (-1)
#define KIND_LRU 0
#define KIND_S3FIFO 1
#define MAX_FREQ 3
#define IN_MAIN 4
#define NOT_TRACKED (-1) /* S3-FIFO: resident but given up as a victim while the request held it */
#define Q_NONE 0
#define Q_SMALL 1
#define Q_MAIN 2

/* ---- a keyed set of slots with one intrusive list ----------------------------------------- */
typedef struct {
    int32_t *index;  /* 2^bits entries: slot or NIL */
    uint64_t mask;
    uint64_t *key;
    int32_t *prev, *next;
    int32_t *free_next;
    int32_t free_head;
    int32_t slots;
    int32_t used;
} Table;

typedef struct { int32_t head, tail, len; } List;

static inline uint64_t mix(uint64_t x) {  /* splitmix64's finaliser: trace ids are often dense */
    x ^= x >> 30; x *= 0xbf58476d1ce4e5b9ULL;
    x ^= x >> 27; x *= 0x94d049bb133111ebULL;
    return x ^ (x >> 31);
}

static int table_init(Table *t, int32_t slots) {
    uint64_t size = 16;
    while (size < (uint64_t)slots * 2) size <<= 1;
    t->mask = size - 1;
    t->slots = slots;
    t->used = 0;
    t->index = malloc(size * sizeof(int32_t));
    t->key = malloc((size_t)slots * sizeof(uint64_t));
    t->prev = malloc((size_t)slots * sizeof(int32_t));
    t->next = malloc((size_t)slots * sizeof(int32_t));
    t->free_next = malloc((size_t)slots * sizeof(int32_t));
    if (!t->index || !t->key || !t->prev || !t->next || !t->free_next) return -1;
    memset(t->index, 0xff, size * sizeof(int32_t));
    for (int32_t i = 0; i < slots; i++) t->free_next[i] = i + 1 < slots ? i + 1 : NIL;
    t->free_head = slots ? 0 : NIL;
    return 0;
}

static void table_free(Table *t) {
    free(t->index); free(t->key); free(t->prev); free(t->next); free(t->free_next);
    memset(t, 0, sizeof(*t));
}

static inline int32_t table_find(const Table *t, uint64_t k) {
    uint64_t i = mix(k) & t->mask;
    for (;;) {
        int32_t s = t->index[i];
        if (s == NIL) return NIL;
        if (t->key[s] == k) return s;
        i = (i + 1) & t->mask;
    }
}

static inline int32_t table_add(Table *t, uint64_t k) {  /* k must be absent; a free slot must exist */
    int32_t s = t->free_head;
    t->free_head = t->free_next[s];
    t->key[s] = k;
    t->prev[s] = t->next[s] = NIL;
    uint64_t i = mix(k) & t->mask;
    while (t->index[i] != NIL) i = (i + 1) & t->mask;
    t->index[i] = s;
    t->used++;
    return s;
}

static void table_del(Table *t, int32_t s) {
    uint64_t i = mix(t->key[s]) & t->mask;
    while (t->index[i] != s) i = (i + 1) & t->mask;
    uint64_t j = i;
    for (;;) {  /* backward shift: move later entries of the probe run into the hole */
        j = (j + 1) & t->mask;
        int32_t o = t->index[j];
        if (o == NIL) break;
        uint64_t home = mix(t->key[o]) & t->mask;
        if (((j - home) & t->mask) >= ((j - i) & t->mask)) {
            t->index[i] = o;
            i = j;
        }
    }
    t->index[i] = NIL;
    t->free_next[s] = t->free_head;
    t->free_head = s;
    t->used--;
}

static inline void list_push(Table *t, List *l, int32_t s) {  /* at the tail */
    t->prev[s] = l->tail;
    t->next[s] = NIL;
    if (l->tail != NIL) t->next[l->tail] = s; else l->head = s;
    l->tail = s;
    l->len++;
}

static inline void list_unlink(Table *t, List *l, int32_t s) {
    int32_t p = t->prev[s], n = t->next[s];
    if (p != NIL) t->next[p] = n; else l->head = n;
    if (n != NIL) t->prev[n] = p; else l->tail = p;
    t->prev[s] = t->next[s] = NIL;
    l->len--;
}

/* ---- the kernel ----------------------------------------------------------------------------- */
typedef struct {
    PyObject_HEAD
    int kind, prefix_mode;
    int32_t capacity;
    Table res;               /* resident blocks */
    int32_t *owner;          /* session code per slot */
    uint8_t *reused;         /* hit at least once since it was inserted */
    int8_t *freq;            /* S3-FIFO: counter | IN_MAIN, or NOT_TRACKED */
    uint8_t *queue;          /* which list holds the slot (Q_NONE: none) */
    uint64_t *seq;           /* insertion order, for the resident map written back */
    uint32_t *stamp;         /* == cur_stamp: the block belongs to the request being served */
    uint32_t cur_stamp;
    uint64_t next_seq;
    List order;              /* LRU: head = next victim. S3-FIFO: small */
    List main;
    Table ghost;             /* S3-FIFO ids only; its list is the ghost FIFO */
    List ghost_fifo;
    int32_t small_size, main_size, ghost_size, threshold;
    int evicted;
    /* a request's scratch */
    int32_t *slot_of;        /* per depth */
    int32_t *touched, *scratch_idx;
    Table scratch;           /* new hashes of one request: duplicate check */
    /* footprints: per session code, resident blocks and when it (re)entered */
    int64_t *fp_count;
    uint64_t *fp_entry;
    Py_ssize_t sessions;
    uint64_t next_entry;
    /* counters */
    long long inserted, evictions, one_hit, hole_blocks;
    long long hole_len_log2[65];
    double cost_total, cost_hit;
} Kernel;

static void Kernel_dealloc(Kernel *k) {
    table_free(&k->res); table_free(&k->ghost); table_free(&k->scratch);
    free(k->owner); free(k->reused); free(k->freq); free(k->queue); free(k->seq); free(k->stamp);
    free(k->slot_of); free(k->touched); free(k->scratch_idx); free(k->fp_count); free(k->fp_entry);
    Py_TYPE(k)->tp_free((PyObject *)k);
}

static int Kernel_init(Kernel *k, PyObject *args, PyObject *kw) {
    static char *names[] = {"kind", "capacity", "prefix_mode", "sessions", "small_size", "main_size",
                            "ghost_size", "threshold", NULL};
    int kind, prefix_mode;
    int32_t capacity, small_size = 0, main_size = 0, ghost_size = 0, threshold = 2;
    Py_ssize_t sessions;
    if (!PyArg_ParseTupleAndKeywords(args, kw, "iipn|iiii", names, &kind, &capacity, &prefix_mode, &sessions,
                                     &small_size, &main_size, &ghost_size, &threshold))
        return -1;
    if (kind != KIND_LRU && kind != KIND_S3FIFO) { PyErr_SetString(PyExc_ValueError, "kind: 0 (lru) or 1 (s3fifo)"); return -1; }
    if (capacity < 1 || capacity > (1 << 29) || ghost_size < 0 || ghost_size > (1 << 29) || sessions < 0) {
        PyErr_SetString(PyExc_ValueError, "capacity, ghost_size or sessions out of range");
        return -1;
    }
    k->kind = kind; k->prefix_mode = prefix_mode; k->capacity = capacity;
    k->small_size = small_size; k->main_size = main_size; k->ghost_size = ghost_size; k->threshold = threshold;
    k->order.head = k->order.tail = k->main.head = k->main.tail = k->ghost_fifo.head = k->ghost_fifo.tail = NIL;
    k->sessions = sessions;
    size_t c = (size_t)capacity;
    if (table_init(&k->res, capacity) || table_init(&k->ghost, ghost_size + 1) || table_init(&k->scratch, capacity))
        goto nomem;
    k->owner = calloc(c, sizeof(int32_t)); k->reused = calloc(c, 1); k->freq = calloc(c, 1);
    k->queue = calloc(c, 1); k->seq = calloc(c, sizeof(uint64_t)); k->stamp = calloc(c, sizeof(uint32_t));
    k->slot_of = malloc(c * sizeof(int32_t)); k->touched = malloc(c * sizeof(int32_t));
    k->scratch_idx = malloc(c * sizeof(int32_t));
    k->fp_count = calloc((size_t)sessions + 1, sizeof(int64_t)); k->fp_entry = calloc((size_t)sessions + 1, sizeof(uint64_t));
    if (!k->owner || !k->reused || !k->freq || !k->queue || !k->seq || !k->stamp || !k->slot_of || !k->touched
        || !k->scratch_idx || !k->fp_count || !k->fp_entry)
        goto nomem;
    return 0;
nomem:
    PyErr_NoMemory();
    return -1;
}

/* -- residency (the pool's part) -- */
static void forget(Kernel *k, int32_t s) {  /* an evicted block: footprint, one-hit count */
    int32_t o = k->owner[s];
    k->fp_count[o]--;
    if (!k->reused[s]) k->one_hit++;
    k->evictions++;
    table_del(&k->res, s);
}

static void ghost_add(Kernel *k, uint64_t key) {
    if (!k->ghost_size) return;
    if (table_find(&k->ghost, key) != NIL) return;  /* already there: an OrderedDict keeps its place */
    list_push(&k->ghost, &k->ghost_fifo, table_add(&k->ghost, key));
    if (k->ghost_fifo.len > k->ghost_size) {
        int32_t old = k->ghost_fifo.head;
        list_unlink(&k->ghost, &k->ghost_fifo, old);
        table_del(&k->ghost, old);
    }
}

/* S3-FIFO: one block into the policy (its _insert) */
static void s3_insert(Kernel *k, int32_t s) {
    if (k->evicted) {
        int32_t g = table_find(&k->ghost, k->res.key[s]);
        if (g != NIL) {
            list_unlink(&k->ghost, &k->ghost_fifo, g);
            table_del(&k->ghost, g);
            k->freq[s] = IN_MAIN; k->queue[s] = Q_MAIN; list_push(&k->res, &k->main, s);
        } else {
            k->freq[s] = 0; k->queue[s] = Q_SMALL; list_push(&k->res, &k->order, s);
        }
    } else if (k->order.len < k->small_size) {
        k->freq[s] = 0; k->queue[s] = Q_SMALL; list_push(&k->res, &k->order, s);
    } else {
        k->freq[s] = IN_MAIN; k->queue[s] = Q_MAIN; list_push(&k->res, &k->main, s);
    }
}

/* The next block the policy gives up (it leaves the policy's order; S3-FIFO: its counter too). */
static int32_t next_victim(Kernel *k) {
    Table *t = &k->res;
    if (k->kind == KIND_LRU) {
        int32_t s = k->order.head;
        list_unlink(t, &k->order, s);
        k->queue[s] = Q_NONE;
        return s;
    }
    if (!(k->main.len > k->main_size || k->order.len == 0)) {
        while (k->order.len) {  /* small: promote while the counter says so, else evict to the ghost */
            int32_t s = k->order.head;
            list_unlink(t, &k->order, s);
            if (k->freq[s] >= k->threshold) {
                k->freq[s] = IN_MAIN; k->queue[s] = Q_MAIN; list_push(t, &k->main, s);
                continue;
            }
            k->freq[s] = NOT_TRACKED; k->queue[s] = Q_NONE;
            ghost_add(k, t->key[s]);
            return s;
        }
    }
    for (;;) {  /* main: a clock with a 2-bit counter */
        int32_t s = k->main.head;
        list_unlink(t, &k->main, s);
        if (k->freq[s] == IN_MAIN) { k->freq[s] = NOT_TRACKED; k->queue[s] = Q_NONE; return s; }
        k->freq[s]--;
        list_push(t, &k->main, s);
    }
}

static inline int bit_length(long long x) { int b = 0; while (x) { b++; x >>= 1; } return b; }

/* Serve one request; 0, or 1 when it cannot be served here (too long or a repeated hash): the
 * Python pool then raises its error. Nothing changes before that is known. */
static int serve_one(Kernel *k, const uint64_t *h, Py_ssize_t n, int32_t session, const double *cum, int32_t *hits_out, int32_t *prefix_out, int32_t *holes_out) {
    Table *t = &k->res;
    if (n > k->capacity) return 1;
    if (++k->cur_stamp == 0) { memset(k->stamp, 0, (size_t)k->capacity * sizeof(uint32_t)); k->cur_stamp = 1; }
    uint32_t cur = k->cur_stamp;
    int32_t nt = 0, nnew = 0;
    int dup = 0;
    for (Py_ssize_t i = 0; i < n; i++) {
        int32_t s = table_find(t, h[i]);
        k->slot_of[i] = s;
        if (s != NIL) {
            if (k->stamp[s] == cur) dup = 1;
            k->stamp[s] = cur;
            k->touched[nt++] = (int32_t)i;
        } else {
            if (table_find(&k->scratch, h[i]) != NIL) dup = 1;
            else { table_add(&k->scratch, h[i]); k->scratch_idx[nnew++] = (int32_t)i; }
        }
    }
    for (int32_t j = 0; j < nnew; j++) table_del(&k->scratch, table_find(&k->scratch, h[k->scratch_idx[j]]));
    if (dup) return 1;
    /* evict: the policy's victims in order, the request's own blocks skipped (they stay resident) */
    int32_t shortfall = nnew - (k->capacity - t->used);
    if (shortfall > 0) k->evicted = 1;
    while (shortfall > 0) {
        int32_t s = next_victim(k);
        if (k->stamp[s] == cur) continue;
        forget(k, s);
        shortfall--;
    }
    /* insert the new blocks, shallowest first (the resident map's order) */
    if (nnew) {
        if (k->fp_count[session] == 0) k->fp_entry[session] = k->next_entry++;
        k->fp_count[session] += nnew;
        k->inserted += nnew;
    }
    for (int32_t j = 0; j < nnew; j++) {
        int32_t i = k->scratch_idx[j];
        int32_t s = table_add(t, h[i]);
        k->slot_of[i] = s; k->owner[s] = session; k->reused[s] = 0; k->seq[s] = k->next_seq++;
        k->stamp[s] = cur; k->queue[s] = Q_NONE; k->freq[s] = NOT_TRACKED;
    }
    /* hits after the hit-mode rule */
    int32_t lead = 0;
    while (lead < nt && k->touched[lead] == lead) lead++;
    int32_t nh = k->prefix_mode ? lead : nt;
    int32_t holes = 0;
    for (int32_t j = 0; j < nh; j++) k->reused[k->slot_of[k->touched[j]]] = 1;
    k->cost_total += cum[n];
    if (nh) {
        if (nh == lead) {
            k->cost_hit += cum[nh];
        } else {  /* runs of hits: each a difference of prefix sums (DepthCosts.of_depths) */
            double sub = 0.0;
            int32_t prev = -1, start = k->touched[0];
            for (int32_t j = 0; j < nh; j++) {
                int32_t d = k->touched[j];
                if (d > prev + 1) {
                    if (prev >= 0) sub += cum[prev + 1] - cum[start];
                    start = d;
                    if (!k->prefix_mode) {
                        int32_t len = d - prev - 1;
                        holes++;
                        k->hole_len_log2[bit_length(len)]++;
                        k->hole_blocks += len;
                    }
                }
                prev = d;
            }
            sub += cum[prev + 1] - cum[start];
            k->cost_hit += sub;
        }
    }
    hits_out[0] = nh; prefix_out[0] = lead; holes_out[0] = holes;
    /* the policy hears of the access, then of the release */
    if (k->kind == KIND_S3FIFO) {
        for (int32_t j = 0; j < nt; j++) {  /* counters of touched blocks it still tracks */
            int32_t s = k->slot_of[k->touched[j]];
            int8_t f = k->freq[s];
            if (f != NOT_TRACKED && (f & MAX_FREQ) != MAX_FREQ) k->freq[s] = f + 1;
        }
        for (int32_t j = nnew - 1; j >= 0; j--) s3_insert(k, k->slot_of[k->scratch_idx[j]]);
        for (Py_ssize_t i = n - 1; i >= 0; i--) {  /* given up while in use: back in, deepest first */
            int32_t s = k->slot_of[i];
            if (k->freq[s] == NOT_TRACKED) s3_insert(k, s);
        }
    } else {
        for (Py_ssize_t i = n - 1; i >= 0; i--) {  /* to the tail, deepest first */
            int32_t s = k->slot_of[i];
            if (k->queue[s] != Q_NONE) list_unlink(t, &k->order, s);
            k->queue[s] = Q_SMALL;
            list_push(t, &k->order, s);
        }
    }
    return 0;
}

static int get_buffer(PyObject *o, Py_buffer *b, const char *what, Py_ssize_t itemsize) {
    if (PyObject_GetBuffer(o, b, PyBUF_C_CONTIGUOUS | PyBUF_FORMAT) < 0) return -1;
    if (b->itemsize != itemsize) {
        PyErr_Format(PyExc_TypeError, "%s: items of %zd bytes expected", what, itemsize);
        PyBuffer_Release(b);
        return -1;
    }
    return 0;
}

/* serve(hashes u64, offsets i64, sessions i32, start, stop, cum f64, hits i32, prefix i32, holes i32)
 * -> index of the first request not served (stop when all were). */
static PyObject *Kernel_serve(Kernel *k, PyObject *args) {
    PyObject *o[7];
    Py_ssize_t start, stop;
    if (!PyArg_ParseTuple(args, "OOOnnOOOO", &o[0], &o[1], &o[2], &start, &stop, &o[3], &o[4], &o[5], &o[6]))
        return NULL;
    static const char *what[7] = {"hashes", "offsets", "sessions", "cum", "hits", "prefix", "holes"};
    static const Py_ssize_t size[7] = {8, 8, 4, 8, 4, 4, 4};
    Py_buffer b[7];
    int got = 0;
    PyObject *result = NULL;
    for (; got < 7; got++)
        if (get_buffer(o[got], &b[got], what[got], size[got]) < 0) goto done;
    const uint64_t *hashes = b[0].buf;
    const int64_t *off = b[1].buf;
    const int32_t *sess = b[2].buf;
    Py_ssize_t nreq = b[1].len / 8 - 1;
    Py_ssize_t ncost = b[3].len / 8;
    if (start < 0 || stop > nreq || start > stop || b[2].len / 4 < nreq || b[4].len / 4 < nreq
        || b[5].len / 4 < nreq || b[6].len / 4 < nreq) {
        PyErr_SetString(PyExc_ValueError, "serve: start/stop or array lengths do not match");
        goto done;
    }
    Py_ssize_t r = start;
    Py_BEGIN_ALLOW_THREADS
    for (; r < stop; r++) {
        Py_ssize_t n = off[r + 1] - off[r];
        int32_t s = sess[r];
        if (n < 0 || n >= ncost || off[r + 1] * 8 > b[0].len || s < 0 || s > k->sessions) break;
        if (serve_one(k, hashes + off[r], n, s, b[3].buf, (int32_t *)b[4].buf + r,
                      (int32_t *)b[5].buf + r, (int32_t *)b[6].buf + r))
            break;
    }
    Py_END_ALLOW_THREADS
    result = PyLong_FromSsize_t(r);
done:
    for (int i = 0; i < got; i++) PyBuffer_Release(&b[i]);
    return result;
}

static PyObject *keys_of(Table *t, List *l) {  /* a list's keys, head first */
    PyObject *out = PyList_New(0);
    if (!out) return NULL;
    for (int32_t s = l->head; s != NIL; s = t->next[s]) {
        PyObject *v = PyLong_FromUnsignedLongLong(t->key[s]);
        if (!v || PyList_Append(out, v) < 0) { Py_XDECREF(v); Py_DECREF(out); return NULL; }
        Py_DECREF(v);
    }
    return out;
}

typedef struct { uint64_t seq; int32_t slot; } SeqSlot;
static int by_seq(const void *a, const void *b) {
    uint64_t x = ((const SeqSlot *)a)->seq, y = ((const SeqSlot *)b)->seq;
    return x < y ? -1 : x > y;
}

/* state() -> dict: what the Python pool and policy hold after the same requests. */
static PyObject *Kernel_state(Kernel *k, PyObject *Py_UNUSED(ignored)) {
    Table *t = &k->res;
    int32_t used = t->used, m = 0;
    SeqSlot *rows = malloc(((size_t)used + 1) * sizeof(SeqSlot));
    if (!rows) return PyErr_NoMemory();
    for (int32_t s = 0; s < t->slots && m < used; s++) {  /* live slots: the table points at them */
        int32_t f = table_find(t, t->key[s]);
        if (f == s) { rows[m].seq = k->seq[s]; rows[m].slot = s; m++; }
    }
    qsort(rows, (size_t)m, sizeof(SeqSlot), by_seq);
    PyObject *keys = PyList_New(m), *owners = PyList_New(m), *reused = PyList_New(0), *freq = PyDict_New();
    PyObject *out = NULL;
    if (!keys || !owners || !reused || !freq) goto fail;
    for (int32_t j = 0; j < m; j++) {
        int32_t s = rows[j].slot;
        PyObject *key = PyLong_FromUnsignedLongLong(t->key[s]);
        if (!key) goto fail;
        PyList_SET_ITEM(keys, j, key);
        PyList_SET_ITEM(owners, j, PyLong_FromLong(k->owner[s]));
        if (k->reused[s] && PyList_Append(reused, key) < 0) goto fail;
        if (k->kind == KIND_S3FIFO && k->freq[s] != NOT_TRACKED) {
            PyObject *f = PyLong_FromLong(k->freq[s]);
            if (!f || PyDict_SetItem(freq, key, f) < 0) { Py_XDECREF(f); goto fail; }
            Py_DECREF(f);
        }
    }
    /* footprints in the order a dict keeps them: by when each session last entered */
    Py_ssize_t live = 0;
    for (Py_ssize_t c = 0; c <= k->sessions; c++) live += k->fp_count[c] > 0;
    SeqSlot *fp = malloc(((size_t)live + 1) * sizeof(SeqSlot));
    if (!fp) { PyErr_NoMemory(); goto fail; }
    live = 0;
    for (Py_ssize_t c = 0; c <= k->sessions; c++)
        if (k->fp_count[c] > 0) { fp[live].seq = k->fp_entry[c]; fp[live].slot = (int32_t)c; live++; }
    qsort(fp, (size_t)live, sizeof(SeqSlot), by_seq);
    PyObject *foot = PyList_New(live);
    for (Py_ssize_t j = 0; foot && j < live; j++)
        PyList_SET_ITEM(foot, j, Py_BuildValue("(iL)", fp[j].slot, (long long)k->fp_count[fp[j].slot]));
    free(fp);
    PyObject *holes = PyList_New(65);
    for (int j = 0; holes && j < 65; j++) PyList_SET_ITEM(holes, j, PyLong_FromLongLong(k->hole_len_log2[j]));
    PyObject *order = keys_of(t, &k->order);
    PyObject *mainq = k->kind == KIND_S3FIFO ? keys_of(t, &k->main) : PyList_New(0);
    PyObject *ghost = keys_of(&k->ghost, &k->ghost_fifo);
    if (foot && holes && order && mainq && ghost)
        out = Py_BuildValue("{sOsOsOsOsOsOsOsOsOsisLsLsLsLsdsd}", "keys", keys, "owners", owners, "reused", reused,
                            "freq", freq, "footprint", foot, "hole_length_log2", holes, "order", order, "main", mainq,
                            "ghost", ghost, "evicted", k->evicted, "inserted", k->inserted, "evictions", k->evictions,
                            "one_hit_evictions", k->one_hit, "hole_blocks", k->hole_blocks, "cost_total", k->cost_total,
                            "cost_hit", k->cost_hit);
    Py_XDECREF(foot); Py_XDECREF(holes); Py_XDECREF(order); Py_XDECREF(mainq); Py_XDECREF(ghost);
fail:
    free(rows);
    Py_XDECREF(keys); Py_XDECREF(owners); Py_XDECREF(reused); Py_XDECREF(freq);
    return out;
}

static PyMethodDef Kernel_methods[] = {
    {"serve", (PyCFunction)Kernel_serve, METH_VARARGS, "Serve requests [start, stop); the first not served."},
    {"state", (PyCFunction)Kernel_state, METH_NOARGS, "The pool's and policy's state, for the write-back."},
    {NULL, NULL, 0, NULL},
};

static PyTypeObject KernelType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "replica.core._replay.Kernel",
    .tp_basicsize = sizeof(Kernel),
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = "A block pool with LRU or S3-FIFO serving requests one at a time (see replica/core/replay.py).",
    .tp_new = PyType_GenericNew,
    .tp_init = (initproc)Kernel_init,
    .tp_dealloc = (destructor)Kernel_dealloc,
    .tp_methods = Kernel_methods,
};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "_replay", "The cache-only replay's compiled kernel.", -1, NULL};

PyMODINIT_FUNC PyInit__replay(void) {
    if (PyType_Ready(&KernelType) < 0) return NULL;
    PyObject *m = PyModule_Create(&module);
    if (!m) return NULL;
    Py_INCREF(&KernelType);
    if (PyModule_AddObject(m, "Kernel", (PyObject *)&KernelType) < 0) { Py_DECREF(&KernelType); Py_DECREF(m); return NULL; }
#ifndef REPLAY_SOURCE_SHA256
#define REPLAY_SOURCE_SHA256 ""
#endif
    if (PyModule_AddStringConstant(m, "SOURCE_SHA256", REPLAY_SOURCE_SHA256) < 0) { Py_DECREF(m); return NULL; }
    return m;
}
