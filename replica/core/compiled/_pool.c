/* The block pool with LRU, S3-FIFO, Belady or BeladyCompute, compiled: the simulator's fast path
 * for one replica.
 *
 * What it computes is defined by the Python pool (replica/core/cache/pool.py: acquire, release,
 * take_private, free_private, serve) and the policies replica/core/cache/policies/lru.py, s3fifo.py
 * and belady.py (BeladyCompute's heaps in _belady_compute.h):
 * every hit, victim, pin, residency order, footprint and metric comes out identical
 * (tests/replica/core/compiled/test_compiled_pool.py drives both with the same random operations and
 * compares their whole state). replica/core/compiled/pool.py wraps it and writes its state back
 * into the Python pool; see there for when the simulator uses it.
 *
 * Layout: blocks live in node slots (key, owner, reference count, flags, prev/next links of one
 * intrusive list); a table of 2^k int32 entries maps a key to its slot (linear probing, deletion
 * by backward shift, so no tombstones). LRU keeps one list, its order; S3-FIFO keeps small and
 * main as two lists over the same links and its ghost as a second keys-only table with its own list.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#define NIL (-1)
#define KIND_LRU 0
#define KIND_S3FIFO 1
#define KIND_BELADY 2
#define KIND_BELADY_COMPUTE 3
#define MAX_FREQ 3
#define IN_MAIN 4
#define NOT_TRACKED (-1) /* S3-FIFO: resident but given up as a victim while the request held it */
#define Q_NONE 0
#define Q_SMALL 1
#define Q_MAIN 2

/* ---- a keyed set of slots with one intrusive list ----------------------------------------- */
/* One entry of the index: the key beside its slot, so a probe reads one cache line (the tables of a
 * cluster's pools and tiers outgrow the caches, and a lookup is then a memory access). */
typedef struct { uint64_t key; int32_t slot, unused; } Bucket;

typedef struct { int32_t prev, next; } Links;

typedef struct {
    Bucket *index;   /* 2^bits entries: slot (NIL: empty) and its key */
    uint64_t mask;
    uint64_t *key;
    Links *links;      /* per slot: its neighbours in the one list that holds it (one cache line for both) */
    int32_t *free_next;
    int32_t free_head;
    int32_t slots;
    int32_t used;
} Table;

typedef struct { int32_t evict_end, insert_end, len; } List;  /* evict_end: the oldest entry, next out */

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
    t->index = malloc(size * sizeof(Bucket));
    t->key = malloc((size_t)slots * sizeof(uint64_t));
    t->links = malloc((size_t)slots * sizeof(Links));
    t->free_next = malloc((size_t)slots * sizeof(int32_t));
    if (!t->index || !t->key || !t->links || !t->free_next) return -1;
    memset(t->index, 0xff, size * sizeof(Bucket));  /* slot NIL everywhere */
    for (int32_t i = 0; i < slots; i++) t->free_next[i] = i + 1 < slots ? i + 1 : NIL;
    t->free_head = slots ? 0 : NIL;
    return 0;
}

static void table_free(Table *t) {
    free(t->index); free(t->key); free(t->links); free(t->free_next);
    memset(t, 0, sizeof(*t));
}

static inline int32_t table_find(const Table *t, uint64_t k) {
    uint64_t i = mix(k) & t->mask;
    for (;;) {
        const Bucket *b = &t->index[i];
        if (b->slot == NIL) return NIL;
        if (b->key == k) return b->slot;
        i = (i + 1) & t->mask;
    }
}

/* Asks for the bucket where a lookup of k starts: a cluster's tables outgrow the caches, so a
 * loop over a request's keys asks a few keys ahead and its lookups then find their lines loaded. */
#define AHEAD 8
#if defined(__GNUC__) || defined(__clang__)
#define PREFETCH(p) __builtin_prefetch(p)
#else
#define PREFETCH(p) ((void)(p))
#endif
static inline void table_prefetch(const Table *t, uint64_t k) { PREFETCH(&t->index[mix(k) & t->mask]); }

static inline int32_t table_add(Table *t, uint64_t k) {  /* k must be absent; a free slot must exist */
    int32_t s = t->free_head;
    t->free_head = t->free_next[s];
    t->key[s] = k;
    t->links[s].prev = t->links[s].next = NIL;
    uint64_t i = mix(k) & t->mask;
    while (t->index[i].slot != NIL) i = (i + 1) & t->mask;
    t->index[i].slot = s;
    t->index[i].key = k;
    t->used++;
    return s;
}

static void table_del(Table *t, int32_t s) {
    uint64_t i = mix(t->key[s]) & t->mask;
    while (t->index[i].slot != s) i = (i + 1) & t->mask;
    uint64_t j = i;
    for (;;) {  /* backward shift: move later entries of the probe run into the hole */
        j = (j + 1) & t->mask;
        if (t->index[j].slot == NIL) break;
        uint64_t home = mix(t->index[j].key) & t->mask;
        if (((j - home) & t->mask) >= ((j - i) & t->mask)) {
            t->index[i] = t->index[j];
            i = j;
        }
    }
    t->index[i].slot = NIL;
    t->free_next[s] = t->free_head;
    t->free_head = s;
    t->used--;
}

/* The hashes one call has seen, for its repeat check: open addressing where a bucket is taken only
 * if stamped with the current call, so forgetting them all is one increment (deleting each from a
 * Table, a backward shift per key, cost 5% of a default run). At most capacity keys a call. */
typedef struct {
    uint64_t *key;
    uint32_t *stamp;
    uint64_t mask;
    uint32_t cur;
} Seen;

static int seen_init(Seen *s, int32_t most) {
    uint64_t size = 16;
    while (size < (uint64_t)most * 2) size <<= 1;
    s->mask = size - 1;
    s->cur = 1;
    s->key = malloc(size * sizeof(uint64_t));
    s->stamp = calloc(size, sizeof(uint32_t));
    return !s->key || !s->stamp ? -1 : 0;
}

static void seen_free(Seen *s) { free(s->key); free(s->stamp); memset(s, 0, sizeof(*s)); }

static inline int seen_add(Seen *s, uint64_t k) {  /* 1: seen since the last seen_forget; else 0, and now seen */
    uint64_t i = mix(k) & s->mask;
    while (s->stamp[i] == s->cur) {
        if (s->key[i] == k) return 1;
        i = (i + 1) & s->mask;
    }
    s->stamp[i] = s->cur;
    s->key[i] = k;
    return 0;
}

static inline void seen_forget(Seen *s) {
    if (++s->cur == 0) { memset(s->stamp, 0, (size_t)(s->mask + 1) * sizeof(uint32_t)); s->cur = 1; }
}

static inline void list_push(Table *t, List *l, int32_t s) {  /* at the insertion end */
    t->links[s].prev = l->insert_end;
    t->links[s].next = NIL;
    if (l->insert_end != NIL) t->links[l->insert_end].next = s; else l->evict_end = s;
    l->insert_end = s;
    l->len++;
}

static inline void list_unlink(Table *t, List *l, int32_t s) {
    int32_t p = t->links[s].prev, n = t->links[s].next;
    if (p != NIL) t->links[p].next = n; else l->evict_end = n;
    if (n != NIL) t->links[n].prev = p; else l->insert_end = p;
    t->links[s].prev = t->links[s].next = NIL;
    l->len--;
}

/* ---- the pool ------------------------------------------------------------------------------ */
/* What the pool's work returns: plain codes, never Python's error state, because serve runs it
 * with the GIL released. Only the methods Python calls turn a code into an exception
 * (raise_status), holding the GIL. TOO_LONG, REPEATS and BUSY are refusals (nothing changed; the
 * wrapper raises the pool's own errors for them, reading these codes from the module); the others
 * are failures. */
enum { OK = 0, TOO_LONG = 1, REPEATS = 2, BUSY = 3, NO_MEMORY = 4, COSTS_SHORT = 5, POLICY_COSTS_SHORT = 6 };

typedef struct {
    PyObject_HEAD
    int kind, prefix_mode;
    int32_t capacity, block_size;
    Table res;               /* resident blocks */
    int32_t *owner;          /* session code per slot */
    int32_t *refs;           /* running requests holding the block (pins) */
    uint8_t *reused;         /* hit at least once since it was inserted */
    int8_t *freq;            /* S3-FIFO: counter | IN_MAIN, or NOT_TRACKED */
    uint8_t *queue;          /* which list holds the slot (Q_NONE: none) */
    uint64_t *seq;           /* insertion order, for the resident map written back */
    uint32_t *stamp;         /* == cur_stamp: seen in the request being looked up */
    uint32_t cur_stamp;
    uint64_t next_seq;
    int32_t pinned, private_blocks;
    double *nu;              /* Belady: the block's recorded next use (has_rec) */
    uint8_t *has_rec;
    int32_t records;
    double *heap_t;          /* Belady: max-heap of (next use, block) entries, stale ones dropped lazily */
    uint64_t *heap_k;
    Py_ssize_t heap_len, heap_cap;
    struct BeladyCompute *bc; /* BeladyCompute's heaps (_belady_compute.h) */
    int32_t *depth;          /* BeladyCompute: the block's recorded depth */
    double position;         /* the oracles' now: where the request being served starts */
    double next_position;    /* acquire's, set once its request passed the checks (as BlockPool does) */
    int has_position;
    const double *next_use;  /* the request being acquired: its blocks' next uses (NULL: none known) */
    List order;              /* LRU: its order (evict_end: the next victim). S3-FIFO: small */
    List main;
    Table ghost;             /* S3-FIFO ids only; its list is the ghost FIFO */
    List ghost_fifo;
    int32_t small_size, main_size, ghost_size, threshold;
    int evicted;
    double *cum;             /* recompute cost of the first d blocks, d = 0..ncum-1 (set_costs) */
    Py_ssize_t ncum;
    /* a request's scratch */
    uint64_t *keys;
    double *uses;            /* a request's next uses, read from Python */
    int32_t *slot_of, *touched, *fresh, *freed, *hole_len;
    int32_t ntouched, nfresh, nhits, lead, holes;
    Seen scratch;            /* new hashes of one request: the repeat check */
    /* footprints: per session code, resident blocks and when it (re)entered the dict */
    int64_t *fp_count;
    uint64_t *fp_entry;
    Py_ssize_t fp_size;
    uint64_t next_entry;
    /* metrics (PoolMetrics' counters) */
    long long requests, block_accesses, block_hits, prefix_hit_blocks, tokens_queried, tokens_hit;
    long long inserted, evictions, one_hit, holes_total, hole_blocks;
    long long hole_len_log2[65];
    long long *holes_hist;   /* requests per number of holes, 0..capacity */
    double cost_total, cost_hit;
    /* SHARDS's sample of the recorded acquisitions (ShardsTracker.sample_in): for each block whose
     * xxh3_64 of its 8 bytes, mod smp_mod, is below smp_thr, its key and that value; per recorded
     * request, how many were sampled so far (take_samples hands them over and starts again) */
    int sampling;
    uint64_t smp_flip, smp_prime, smp_mod, smp_thr;
    uint64_t *smp_key, *smp_val;
    int64_t *smp_end;
    Py_ssize_t smp_len, smp_cap, smp_reqs, smp_req_cap;
    /* a lower tier's feed (BlockPool.evicted_sink): the keys one call evicted, in eviction order */
    int record_evicted;
    uint64_t *ev_keys;
    Py_ssize_t nevicted;
} Pool;

static PyObject *Refused;  /* (code, shortfall, available): the wrapper raises the pool's own errors */

static int load_costs(Pool *k, PyObject *cum_obj) {
    Py_buffer cb;
    if (PyObject_GetBuffer(cum_obj, &cb, PyBUF_C_CONTIGUOUS | PyBUF_FORMAT) < 0) return -1;
    if (cb.itemsize != 8 || cb.len < 8) {
        PyBuffer_Release(&cb);
        PyErr_SetString(PyExc_ValueError, "cum: float64 prefix sums expected");
        return -1;
    }
    double *cum = malloc((size_t)cb.len);
    if (!cum) { PyBuffer_Release(&cb); PyErr_NoMemory(); return -1; }
    memcpy(cum, cb.buf, (size_t)cb.len);
    free(k->cum);
    k->cum = cum;
    k->ncum = cb.len / 8;
    PyBuffer_Release(&cb);
    return 0;
}

#include "_belady_compute.h"  /* BeladyCompute: its heaps and victims, over the struct above */

static void Pool_dealloc(Pool *k) {
    table_free(&k->res); table_free(&k->ghost); seen_free(&k->scratch);
    free(k->owner); free(k->refs); free(k->reused); free(k->freq); free(k->queue); free(k->seq); free(k->stamp);
    free(k->cum); free(k->keys); free(k->slot_of); free(k->touched); free(k->fresh); free(k->freed);
    free(k->hole_len); free(k->fp_count); free(k->fp_entry); free(k->holes_hist);
    free(k->nu); free(k->has_rec); free(k->heap_t); free(k->heap_k); free(k->uses); free(k->depth);
    free(k->ev_keys); free(k->smp_key); free(k->smp_val); free(k->smp_end);
    bc_free(k);
    Py_TYPE(k)->tp_free((PyObject *)k);
}

static int Pool_init(Pool *k, PyObject *args, PyObject *kw) {
    static char *names[] = {"kind", "capacity", "block_size", "prefix_mode", "cum", "small_size", "main_size",
                            "ghost_size", "threshold", NULL};
    int kind, prefix_mode;
    int32_t capacity, block_size, small_size = 0, main_size = 0, ghost_size = 0, threshold = 2;
    PyObject *cum_obj;
    if (!PyArg_ParseTupleAndKeywords(args, kw, "iiipO|iiii", names, &kind, &capacity, &block_size, &prefix_mode,
                                     &cum_obj, &small_size, &main_size, &ghost_size, &threshold))
        return -1;
    if (kind < KIND_LRU || kind > KIND_BELADY_COMPUTE) {
        PyErr_SetString(PyExc_ValueError, "kind: KIND_LRU, KIND_S3FIFO, KIND_BELADY or KIND_BELADY_COMPUTE");
        return -1;
    }
    if (capacity < 1 || capacity > (1 << 29) || ghost_size < 0 || ghost_size > (1 << 29) || block_size < 1) {
        PyErr_SetString(PyExc_ValueError, "capacity, block_size or ghost_size out of range");
        return -1;
    }
    if (load_costs(k, cum_obj) < 0) return -1;
    size_t c = (size_t)capacity;
    k->kind = kind; k->prefix_mode = prefix_mode; k->capacity = capacity; k->block_size = block_size;
    k->small_size = small_size; k->main_size = main_size; k->ghost_size = ghost_size; k->threshold = threshold;
    k->order.evict_end = k->order.insert_end = k->main.evict_end = k->main.insert_end = NIL;
    k->ghost_fifo.evict_end = k->ghost_fifo.insert_end = NIL;
    if (table_init(&k->res, capacity) || table_init(&k->ghost, ghost_size + 1)
        || seen_init(&k->scratch, capacity))
        goto nomem;
    k->owner = calloc(c, sizeof(int32_t)); k->refs = calloc(c, sizeof(int32_t)); k->reused = calloc(c, 1);
    k->freq = calloc(c, 1); k->queue = calloc(c, 1); k->seq = calloc(c, sizeof(uint64_t));
    k->stamp = calloc(c, sizeof(uint32_t)); k->keys = malloc(c * sizeof(uint64_t)); k->uses = malloc(c * sizeof(double));
    k->slot_of = malloc(c * sizeof(int32_t)); k->touched = malloc(c * sizeof(int32_t));
    k->fresh = malloc(c * sizeof(int32_t)); k->freed = malloc(c * sizeof(int32_t));
    k->hole_len = malloc(c * sizeof(int32_t)); k->holes_hist = calloc(c + 1, sizeof(long long));
    k->nu = calloc(c, sizeof(double)); k->has_rec = calloc(c, 1); k->depth = calloc(c, sizeof(int32_t));
    k->ev_keys = malloc(c * sizeof(uint64_t));
    if (kind == KIND_BELADY_COMPUTE && bc_init(k) < 0) goto nomem;
    k->heap_cap = 1024; k->heap_t = malloc(1024 * sizeof(double)); k->heap_k = malloc(1024 * sizeof(uint64_t));
    k->fp_size = 1024;
    k->fp_count = calloc((size_t)k->fp_size, sizeof(int64_t)); k->fp_entry = calloc((size_t)k->fp_size, sizeof(uint64_t));
    if (!k->owner || !k->refs || !k->reused || !k->freq || !k->queue || !k->seq || !k->stamp || !k->keys
        || !k->slot_of || !k->touched || !k->fresh || !k->freed || !k->hole_len || !k->holes_hist || !k->fp_count
        || !k->fp_entry || !k->nu || !k->has_rec || !k->heap_t || !k->heap_k || !k->uses || !k->depth)
        goto nomem;
    return 0;
nomem:
    PyErr_NoMemory();
    return -1;
}

static int grow_sessions(Pool *k, int32_t code) {  /* OK or NO_MEMORY */
    if (code < k->fp_size) return OK;
    Py_ssize_t size = k->fp_size;
    while (size <= code) size *= 2;
    int64_t *c = realloc(k->fp_count, (size_t)size * sizeof(int64_t));
    if (c) k->fp_count = c;
    uint64_t *e = realloc(k->fp_entry, (size_t)size * sizeof(uint64_t));
    if (e) k->fp_entry = e;
    if (!c || !e) return NO_MEMORY;
    memset(k->fp_count + k->fp_size, 0, (size_t)(size - k->fp_size) * sizeof(int64_t));
    memset(k->fp_entry + k->fp_size, 0, (size_t)(size - k->fp_size) * sizeof(uint64_t));
    k->fp_size = size;
    return OK;
}

/* -- the policy's part -- */
static void ghost_add(Pool *k, uint64_t key) {
    if (!k->ghost_size || table_find(&k->ghost, key) != NIL) return;  /* an OrderedDict keeps its place */
    list_push(&k->ghost, &k->ghost_fifo, table_add(&k->ghost, key));
    if (k->ghost_fifo.len > k->ghost_size) {
        int32_t old = k->ghost_fifo.evict_end;
        list_unlink(&k->ghost, &k->ghost_fifo, old);
        table_del(&k->ghost, old);
    }
}

static void s3_insert(Pool *k, int32_t s) {  /* S3FIFOPolicy._insert, one block */
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

/* Belady (policies/belady.py): entries (next use, block), the farthest next use first, ties the
 * larger block first; an entry is live while its block's record equals it and the block is unpinned. */
static inline int heap_before(const Pool *k, Py_ssize_t a, Py_ssize_t b) {
    double ta = k->heap_t[a], tb = k->heap_t[b];
    return ta > tb || (ta == tb && k->heap_k[a] > k->heap_k[b]);
}

static inline void heap_swap(Pool *k, Py_ssize_t a, Py_ssize_t b) {
    double t = k->heap_t[a]; k->heap_t[a] = k->heap_t[b]; k->heap_t[b] = t;
    uint64_t x = k->heap_k[a]; k->heap_k[a] = k->heap_k[b]; k->heap_k[b] = x;
}

static void heap_down(Pool *k, Py_ssize_t i) {
    for (;;) {
        Py_ssize_t l = 2 * i + 1, r = l + 1, m = i;
        if (l < k->heap_len && heap_before(k, l, m)) m = l;
        if (r < k->heap_len && heap_before(k, r, m)) m = r;
        if (m == i) return;
        heap_swap(k, i, m);
        i = m;
    }
}

static int heap_push(Pool *k, double t, uint64_t key) {
    if (k->heap_len == k->heap_cap) {
        Py_ssize_t cap = k->heap_cap * 2;
        double *ht = realloc(k->heap_t, (size_t)cap * sizeof(double));
        if (ht) k->heap_t = ht;
        uint64_t *hk = ht ? realloc(k->heap_k, (size_t)cap * sizeof(uint64_t)) : NULL;
        if (hk) k->heap_k = hk;
        if (!ht || !hk) return -1;
        k->heap_cap = cap;
    }
    Py_ssize_t i = k->heap_len++;
    k->heap_t[i] = t; k->heap_k[i] = key;
    while (i && heap_before(k, i, (i - 1) / 2)) { heap_swap(k, i, (i - 1) / 2); i = (i - 1) / 2; }
    return 0;
}

static void heap_rebuild(Pool *k) {  /* every unpinned block's record: no stale entry left */
    Table *t = &k->res;
    k->heap_len = 0;
    for (int32_t s = 0; s < t->slots; s++)
        if (k->has_rec[s] && !k->refs[s] && table_find(t, t->key[s]) == s) {
            k->heap_t[k->heap_len] = k->nu[s]; k->heap_k[k->heap_len] = t->key[s]; k->heap_len++;
        }
    for (Py_ssize_t i = k->heap_len / 2; i-- > 0;) heap_down(k, i);
}

static int32_t belady_victim(Pool *k) {
    for (;;) {
        double t = k->heap_t[0];
        uint64_t key = k->heap_k[0];
        k->heap_len--;
        if (k->heap_len) { k->heap_t[0] = k->heap_t[k->heap_len]; k->heap_k[0] = k->heap_k[k->heap_len]; heap_down(k, 0); }
        int32_t s = table_find(&k->res, key);
        if (s == NIL || !k->has_rec[s] || k->nu[s] != t || k->refs[s]) continue;  /* stale */
        k->has_rec[s] = 0;
        k->records--;
        return s;
    }
}

/* The next block the policy gives up: it leaves the policy's order (S3-FIFO: its counter too). */
static int32_t next_victim(Pool *k) {
    Table *t = &k->res;
    if (k->kind == KIND_BELADY) return belady_victim(k);
    if (k->kind == KIND_BELADY_COMPUTE) return bc_victim(k);
    if (k->kind == KIND_LRU) {
        int32_t s = k->order.evict_end;
        list_unlink(t, &k->order, s);
        k->queue[s] = Q_NONE;
        return s;
    }
    if (!(k->main.len > k->main_size || k->order.len == 0)) {
        while (k->order.len) {  /* small: promote while the counter says so, else evict to the ghost */
            int32_t s = k->order.evict_end;
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
        int32_t s = k->main.evict_end;
        list_unlink(t, &k->main, s);
        if (k->freq[s] == IN_MAIN) { k->freq[s] = NOT_TRACKED; k->queue[s] = Q_NONE; return s; }
        k->freq[s]--;
        list_push(t, &k->main, s);
    }
}

/* -- the pool's part -- */
static void evict(Pool *k, int32_t count) {  /* BlockPool._evict: pinned victims only leave the order */
    k->evicted = 1;
    while (count > 0) {
        int32_t s = next_victim(k);
        if (k->refs[s]) continue;
        int32_t o = k->owner[s];
        k->fp_count[o]--;
        if (!k->reused[s]) k->one_hit++;
        k->evictions++;
        if (k->record_evicted) k->ev_keys[k->nevicted++] = k->res.key[s];  /* at most capacity a call */
        table_del(&k->res, s);
        count--;
    }
}

static inline int bit_length(long long x) { int b = 0; while (x) { b++; x >>= 1; } return b; }

/* BlockPool.acquire of keys[0..n): OK, or a refusal or failure code (nothing changed then; BUSY
 * fills out[]). Runs without the GIL in serve: it never touches a Python object or error. */
static int acquire_one(Pool *k, Py_ssize_t n, int32_t session, long long tokens, int record, int32_t extra,
                       int32_t out[2]) {
    Table *t = &k->res;
    const uint64_t *h = k->keys;
    if (n > k->capacity) return TOO_LONG;
    if (n >= k->ncum) return COSTS_SHORT;
    if (++k->cur_stamp == 0) { memset(k->stamp, 0, (size_t)k->capacity * sizeof(uint32_t)); k->cur_stamp = 1; }
    uint32_t cur = k->cur_stamp;
    int32_t nt = 0, nf = 0, newly_pinned = 0;
    int repeats = 0;
    for (Py_ssize_t i = 0; i < AHEAD && i < n; i++) table_prefetch(t, h[i]);
    for (Py_ssize_t i = 0; i < n; i++) {
        if (i + AHEAD < n) table_prefetch(t, h[i + AHEAD]);
        int32_t s = table_find(t, h[i]);
        k->slot_of[i] = s;
        if (s != NIL) {
            if (k->stamp[s] == cur) repeats = 1;
            k->stamp[s] = cur;
            newly_pinned += k->refs[s] == 0;
            k->touched[nt++] = (int32_t)i;
        } else if (seen_add(&k->scratch, h[i])) {
            repeats = 1;
        } else {
            k->fresh[nf++] = (int32_t)i;
        }
    }
    seen_forget(&k->scratch);
    if (repeats) return REPEATS;
    if (nf && grow_sessions(k, session) != OK) return NO_MEMORY;  /* before anything changes */
    if (k->has_position) k->position = k->next_position;
    int32_t shortfall = nf + extra - (k->capacity - t->used - k->private_blocks);
    if (shortfall > 0) {
        int32_t available = t->used - k->pinned - newly_pinned;
        if (available < shortfall) { out[0] = shortfall; out[1] = available; return BUSY; }
    }
    for (int32_t j = 0; j < nt; j++) {  /* pin what is resident, then evict around it */
        int32_t s = k->slot_of[k->touched[j]];
        if (k->refs[s]++ == 0) {
            k->pinned++;
            if (k->kind >= KIND_BELADY && k->has_rec[s]) { k->has_rec[s] = 0; k->records--; }  /* on_pin */
        }
    }
    if (shortfall > 0) evict(k, shortfall);
    if (nf) {  /* insert the new blocks, shallowest first (the resident map's order), pinned */
        if (k->fp_count[session] == 0) k->fp_entry[session] = k->next_entry++;
        k->fp_count[session] += nf;
        k->inserted += nf;
        k->pinned += nf;
    }
    for (int32_t j = 0; j < nf; j++) {
        int32_t i = k->fresh[j];
        int32_t s = table_add(t, h[i]);
        k->slot_of[i] = s; k->owner[s] = session; k->reused[s] = 0; k->seq[s] = k->next_seq++;
        k->refs[s] = 1; k->queue[s] = Q_NONE; k->freq[s] = NOT_TRACKED; k->has_rec[s] = 0;
    }
    k->private_blocks += extra;
    /* hits after the hit-mode rule; holes (gaps before a reused block) in holes mode */
    int32_t lead = 0;
    while (lead < nt && k->touched[lead] == lead) lead++;
    int32_t nh = k->prefix_mode ? lead : nt, holes = 0;
    for (int32_t j = 0; j < nh; j++) k->reused[k->slot_of[k->touched[j]]] = 1;
    double cost = nh ? k->cum[nh] : 0.0;
    if (nh && nh != lead) {  /* runs of hits: each a difference of prefix sums (DepthCosts.of_depths) */
        int32_t prev = -1, start = k->touched[0];
        cost = 0.0;
        for (int32_t j = 0; j < nh; j++) {
            int32_t d = k->touched[j];
            if (d > prev + 1) {
                if (prev >= 0) cost += k->cum[prev + 1] - k->cum[start];
                start = d;
                k->hole_len[holes++] = d - prev - 1;
            }
            prev = d;
        }
        cost += k->cum[prev + 1] - k->cum[start];
    }
    k->ntouched = nt; k->nfresh = nf; k->nhits = nh; k->lead = lead; k->holes = holes;
    if (record) {  /* PoolMetrics.record_request */
        long long queried = tokens < 0 ? (long long)n * k->block_size : tokens;
        long long hit_tokens = (long long)nh * k->block_size;
        k->requests++;
        k->block_accesses += n;
        k->block_hits += nh;
        k->prefix_hit_blocks += nh ? lead : 0;
        k->tokens_queried += queried;
        k->tokens_hit += hit_tokens < queried ? hit_tokens : queried;
        k->cost_total += k->cum[n];
        if (nh) k->cost_hit += cost;
        k->holes_hist[holes]++;
        k->holes_total += holes;
        for (int32_t j = 0; j < holes; j++) {
            k->hole_len_log2[bit_length(k->hole_len[j])]++;
            k->hole_blocks += k->hole_len[j];
        }
    }
    if (k->kind >= KIND_BELADY) {  /* on_access: every block's next use (infinite: never again, or unknown) */
        for (Py_ssize_t i = 0; i < n; i++) {
            int32_t s = k->slot_of[i];
            if (!k->has_rec[s]) k->records++;
            k->has_rec[s] = 1;
            k->nu[s] = k->next_use ? k->next_use[i] : INFINITY;
            k->depth[s] = (int32_t)i;
        }
    }
    if (k->kind == KIND_S3FIFO) {  /* on_access: counters of touched blocks it tracks, then the new ones */
        for (int32_t j = 0; j < nt; j++) {
            int32_t s = k->slot_of[k->touched[j]];
            int8_t f = k->freq[s];
            if (f != NOT_TRACKED && (f & MAX_FREQ) != MAX_FREQ) k->freq[s] = f + 1;
        }
        for (int32_t j = nf - 1; j >= 0; j--) s3_insert(k, k->slot_of[k->fresh[j]]);
    }
    return OK;
}

/* BlockPool.release of the blocks in slots[0..n) (in depth order): unpin; the policy hears of
 * those no request holds any more. OK or a failure code; runs without the GIL in serve. */
static int release_slots(Pool *k, const int32_t *slots, Py_ssize_t n) {
    int32_t nfreed = 0;
    for (Py_ssize_t i = 0; i < n; i++) {
        int32_t s = slots[i];
        if (--k->refs[s] == 0) { k->pinned--; k->freed[nfreed++] = s; }
    }
    Table *t = &k->res;
    for (int32_t j = nfreed - 1; k->kind <= KIND_S3FIFO && j >= 0; j--) {  /* deepest first */
        int32_t s = k->freed[j];
        if (k->kind == KIND_LRU) {
            if (k->queue[s] != Q_NONE) list_unlink(t, &k->order, s);
            k->queue[s] = Q_SMALL;
            list_push(t, &k->order, s);
        } else if (k->freq[s] == NOT_TRACKED) {  /* given up as a victim while pinned: back in */
            s3_insert(k, s);
        }
    }
    if (k->kind == KIND_BELADY) {  /* on_release: the freed blocks with a record enter the heap */
        for (int32_t j = 0; j < nfreed; j++) {
            int32_t s = k->freed[j];
            if (k->has_rec[s] && heap_push(k, k->nu[s], t->key[s]) < 0) return NO_MEMORY;
        }
        if (k->heap_len > 2 * (Py_ssize_t)k->records + 1024) heap_rebuild(k);
    }
    if (k->kind == KIND_BELADY_COMPUTE) return bc_release(k, k->freed, nfreed);
    return OK;
}

static int read_keys(Pool *k, PyObject *hashes, Py_ssize_t *n) {  /* a list of ints into keys[] */
    PyObject *seq = PySequence_Fast(hashes, "hashes must be a sequence of ints");
    if (!seq) return -1;
    *n = PySequence_Fast_GET_SIZE(seq);
    if (*n > k->capacity) { Py_DECREF(seq); return 1; }
    PyObject **items = PySequence_Fast_ITEMS(seq);
    for (Py_ssize_t i = 0; i < *n; i++) {
        if (i + AHEAD < *n) PREFETCH(items[i + AHEAD]);  /* a request's ints lie apart on the heap */
        k->keys[i] = PyLong_AsUnsignedLongLong(items[i]);
        if (k->keys[i] == (uint64_t)-1 && PyErr_Occurred()) { Py_DECREF(seq); return -1; }
    }
    Py_DECREF(seq);
    return 0;
}

static PyObject *refuse(int code, long a, long b) {
    PyObject *v = Py_BuildValue("(ill)", code, a, b);
    if (v) { PyErr_SetObject(Refused, v); Py_DECREF(v); }
    return NULL;
}

/* The exception for a code that is not OK (the GIL held): Refused for a refusal, else the failure. */
static PyObject *raise_status(int code, long a, long b) {
    switch (code) {
    case NO_MEMORY: return PyErr_NoMemory();
    case COSTS_SHORT: PyErr_SetString(PyExc_ValueError, "cost table shorter than the request (set_costs)"); return NULL;
    case POLICY_COSTS_SHORT: PyErr_SetString(PyExc_ValueError, "policy costs too short (set_policy_costs)"); return NULL;
    default: return refuse(code, a, b);
    }
}

/* Depths 0, 1, 2, ... as Python ints made once: every acquire hands back lists of depths (a cluster's
 * prompts run to hundreds of blocks), which then cost a reference each instead of an int to make and,
 * when the list goes, to free (both were about a tenth of a chat-preset cluster run). */
#define DEPTH_INTS_MAX (1 << 20)
static PyObject **depth_ints;
static Py_ssize_t n_depth_ints;

static int grow_depth_ints(Py_ssize_t n) {  /* depths below n (up to DEPTH_INTS_MAX) made; -1: no memory */
    if (n <= n_depth_ints || n_depth_ints >= DEPTH_INTS_MAX) return 0;
    Py_ssize_t size = n_depth_ints ? n_depth_ints : 1024;
    while (size < n && size < DEPTH_INTS_MAX) size *= 2;
    PyObject **grown = realloc(depth_ints, (size_t)size * sizeof(PyObject *));
    if (!grown) { PyErr_NoMemory(); return -1; }
    depth_ints = grown;
    for (; n_depth_ints < size; n_depth_ints++) {
        PyObject *v = PyLong_FromSsize_t(n_depth_ints);
        if (!v) return -1;
        depth_ints[n_depth_ints] = v;
    }
    return 0;
}

static inline PyObject *depth_int(Py_ssize_t v) {  /* a new reference to the int v */
    if (v >= 0 && v < n_depth_ints) { Py_INCREF(depth_ints[v]); return depth_ints[v]; }
    return PyLong_FromSsize_t(v);
}

static PyObject *int_list(const int32_t *v, Py_ssize_t n, const int32_t *index) {
    PyObject *out = PyList_New(n);
    for (Py_ssize_t j = 0; out && j < n; j++) {
        PyObject *x = depth_int(index ? index[v[j]] : v[j]);
        if (!x) { Py_DECREF(out); return NULL; }
        PyList_SET_ITEM(out, j, x);
    }
    return out;
}

static int read_uses(Pool *k, PyObject *uses, Py_ssize_t n) {  /* next uses, one per block */
    PyObject *seq = PySequence_Fast(uses, "next_use must be a sequence of floats");
    if (!seq) return -1;
    if (PySequence_Fast_GET_SIZE(seq) != n) {
        Py_DECREF(seq);
        PyErr_SetString(PyExc_ValueError, "next_use: one per block");
        return -1;
    }
    PyObject **items = PySequence_Fast_ITEMS(seq);
    for (Py_ssize_t i = 0; i < n; i++) {
        k->uses[i] = PyFloat_AsDouble(items[i]);
        if (k->uses[i] == -1.0 && PyErr_Occurred()) { Py_DECREF(seq); return -1; }
    }
    Py_DECREF(seq);
    return 0;
}

/* XXH3-64 of one little-endian u64 (its 4-to-8-byte path), as shared.hashing.xxh3_u64 with the
 * seed's flip constant (xxh3_flip) and prime given. */
static inline uint64_t xxh3_8(uint64_t v, uint64_t flip, uint64_t prime) {
    uint64_t h = (v >> 32) | (v << 32);
    h ^= flip;
    h ^= ((h << 49) | (h >> 15)) ^ ((h << 24) | (h >> 40));
    h *= prime;
    h ^= (h >> 35) + 8;
    h *= prime;
    return h ^ (h >> 28);
}

/* After a recorded acquisition of keys[0..n): SHARDS's sampled blocks appended, and the request's
 * end; -1 when out of memory (nothing appended: the caller raises). */
static int sample_keys(Pool *k, Py_ssize_t n) {
    if (!k->sampling) return 0;
    if (k->smp_reqs == k->smp_req_cap) {
        Py_ssize_t cap = k->smp_req_cap ? 2 * k->smp_req_cap : 1024;
        int64_t *e = realloc(k->smp_end, (size_t)cap * sizeof(int64_t));
        if (!e) return -1;
        k->smp_end = e; k->smp_req_cap = cap;
    }
    if (k->smp_len + n > k->smp_cap) {
        Py_ssize_t cap = k->smp_cap ? k->smp_cap : 4096;
        while (cap < k->smp_len + n) cap *= 2;
        uint64_t *a = realloc(k->smp_key, (size_t)cap * sizeof(uint64_t));
        if (!a) return -1;
        k->smp_key = a;
        uint64_t *b = realloc(k->smp_val, (size_t)cap * sizeof(uint64_t));
        if (!b) return -1;
        k->smp_val = b; k->smp_cap = cap;
    }
    Py_ssize_t len = k->smp_len;
    for (Py_ssize_t i = 0; i < n; i++) {
        uint64_t v = xxh3_8(k->keys[i], k->smp_flip, k->smp_prime) % k->smp_mod;
        if (v < k->smp_thr) { k->smp_key[len] = k->keys[i]; k->smp_val[len] = v; len++; }
    }
    k->smp_len = len;
    k->smp_end[k->smp_reqs++] = (int64_t)len;
    return 0;
}

/* acquire(hashes, session_code, input_tokens (-1: none), record, extra, next_use=None, position=None)
 * -> (hit_idx, new_idx, touched_idx, hole_lengths); Refused(code, shortfall, available) when it cannot. */
static PyObject *Pool_acquire(Pool *k, PyObject *args) {
    PyObject *hashes, *uses = Py_None, *position = Py_None;
    int32_t session, extra;
    long long tokens;
    int record;
    if (!PyArg_ParseTuple(args, "OiLpi|OO", &hashes, &session, &tokens, &record, &extra, &uses, &position))
        return NULL;
    if (session < 0 || extra < 0) { PyErr_SetString(PyExc_ValueError, "session and extra must be >= 0"); return NULL; }
    Py_ssize_t n;
    int r = read_keys(k, hashes, &n);
    if (r < 0) return NULL;
    if (r > 0) return refuse(TOO_LONG, (long)n, k->capacity);
    if (uses != Py_None && read_uses(k, uses, n) < 0) return NULL;
    k->next_use = uses != Py_None ? k->uses : NULL;
    double where = position != Py_None ? PyFloat_AsDouble(position) : 0.0;
    if (where == -1.0 && PyErr_Occurred()) return NULL;
    k->has_position = position != Py_None;
    k->next_position = where;
    int32_t out[2] = {0, 0};
    int code = acquire_one(k, n, session, tokens, record, extra, out);
    if (code != OK) return raise_status(code, out[0], out[1]);
    if (record && sample_keys(k, n) < 0) return PyErr_NoMemory();
    if (grow_depth_ints(n) < 0) return NULL;
    PyObject *hit = int_list(k->touched, k->nhits, NULL), *fresh = int_list(k->fresh, k->nfresh, NULL);
    PyObject *touched = int_list(k->touched, k->ntouched, NULL), *holes = int_list(k->hole_len, k->holes, NULL);
    if (!hit || !fresh || !touched || !holes) {
        Py_XDECREF(hit); Py_XDECREF(fresh); Py_XDECREF(touched); Py_XDECREF(holes);
        return NULL;
    }
    return Py_BuildValue("(NNNN)", hit, fresh, touched, holes);
}

static PyObject *Pool_release(Pool *k, PyObject *hashes) {
    Py_ssize_t n;
    int r = read_keys(k, hashes, &n);
    if (r < 0) return NULL;
    for (Py_ssize_t i = 0; i < AHEAD && i < n && !r; i++) table_prefetch(&k->res, k->keys[i]);
    for (Py_ssize_t i = 0; i < n; i++) {
        if (i + AHEAD < n && !r) table_prefetch(&k->res, k->keys[i + AHEAD]);
        int32_t s = r ? NIL : table_find(&k->res, k->keys[i]);
        if (s == NIL || k->refs[s] == 0) {
            PyErr_SetString(PyExc_ValueError, "release: a block that is not pinned");
            return NULL;
        }
        k->slot_of[i] = s;
    }
    int code = release_slots(k, k->slot_of, n);
    if (code != OK) return raise_status(code, 0, 0);
    Py_RETURN_NONE;
}

/* serve_one(hashes, session_code, record) -> None: BlockPool.serve of one request without input tokens
 * or extra blocks (a level's write from above), acquired then released with the slots the acquire
 * found, and no lists handed back; Refused(code, shortfall, available) as acquire. */
static PyObject *Pool_serve_one(Pool *k, PyObject *args) {
    PyObject *hashes;
    int32_t session;
    int record;
    if (!PyArg_ParseTuple(args, "Oip", &hashes, &session, &record)) return NULL;
    if (session < 0) { PyErr_SetString(PyExc_ValueError, "session must be >= 0"); return NULL; }
    Py_ssize_t n;
    int r = read_keys(k, hashes, &n);
    if (r < 0) return NULL;
    if (r > 0) return refuse(TOO_LONG, (long)n, k->capacity);
    k->next_use = NULL;
    k->has_position = 0;
    int32_t out[2] = {0, 0};
    int code = acquire_one(k, n, session, -1, record, 0, out);
    if (code != OK) return raise_status(code, out[0], out[1]);
    code = release_slots(k, k->slot_of, n);
    if (code != OK) return raise_status(code, 0, 0);
    if (record && sample_keys(k, n) < 0) return PyErr_NoMemory();
    Py_RETURN_NONE;
}

static PyObject *Pool_take_private(Pool *k, PyObject *arg) {
    long n = PyLong_AsLong(arg);
    if (n == -1 && PyErr_Occurred()) return NULL;
    if (n < 0 || n > k->capacity) { PyErr_SetString(PyExc_ValueError, "take_private: 0..capacity blocks"); return NULL; }
    int32_t shortfall = (int32_t)n - (k->capacity - k->res.used - k->private_blocks);
    if (shortfall > 0) {
        int32_t available = k->res.used - k->pinned;
        if (available < shortfall) return refuse(BUSY, shortfall, available);
        evict(k, shortfall);
    }
    k->private_blocks += (int32_t)n;
    Py_RETURN_NONE;
}

static PyObject *Pool_free_private(Pool *k, PyObject *arg) {
    long n = PyLong_AsLong(arg);
    if (n == -1 && PyErr_Occurred()) return NULL;
    if (n < 0 || n > k->private_blocks) { PyErr_SetString(PyExc_ValueError, "free_private: more than are held"); return NULL; }
    k->private_blocks -= (int32_t)n;
    Py_RETURN_NONE;
}

static PyObject *Pool_set_policy_costs(Pool *k, PyObject *costs) {  /* BeladyCompute's cost per depth */
    if (!k->bc) Py_RETURN_NONE;
    Py_buffer cb;
    if (PyObject_GetBuffer(costs, &cb, PyBUF_C_CONTIGUOUS | PyBUF_FORMAT) < 0) return NULL;
    double *c = cb.itemsize == 8 ? malloc((size_t)cb.len + 8) : NULL;
    if (!c) { PyBuffer_Release(&cb); return cb.itemsize == 8 ? PyErr_NoMemory() : (PyErr_SetString(PyExc_TypeError, "float64 expected"), NULL); }
    memcpy(c, cb.buf, (size_t)cb.len);
    free(k->bc->policy_cost);
    k->bc->policy_cost = c;
    k->bc->npolicy_cost = cb.len / 8;
    PyBuffer_Release(&cb);
    Py_RETURN_NONE;
}

static PyObject *Pool_set_costs(Pool *k, PyObject *cum) {
    if (load_costs(k, cum) < 0) return NULL;
    Py_RETURN_NONE;
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

/* BlockPool.store of h[0..total): a finished request's response blocks cached. Not a lookup (no hit
 * metrics): the blocks not resident, each at its first occurrence, are inserted while evictable room
 * lasts (shallowest first), as an acquisition of only new blocks inserts them (evicting through the
 * policy, which then hears of them), and released at once. Leaves the stored keys in keys[0..*m).
 * LRU and S3-FIFO (the wrapper keeps the oracles, whose stored blocks have no next use, on the
 * Python pool). Runs without the GIL in serve. */
static int store_run(Pool *k, const uint64_t *h, Py_ssize_t total, int32_t session, Py_ssize_t *m) {
    int32_t room = k->capacity - k->pinned - k->private_blocks;
    Py_ssize_t n = 0;
    for (Py_ssize_t i = 0; i < total && n < room; i++) {
        if (table_find(&k->res, h[i]) != NIL || seen_add(&k->scratch, h[i])) continue;
        k->keys[n++] = h[i];
    }
    seen_forget(&k->scratch);
    *m = n;
    if (!n) return OK;
    if (n >= k->ncum) return COSTS_SHORT;
    k->has_position = 0;
    k->next_use = NULL;
    int32_t busy[2];
    int code = acquire_one(k, n, session, -1, 0, 0, busy);  /* n <= room: never BUSY */
    return code == OK ? release_slots(k, k->slot_of, n) : code;
}

/* record_evicted(on): keep the keys each call evicts for take_evicted (a lower tier's feed). */
static PyObject *Pool_record_evicted(Pool *k, PyObject *on) {
    int v = PyObject_IsTrue(on);
    if (v < 0) return NULL;
    k->record_evicted = v;
    k->nevicted = 0;
    Py_RETURN_NONE;
}

/* take_evicted() -> the keys evicted since the last take, in eviction order. */
static PyObject *Pool_take_evicted(Pool *k, PyObject *Py_UNUSED(ignored)) {
    PyObject *out = PyList_New(k->nevicted);
    for (Py_ssize_t i = 0; out && i < k->nevicted; i++) {
        PyObject *v = PyLong_FromUnsignedLongLong(k->ev_keys[i]);
        if (!v) { Py_CLEAR(out); break; }
        PyList_SET_ITEM(out, i, v);
    }
    k->nevicted = 0;
    return out;
}

/* The n ints of a PySequence_Fast as keys, in a buffer to free(); NULL with the error set. The loops
 * over them then ask for their buckets ahead (table_prefetch). */
static uint64_t *seq_keys(PyObject *seq, Py_ssize_t n) {
    uint64_t *h = malloc((size_t)(n ? n : 1) * sizeof(uint64_t));
    if (!h) { PyErr_NoMemory(); return NULL; }
    PyObject **items = PySequence_Fast_ITEMS(seq);
    for (Py_ssize_t i = 0; i < n; i++) {
        if (i + AHEAD < n) PREFETCH(items[i + AHEAD]);
        h[i] = PyLong_AsUnsignedLongLong(items[i]);
        if (h[i] == (uint64_t)-1 && PyErr_Occurred()) { free(h); return NULL; }
    }
    return h;
}

/* sequence_keys(hashes, &n): the keys of a sequence of ints, in a buffer to free(); NULL with the error set. */
static uint64_t *sequence_keys(PyObject *hashes, Py_ssize_t *n) {
    PyObject *seq = PySequence_Fast(hashes, "hashes must be a sequence of ints");
    if (!seq) return NULL;
    *n = PySequence_Fast_GET_SIZE(seq);
    uint64_t *h = seq_keys(seq, *n);
    Py_DECREF(seq);
    return h;
}

static inline void prefetch_ahead(const Table *t, const uint64_t *h, Py_ssize_t i, Py_ssize_t n) {
    if (i == 0) for (Py_ssize_t j = 0; j < AHEAD && j < n; j++) table_prefetch(t, h[j]);
    if (i + AHEAD < n) table_prefetch(t, h[i + AHEAD]);
}

/* missing(hashes) -> the depths of the blocks not resident (BlockPool.missing). */
static PyObject *Pool_missing(Pool *k, PyObject *hashes) {
    Py_ssize_t n;
    uint64_t *h = sequence_keys(hashes, &n);
    if (!h) return NULL;
    PyObject *out = grow_depth_ints(n) < 0 ? NULL : PyList_New(0);
    for (Py_ssize_t i = 0; out && i < n; i++) {
        prefetch_ahead(&k->res, h, i, n);
        if (table_find(&k->res, h[i]) != NIL) continue;
        PyObject *v = depth_int(i);
        if (!v || PyList_Append(out, v) < 0) { Py_XDECREF(v); Py_CLEAR(out); break; }
        Py_DECREF(v);
    }
    free(h);
    return out;
}

/* pins_of(hashes) -> [running requests holding each block, 0 where none or not resident] (BlockPool.pins_of). */
static PyObject *Pool_pins_of(Pool *k, PyObject *hashes) {
    PyObject *seq = PySequence_Fast(hashes, "hashes must be a sequence of ints");
    if (!seq) return NULL;
    Py_ssize_t n = PySequence_Fast_GET_SIZE(seq);
    PyObject *out = PyList_New(n);
    PyObject **items = PySequence_Fast_ITEMS(seq);
    for (Py_ssize_t i = 0; out && i < n; i++) {
        uint64_t h = PyLong_AsUnsignedLongLong(items[i]);
        if (h == (uint64_t)-1 && PyErr_Occurred()) { Py_CLEAR(out); break; }
        int32_t s = table_find(&k->res, h);
        PyObject *v = PyLong_FromLong(s == NIL ? 0 : k->refs[s]);
        if (!v) { Py_CLEAR(out); break; }
        PyList_SET_ITEM(out, i, v);
    }
    Py_DECREF(seq);
    return out;
}

/* remove(hashes, computed=True): BlockPool.remove, the unpinned resident blocks of hashes leave (a
 * block promoted out of a lower tier): out of the policy's order (LRUPolicy / S3FIFOPolicy.on_remove:
 * no ghost entry, no counter kept), footprints shrink, never-reused ones count as one-hit if
 * computed; no eviction is counted. LRU and S3-FIFO (the policies a tier level may have). */
static PyObject *Pool_remove(Pool *k, PyObject *args) {
    PyObject *hashes;
    int computed = 1;
    if (!PyArg_ParseTuple(args, "O|p", &hashes, &computed)) return NULL;
    if (k->kind > KIND_S3FIFO) { PyErr_SetString(PyExc_ValueError, "remove: LRU and S3-FIFO only"); return NULL; }
    Py_ssize_t n;
    uint64_t *h = sequence_keys(hashes, &n);
    if (!h) return NULL;
    Table *t = &k->res;
    for (Py_ssize_t i = 0; i < n; i++) {
        prefetch_ahead(t, h, i, n);
        int32_t s = table_find(t, h[i]);
        if (s == NIL || k->refs[s]) continue;
        if (k->queue[s] == Q_SMALL) list_unlink(t, &k->order, s);
        else if (k->queue[s] == Q_MAIN) list_unlink(t, &k->main, s);
        k->queue[s] = Q_NONE;
        k->freq[s] = NOT_TRACKED;
        k->fp_count[k->owner[s]]--;
        if (computed && !k->reused[s]) k->one_hit++;
        table_del(t, s);
    }
    free(h);
    Py_RETURN_NONE;
}

/* h in pool: resident (a tier's membership test, as `h in BlockPool.resident`). */
static int Pool_contains(Pool *k, PyObject *key) {
    if (!PyLong_Check(key)) return 0;
    uint64_t h = PyLong_AsUnsignedLongLong(key);
    if (h == (uint64_t)-1 && PyErr_Occurred()) { PyErr_Clear(); return 0; }  /* not a u64: never resident */
    return table_find(&k->res, h) != NIL;
}

static PySequenceMethods Pool_as_sequence = {.sq_contains = (objobjproc)Pool_contains};

/* store(hashes, session_code) -> the hashes stored (BlockPool.store). */
static PyObject *Pool_store(Pool *k, PyObject *args) {
    PyObject *hashes;
    int32_t session;
    if (!PyArg_ParseTuple(args, "Oi", &hashes, &session)) return NULL;
    if (session < 0) { PyErr_SetString(PyExc_ValueError, "session must be >= 0"); return NULL; }
    if (k->kind > KIND_S3FIFO) { PyErr_SetString(PyExc_ValueError, "store: LRU and S3-FIFO only"); return NULL; }
    PyObject *seq = PySequence_Fast(hashes, "hashes must be a sequence of ints");
    if (!seq) return NULL;
    Py_ssize_t total = PySequence_Fast_GET_SIZE(seq), m = 0;
    uint64_t *h = malloc((size_t)(total ? total : 1) * sizeof(uint64_t));
    if (!h) { Py_DECREF(seq); return PyErr_NoMemory(); }
    PyObject **items = PySequence_Fast_ITEMS(seq);
    for (Py_ssize_t i = 0; i < total; i++) {
        h[i] = PyLong_AsUnsignedLongLong(items[i]);
        if (h[i] == (uint64_t)-1 && PyErr_Occurred()) { free(h); Py_DECREF(seq); return NULL; }
    }
    Py_DECREF(seq);
    if (grow_sessions(k, session) != OK) { free(h); return PyErr_NoMemory(); }
    int code = store_run(k, h, total, session, &m);
    free(h);
    if (code != OK) return raise_status(code, 0, 0);
    PyObject *out = PyList_New(m);
    for (Py_ssize_t j = 0; out && j < m; j++) {
        PyObject *v = PyLong_FromUnsignedLongLong(k->keys[j]);
        if (!v) { Py_DECREF(out); return NULL; }
        PyList_SET_ITEM(out, j, v);
    }
    return out;
}

/* serve(hashes u64, offsets i64, sessions i32, input_tokens i64 (-1: none), next uses f64 or None,
 * start, stop, response hashes u64 or None, response offsets i64 or None): requests [start, stop)
 * one at a time, each acquired then released (BlockPool.serve), then its response blocks stored
 * (BlockPool.store) where they are given; returns the index of the first one not served (stop when
 * all were): the wrapper serves that one. */
static PyObject *Pool_serve(Pool *k, PyObject *args) {
    PyObject *o[7] = {NULL, NULL, NULL, NULL, NULL, Py_None, Py_None};
    Py_ssize_t start, stop;
    if (!PyArg_ParseTuple(args, "OOOOOnn|OO", &o[0], &o[1], &o[2], &o[3], &o[4], &start, &stop, &o[5], &o[6]))
        return NULL;
    static const char *what[7] = {"hashes", "offsets", "sessions", "input_tokens", "next_use", "responses",
                                  "response_offsets"};
    static const Py_ssize_t size[7] = {8, 8, 4, 8, 8, 8, 8};
    Py_buffer b[7];
    int held[7] = {0};
    int failed = OK;
    PyObject *result = NULL;
    if ((o[5] == Py_None) != (o[6] == Py_None)) {
        PyErr_SetString(PyExc_ValueError, "serve: responses and response_offsets go together");
        return NULL;
    }
    for (int i = 0; i < 7; i++) {
        if (o[i] == Py_None) continue;
        if (get_buffer(o[i], &b[i], what[i], size[i]) < 0) goto done;
        held[i] = 1;
    }
    if (k->record_evicted) {  /* a lower tier hears of every eviction: one call a request, through acquire */
        PyErr_SetString(PyExc_ValueError, "serve: not with a lower tier (record_evicted)");
        goto done;
    }
    if (held[5] && k->kind > KIND_S3FIFO) {
        PyErr_SetString(PyExc_ValueError, "serve: responses are stored for LRU and S3-FIFO only");
        goto done;
    }
    const uint64_t *hashes = b[0].buf, *resp = held[5] ? b[5].buf : NULL;
    const int64_t *off = b[1].buf, *tokens = b[3].buf, *roff = held[6] ? b[6].buf : NULL;
    const int32_t *sess = b[2].buf;
    Py_ssize_t nreq = b[1].len / 8 - 1;
    const double *uses = held[4] ? b[4].buf : NULL;
    if (start < 0 || stop > nreq || start > stop || b[2].len / 4 < nreq || b[3].len / 8 < nreq
        || (uses && b[4].len < b[0].len) || (roff && b[6].len / 8 < nreq + 1)) {
        PyErr_SetString(PyExc_ValueError, "serve: start/stop or array lengths do not match");
        goto done;
    }
    for (Py_ssize_t r = start; roff && r < stop; r++)
        if (roff[r] < 0 || roff[r + 1] < roff[r] || roff[r + 1] * 8 > b[5].len) {
            PyErr_SetString(PyExc_ValueError, "serve: response offsets out of order or past the responses");
            goto done;
        }
    int32_t max_session = 0;
    for (Py_ssize_t r = start; r < stop; r++) if (sess[r] > max_session) max_session = sess[r];
    if (grow_sessions(k, max_session) != OK) { PyErr_NoMemory(); goto done; }
    Py_ssize_t r = start;
    Py_BEGIN_ALLOW_THREADS
    for (; r < stop; r++) {
        Py_ssize_t n = off[r + 1] - off[r];
        int32_t out[2];
        if (n < 0 || n > k->capacity || n >= k->ncum || off[r + 1] * 8 > b[0].len || sess[r] < 0 || k->pinned || k->private_blocks)
            break;
        memcpy(k->keys, hashes + off[r], (size_t)n * sizeof(uint64_t));
        k->next_use = uses ? uses + off[r] : NULL;
        k->has_position = uses != NULL;  /* NextUses.position: where the request starts */
        k->next_position = (double)off[r];
        int code = acquire_one(k, n, sess[r], tokens[r], 1, 0, out);
        if (code != OK) {  /* a refusal: the wrapper serves this one through acquire, which raises it */
            if (code > BUSY) failed = code;
            break;
        }
        code = release_slots(k, k->slot_of, n);
        if (code == OK && resp) {
            Py_ssize_t m;
            code = store_run(k, resp + roff[r], roff[r + 1] - roff[r], sess[r], &m);
        }
        if (code != OK) { failed = code; r++; break; }
    }
    Py_END_ALLOW_THREADS
    /* codes only above: Python's error state is set here, with the GIL held again */
    result = failed != OK ? raise_status(failed, 0, 0) : PyLong_FromSsize_t(r);
done:
    for (int i = 0; i < 7; i++) if (held[i]) PyBuffer_Release(&b[i]);
    return result;
}

static PyObject *keys_of(Table *t, List *l) {  /* a list's keys, from its eviction end (what the Python deques keep leftmost) */
    PyObject *out = PyList_New(0);
    if (!out) return NULL;
    for (int32_t s = l->evict_end; s != NIL; s = t->links[s].next) {
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

static int set_int(PyObject *d, PyObject *key, long long v) {
    PyObject *x = PyLong_FromLongLong(v);
    int r = x ? PyDict_SetItem(d, key, x) : -1;
    Py_XDECREF(x);
    return r;
}

/* What a policy keeps per block, under its own name in state(): S3-FIFO's counters (counter | IN_MAIN),
 * Belady's recorded next uses, BeladyCompute's records (next use, depth); LRU keeps nothing. */
static const char *per_block_name(int kind) {
    return kind == KIND_S3FIFO ? "counters" : kind == KIND_BELADY ? "next_use" : kind == KIND_BELADY_COMPUTE ? "records"
                                                                                                            : NULL;
}

/* The resident blocks (by insertion) with owners and the reused ones, pins, what the policy keeps per block. */
static PyObject *blocks_state(Pool *k) {
    Table *t = &k->res;
    int32_t used = t->used, m = 0;
    SeqSlot *rows = malloc(((size_t)used + 1) * sizeof(SeqSlot));
    if (!rows) return PyErr_NoMemory();
    for (int32_t s = 0; s < t->slots && m < used; s++)  /* live slots: the table points at them */
        if (table_find(t, t->key[s]) == s) { rows[m].seq = k->seq[s]; rows[m].slot = s; m++; }
    qsort(rows, (size_t)m, sizeof(SeqSlot), by_seq);
    PyObject *keys = PyList_New(m), *owners = PyList_New(m), *reused = PyList_New(0), *per_block = PyDict_New();
    PyObject *refs = PyDict_New(), *out = NULL;
    if (!keys || !owners || !reused || !per_block || !refs) goto fail;
    for (int32_t j = 0; j < m; j++) {
        int32_t s = rows[j].slot;
        PyObject *key = PyLong_FromUnsignedLongLong(t->key[s]), *owner = PyLong_FromLong(k->owner[s]);
        if (!key || !owner) { Py_XDECREF(key); Py_XDECREF(owner); goto fail; }
        PyList_SET_ITEM(keys, j, key);
        PyList_SET_ITEM(owners, j, owner);
        if (k->reused[s] && PyList_Append(reused, key) < 0) goto fail;
        if (k->refs[s] && set_int(refs, key, k->refs[s]) < 0) goto fail;
        if (k->kind == KIND_S3FIFO && k->freq[s] != NOT_TRACKED && set_int(per_block, key, k->freq[s]) < 0) goto fail;
        if (k->kind >= KIND_BELADY && k->has_rec[s]) {  /* its next use (and depth) */
            PyObject *t = k->kind == KIND_BELADY ? PyFloat_FromDouble(k->nu[s])
                                                 : Py_BuildValue("(di)", k->nu[s], k->depth[s]);
            if (!t || PyDict_SetItem(per_block, key, t) < 0) { Py_XDECREF(t); goto fail; }
            Py_DECREF(t);
        }
    }
    out = Py_BuildValue("{sOsOsOsO}", "keys", keys, "owners", owners, "reused", reused, "refs", refs);
    const char *name = per_block_name(k->kind);
    if (out && name && PyDict_SetItemString(out, name, per_block) < 0) Py_CLEAR(out);
fail:
    free(rows);
    Py_XDECREF(keys); Py_XDECREF(owners); Py_XDECREF(reused); Py_XDECREF(per_block); Py_XDECREF(refs);
    return out;
}

static PyObject *footprints(Pool *k) {  /* (code, blocks) in the order a dict keeps them: by entry */
    Py_ssize_t live = 0;
    for (Py_ssize_t c = 0; c < k->fp_size; c++) live += k->fp_count[c] > 0;
    SeqSlot *fp = malloc(((size_t)live + 1) * sizeof(SeqSlot));
    if (!fp) return PyErr_NoMemory();
    live = 0;
    for (Py_ssize_t c = 0; c < k->fp_size; c++)
        if (k->fp_count[c] > 0) { fp[live].seq = k->fp_entry[c]; fp[live].slot = (int32_t)c; live++; }
    qsort(fp, (size_t)live, sizeof(SeqSlot), by_seq);
    PyObject *out = PyList_New(live);
    for (Py_ssize_t j = 0; out && j < live; j++) {
        PyObject *x = Py_BuildValue("(iL)", fp[j].slot, (long long)k->fp_count[fp[j].slot]);
        if (!x) { Py_CLEAR(out); break; }
        PyList_SET_ITEM(out, j, x);
    }
    free(fp);
    return out;
}

static PyObject *metrics_state(Pool *k) {  /* PoolMetrics' fields */
    PyObject *holes = PyDict_New(), *lengths = PyDict_New();
    for (int32_t h = 0; holes && h <= k->capacity; h++)
        if (k->holes_hist[h]) {
            PyObject *key = PyLong_FromLong(h);
            if (!key || set_int(holes, key, k->holes_hist[h]) < 0) { Py_XDECREF(key); Py_CLEAR(holes); break; }
            Py_DECREF(key);
        }
    for (int j = 0; lengths && j < 65; j++)
        if (k->hole_len_log2[j]) {
            PyObject *key = PyLong_FromLong(j);
            if (!key || set_int(lengths, key, k->hole_len_log2[j]) < 0) { Py_XDECREF(key); Py_CLEAR(lengths); break; }
            Py_DECREF(key);
        }
    if (!holes || !lengths) { Py_XDECREF(holes); Py_XDECREF(lengths); return NULL; }
    return Py_BuildValue("{sLsLsLsLsLsLsdsdsLsLsLsLsNsNsL}", "requests", k->requests, "block_accesses",
                         k->block_accesses, "block_hits", k->block_hits, "prefix_hit_blocks", k->prefix_hit_blocks,
                         "tokens_queried", k->tokens_queried, "tokens_hit", k->tokens_hit, "cost_total", k->cost_total,
                         "cost_hit", k->cost_hit, "inserted", k->inserted, "evictions", k->evictions,
                         "one_hit_evictions", k->one_hit, "holes_total", k->holes_total, "holes_per_request", holes,
                         "hole_length_log2", lengths, "hole_blocks", k->hole_blocks);
}

/* state() -> dict: what the Python pool, its policy and its metrics hold after the same calls. */
static PyObject *Pool_state(Pool *k, PyObject *Py_UNUSED(ignored)) {
    PyObject *blocks = blocks_state(k), *foot = footprints(k), *metrics = metrics_state(k);
    PyObject *order = keys_of(&k->res, &k->order);
    PyObject *mainq = k->kind == KIND_S3FIFO ? keys_of(&k->res, &k->main) : PyList_New(0);
    PyObject *ghost = keys_of(&k->ghost, &k->ghost_fifo), *out = NULL;
    if (blocks && foot && metrics && order && mainq && ghost) {
        out = blocks;
        Py_INCREF(out);
        if (PyDict_SetItemString(out, "footprint", foot) < 0 || PyDict_SetItemString(out, "metrics", metrics) < 0
            || PyDict_SetItemString(out, "order", order) < 0 || PyDict_SetItemString(out, "main", mainq) < 0
            || PyDict_SetItemString(out, "ghost", ghost) < 0
            || PyDict_SetItemString(out, "evicted", k->evicted ? Py_True : Py_False) < 0)
            Py_CLEAR(out);
    }
    Py_XDECREF(blocks); Py_XDECREF(foot); Py_XDECREF(metrics); Py_XDECREF(order); Py_XDECREF(mainq);
    Py_XDECREF(ghost);
    return out;
}

/* The hashes not resident, in order (the objects given); the keys of the first room of them left in
 * keys[0..), and how many there were in *m. NULL with the error set. */
static PyObject *absent_of(Pool *k, PyObject *hashes, Py_ssize_t room, Py_ssize_t *m) {
    PyObject *seq = PySequence_Fast(hashes, "hashes must be a sequence of ints");
    if (!seq) return NULL;
    Py_ssize_t n = PySequence_Fast_GET_SIZE(seq);
    uint64_t *h = seq_keys(seq, n);
    PyObject *out = h ? PyList_New(0) : NULL;
    PyObject **items = PySequence_Fast_ITEMS(seq);
    *m = 0;
    for (Py_ssize_t i = 0; out && i < n; i++) {
        prefetch_ahead(&k->res, h, i, n);
        if (table_find(&k->res, h[i]) != NIL) continue;
        if (PyList_Append(out, items[i]) < 0) { Py_CLEAR(out); break; }
        if (*m < room) k->keys[*m] = h[i];
        (*m)++;
    }
    free(h);
    Py_DECREF(seq);
    return out;
}

/* absent(hashes) -> the hashes not resident, in order (what a tier level would newly store). */
static PyObject *Pool_absent(Pool *k, PyObject *hashes) {
    Py_ssize_t m;
    return absent_of(k, hashes, 0, &m);
}

/* admit_absent(hashes, session_code) -> the hashes not resident, in order (the objects given), of which
 * the first capacity - pinned are then written in as serve_one does: BlockPool.admit_absent, a tier
 * level's write from above in one pass over the level's table (the keys converted once).
 * Refused(code, shortfall, available) as serve_one, before anything changes. */
static PyObject *Pool_admit_absent(Pool *k, PyObject *args) {
    PyObject *hashes;
    int32_t session;
    if (!PyArg_ParseTuple(args, "Oi", &hashes, &session)) return NULL;
    if (session < 0) { PyErr_SetString(PyExc_ValueError, "session must be >= 0"); return NULL; }
    Py_ssize_t room = k->capacity - k->pinned, m;
    PyObject *out = absent_of(k, hashes, room, &m);
    if (!out) return NULL;
    Py_ssize_t take = m < room ? m : room;
    if (take > 0) {
        k->next_use = NULL;
        k->has_position = 0;
        int32_t busy[2] = {0, 0};
        int code = acquire_one(k, take, session, -1, 1, 0, busy);
        if (code == OK) code = release_slots(k, k->slot_of, take);
        if (code != OK) { Py_DECREF(out); return raise_status(code, busy[0], busy[1]); }
        if (sample_keys(k, take) < 0) { Py_DECREF(out); return PyErr_NoMemory(); }
    }
    return out;
}

/* sample(flip, prime, modulus, threshold): from now on, recorded acquisitions keep SHARDS's sample
 * (ShardsTracker: a block is sampled iff its xxh3 value mod modulus is below threshold). */
static PyObject *Pool_sample(Pool *k, PyObject *args) {
    unsigned long long flip, prime, mod, thr;
    if (!PyArg_ParseTuple(args, "KKKK", &flip, &prime, &mod, &thr)) return NULL;
    if (mod == 0) { PyErr_SetString(PyExc_ValueError, "sample: modulus must be positive"); return NULL; }
    k->sampling = 1;
    k->smp_flip = flip; k->smp_prime = prime; k->smp_mod = mod; k->smp_thr = thr;
    Py_RETURN_NONE;
}

/* take_samples() -> (keys, values, ends): the sampled blocks' keys and values (native u64) and, per
 * recorded acquisition since the last take, how many were sampled up to its end (native i64). */
static PyObject *Pool_take_samples(Pool *k, PyObject *Py_UNUSED(ignored)) {
    static const char none[1] = "";  /* y# makes None of NULL: nothing sampled yet is empty bytes */
    PyObject *out = Py_BuildValue("(y#y#y#)", k->smp_key ? (const char *)k->smp_key : none,
                                  (Py_ssize_t)(k->smp_len * 8), k->smp_val ? (const char *)k->smp_val : none,
                                  (Py_ssize_t)(k->smp_len * 8), k->smp_end ? (const char *)k->smp_end : none,
                                  (Py_ssize_t)(k->smp_reqs * 8));
    if (out) k->smp_len = k->smp_reqs = 0;
    return out;
}

static PyObject *Pool_get_used(Pool *k, void *c) { (void)c; return PyLong_FromLong(k->res.used); }
static PyObject *Pool_get_pinned(Pool *k, void *c) { (void)c; return PyLong_FromLong(k->pinned); }
static PyObject *Pool_get_private(Pool *k, void *c) { (void)c; return PyLong_FromLong(k->private_blocks); }

static PyGetSetDef Pool_getset[] = {
    {"used", (getter)Pool_get_used, NULL, "resident blocks", NULL},
    {"pinned", (getter)Pool_get_pinned, NULL, "blocks held by running requests", NULL},
    {"private", (getter)Pool_get_private, NULL, "unhashed blocks held (decode KV)", NULL},
    {NULL, NULL, NULL, NULL, NULL},
};

static PyMethodDef Pool_methods[] = {
    {"acquire", (PyCFunction)Pool_acquire, METH_VARARGS, "BlockPool.acquire: (hit_idx, new_idx, touched_idx, hole_lengths)."},
    {"release", (PyCFunction)Pool_release, METH_O, "BlockPool.release of these hashes."},
    {"serve_one", (PyCFunction)Pool_serve_one, METH_VARARGS, "BlockPool.admit: (hashes, session_code, record)."},
    {"take_private", (PyCFunction)Pool_take_private, METH_O, "BlockPool.take_private."},
    {"free_private", (PyCFunction)Pool_free_private, METH_O, "BlockPool.free_private."},
    {"set_policy_costs", (PyCFunction)Pool_set_policy_costs, METH_O, "BeladyCompute's recompute cost per depth (float64)."},
    {"set_costs", (PyCFunction)Pool_set_costs, METH_O, "Recompute costs of the first d blocks, d = 0, 1, ... (float64)."},
    {"serve", (PyCFunction)Pool_serve, METH_VARARGS, "BlockPool.serve of requests [start, stop), each then storing its"
     " response blocks where given; the first not served."},
    {"store", (PyCFunction)Pool_store, METH_VARARGS, "BlockPool.store: (hashes, session_code) -> the hashes stored."},
    {"pins_of", (PyCFunction)Pool_pins_of, METH_O, "BlockPool.pins_of: running requests holding each block."},
    {"missing", (PyCFunction)Pool_missing, METH_O, "BlockPool.missing: depths of the blocks not resident."},
    {"absent", (PyCFunction)Pool_absent, METH_O, "The hashes not resident, in order."},
    {"sample", (PyCFunction)Pool_sample, METH_VARARGS,
     "(flip, prime, modulus, threshold): recorded acquisitions keep SHARDS's sample from now on."},
    {"take_samples", (PyCFunction)Pool_take_samples, METH_NOARGS,
     "-> (keys, values, ends) since the last take: sampled blocks (u64), and per acquisition the count so far (i64)."},
    {"admit_absent", (PyCFunction)Pool_admit_absent, METH_VARARGS,
     "BlockPool.admit_absent: (hashes, session_code) -> the hashes not resident; as many as fit written in."},
    {"remove", (PyCFunction)Pool_remove, METH_VARARGS, "BlockPool.remove: (hashes, computed=True); LRU and S3-FIFO."},
    {"record_evicted", (PyCFunction)Pool_record_evicted, METH_O, "Keep each call's evicted keys (a lower tier's feed)."},
    {"take_evicted", (PyCFunction)Pool_take_evicted, METH_NOARGS, "The keys evicted since the last take."},
    {"state", (PyCFunction)Pool_state, METH_NOARGS, "The pool's, policy's and metrics' state, for the write-back."},
    {NULL, NULL, 0, NULL},
};

static PyTypeObject PoolType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "replica.core.compiled._pool.Pool",
    .tp_basicsize = sizeof(Pool),
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = "A block pool with LRU, S3-FIFO, Belady or BeladyCompute (see replica/core/compiled/pool.py).",
    .tp_new = PyType_GenericNew,
    .tp_init = (initproc)Pool_init,
    .tp_dealloc = (destructor)Pool_dealloc,
    .tp_methods = Pool_methods,
    .tp_getset = Pool_getset,
    .tp_as_sequence = &Pool_as_sequence,
};

/* prefix_matches(pools, hashes) -> [leading blocks of hashes resident in each pool]: BlockPool.prefix_match
 * over several pools in one call (the simulator's exact index: what an index fed every pool's events
 * answers, asked of the pools themselves). */
static inline int to_key(PyObject *o, uint64_t *key) {  /* 0, or -1 with the error set */
    *key = PyLong_AsUnsignedLongLong(o);
    return *key == (uint64_t)-1 && PyErr_Occurred() ? -1 : 0;
}

static PyObject *prefix_matches(PyObject *self, PyObject *args) {
    (void)self;
    PyObject *pools, *hashes;
    if (!PyArg_ParseTuple(args, "OO", &pools, &hashes)) return NULL;
    PyObject *ps = PySequence_Fast(pools, "pools must be a sequence of Pool");
    if (!ps) return NULL;
    PyObject *hs = PySequence_Fast(hashes, "hashes must be a sequence of ints");
    if (!hs) { Py_DECREF(ps); return NULL; }
    Py_ssize_t np = PySequence_Fast_GET_SIZE(ps), n = PySequence_Fast_GET_SIZE(hs);
    PyObject *out = PyList_New(np);
    uint64_t *h = malloc((size_t)(n ? n : 1) * sizeof(uint64_t));
    if (!out || !h) { Py_XDECREF(out); free(h); Py_DECREF(ps); Py_DECREF(hs); return PyErr_NoMemory(); }
    PyObject **items = PySequence_Fast_ITEMS(hs);
    Py_ssize_t read = 0;  /* keys converted so far: as far as some pool's prefix reaches, a batch ahead */
    for (Py_ssize_t j = 0; j < np; j++) {
        PyObject *o = PySequence_Fast_GET_ITEM(ps, j);
        if (!PyObject_TypeCheck(o, &PoolType)) { PyErr_SetString(PyExc_TypeError, "pools must be Pool objects"); goto fail; }
        const Table *t = &((Pool *)o)->res;
        Py_ssize_t i = 0;
        for (; i < n; i++) {
            for (; read < n && read <= i + AHEAD; read++)
                if (to_key(items[read], &h[read]) < 0) goto fail;
            if (i == 0) for (Py_ssize_t a = 1; a < read; a++) table_prefetch(t, h[a]);
            else if (i + AHEAD < read) table_prefetch(t, h[i + AHEAD]);
            if (table_find(t, h[i]) == NIL) break;
        }
        PyObject *v = depth_int(i);
        if (!v) goto fail;
        PyList_SET_ITEM(out, j, v);
    }
    free(h); Py_DECREF(ps); Py_DECREF(hs);
    return out;
fail:
    free(h); Py_DECREF(ps); Py_DECREF(hs); Py_DECREF(out);
    return NULL;
}

/* Reads pools (a sequence of Pool) and hashes into the arrays given: 0, or -1 with the error set. */
/* The pools and hashes as PySequence_Fast (the keys are converted where a query reaches them). */
static int read_pools_and_keys(PyObject *pools, PyObject *hashes, PyObject **ps, PyObject **hs) {
    *ps = PySequence_Fast(pools, "pools must be a sequence of Pool");
    if (!*ps) return -1;
    *hs = PySequence_Fast(hashes, "hashes must be a sequence of ints");
    if (!*hs) { Py_CLEAR(*ps); return -1; }
    for (Py_ssize_t j = 0; j < PySequence_Fast_GET_SIZE(*ps); j++)
        if (!PyObject_TypeCheck(PySequence_Fast_GET_ITEM(*ps, j), &PoolType)) {
            PyErr_SetString(PyExc_TypeError, "pools must be Pool objects");
            goto fail;
        }
    return 0;
fail:
    Py_CLEAR(*ps); Py_CLEAR(*hs);
    return -1;
}

static inline void prefetch_in_pools(PyObject *ps, Py_ssize_t np, uint64_t key) {
    for (Py_ssize_t j = 0; j < np; j++) table_prefetch(&((Pool *)PySequence_Fast_GET_ITEM(ps, j))->res, key);
}

static inline Py_ssize_t first_holder(PyObject *ps, Py_ssize_t np, uint64_t key) {  /* -1: none holds it */
    for (Py_ssize_t j = 0; j < np; j++)
        if (table_find(&((Pool *)PySequence_Fast_GET_ITEM(ps, j))->res, key) != NIL) return j;
    return -1;
}

/* level_runs(pools, hashes, depths) -> [(pool position, first depth, end depth)]: the runs of consecutive
 * depths (ascending) whose blocks one pool holds, the first pool that holds a block taking it
 * (TierStack's runs of missing blocks per lower level, over the levels' compiled pools). */
static PyObject *level_runs(PyObject *self, PyObject *args) {
    (void)self;
    PyObject *pools, *hashes, *depths, *ps, *hs, *out = NULL, *ds = NULL;
    Py_ssize_t *d = NULL;
    uint64_t *h = NULL;
    if (!PyArg_ParseTuple(args, "OOO", &pools, &hashes, &depths)) return NULL;
    if (read_pools_and_keys(pools, hashes, &ps, &hs) < 0) return NULL;
    ds = PySequence_Fast(depths, "depths must be a sequence of ints");
    if (!ds) goto done;
    Py_ssize_t np = PySequence_Fast_GET_SIZE(ps), n = PySequence_Fast_GET_SIZE(hs), nd = PySequence_Fast_GET_SIZE(ds);
    d = malloc((size_t)(nd + 1) * sizeof(Py_ssize_t));
    h = malloc((size_t)(nd + 1) * sizeof(uint64_t));
    if (!d || !h) { PyErr_NoMemory(); goto done; }
    for (Py_ssize_t j = 0; j < nd; j++) {  /* the depths and their keys first, then the lookups (as lower_counts) */
        d[j] = PyLong_AsSsize_t(PySequence_Fast_GET_ITEM(ds, j));
        if (d[j] == -1 && PyErr_Occurred()) goto done;
        if (d[j] < 0 || d[j] >= n) { PyErr_SetString(PyExc_IndexError, "level_runs: a depth past the hashes"); goto done; }
        if (to_key(PySequence_Fast_GET_ITEM(hs, d[j]), &h[j]) < 0) goto done;
    }
    for (Py_ssize_t j = 0; j < AHEAD && j < nd; j++) prefetch_in_pools(ps, np, h[j]);
    out = PyList_New(0);
    Py_ssize_t run_pool = -1, run_start = 0, run_end = -1;
    for (Py_ssize_t j = 0; out && j <= nd; j++) {
        Py_ssize_t i = -1, p = -1;
        if (j < nd) {
            if (j + AHEAD < nd) prefetch_in_pools(ps, np, h[j + AHEAD]);
            i = d[j];
            p = first_holder(ps, np, h[j]);
            if (p < 0) continue;
            if (p == run_pool && i == run_end) { run_end++; continue; }
        }
        if (run_pool >= 0) {  /* the run before this block ends */
            PyObject *t = Py_BuildValue("(nnn)", run_pool, run_start, run_end);
            if (!t || PyList_Append(out, t) < 0) { Py_XDECREF(t); Py_CLEAR(out); break; }
            Py_DECREF(t);
        }
        run_pool = p; run_start = i; run_end = i + 1;
    }
done:
    free(d); free(h);
    Py_XDECREF(ps); Py_XDECREF(hs); Py_XDECREF(ds);
    return out;
}

/* lower_counts(pools, hashes, start) -> [blocks per pool]: the run of hashes from start that some pool
 * holds, each block counted for the first pool that holds it (shared.index.base.lower_overlap's counts). */
static PyObject *lower_counts(PyObject *self, PyObject *args) {
    (void)self;
    PyObject *pools, *hashes, *ps, *hs, *out = NULL;
    Py_ssize_t start;
    if (!PyArg_ParseTuple(args, "OOn", &pools, &hashes, &start)) return NULL;
    if (read_pools_and_keys(pools, hashes, &ps, &hs) < 0) return NULL;
    PyObject **items = PySequence_Fast_ITEMS(hs);
    Py_ssize_t np = PySequence_Fast_GET_SIZE(ps), n = PySequence_Fast_GET_SIZE(hs);
    if (start < 0) start = 0;
    if (start > n) start = n;
    /* the keys first, then the lookups with their buckets asked for ahead: several times faster than
     * converting each key as it is looked up (measured) */
    uint64_t *h = malloc((size_t)(n - start + 1) * sizeof(uint64_t));
    long *counts = calloc((size_t)(np ? np : 1), sizeof(long));
    if (!counts || !h) { free(h); free(counts); PyErr_NoMemory(); goto done; }
    Py_ssize_t m = n - start;
    for (Py_ssize_t i = 0; i < m; i++) {
        if (i + AHEAD < m) PREFETCH(items[start + i + AHEAD]);
        if (to_key(items[start + i], &h[i]) < 0) { free(h); free(counts); goto done; }
    }
    for (Py_ssize_t i = 0; i < AHEAD && i < m; i++) prefetch_in_pools(ps, np, h[i]);
    for (Py_ssize_t i = 0; i < m; i++) {
        if (i + AHEAD < m) prefetch_in_pools(ps, np, h[i + AHEAD]);
        Py_ssize_t p = first_holder(ps, np, h[i]);
        if (p < 0) break;
        counts[p]++;
    }
    free(h);
    out = PyList_New(np);
    for (Py_ssize_t j = 0; out && j < np; j++) {
        PyObject *v = depth_int(counts[j]);
        if (!v) { Py_CLEAR(out); break; }
        PyList_SET_ITEM(out, j, v);
    }
    free(counts);
done:
    Py_XDECREF(ps); Py_XDECREF(hs);
    return out;
}

/* Every int of every list, in order, as native 64-bit unsigned keys (a bytearray): a whole trace's
   hashes for the cache-only replay in one pass, where array("Q", chain(...)) takes a Python iterator
   step per int. OverflowError or TypeError, as that array does, for what is not an int in [0, 2**64). */
static PyObject *flat_keys(PyObject *self, PyObject *lists) {
    (void)self;
    PyObject *outer = PySequence_Fast(lists, "flat_keys takes a sequence of sequences of ints");
    if (!outer) return NULL;
    Py_ssize_t nl = PySequence_Fast_GET_SIZE(outer), total = 0;
    PyObject **ls = PySequence_Fast_ITEMS(outer);
    for (Py_ssize_t j = 0; j < nl; j++) {
        Py_ssize_t len = PyObject_Length(ls[j]);
        if (len < 0) { Py_DECREF(outer); return NULL; }
        total += len;
    }
    PyObject *out = PyByteArray_FromStringAndSize(NULL, total * (Py_ssize_t)sizeof(uint64_t));
    if (!out) { Py_DECREF(outer); return NULL; }
    uint64_t *keys = (uint64_t *)PyByteArray_AS_STRING(out);
    Py_ssize_t at = 0;
    for (Py_ssize_t j = 0; j < nl; j++) {
        PyObject *seq = PySequence_Fast(ls[j], "flat_keys takes a sequence of sequences of ints");
        if (!seq) goto fail;
        Py_ssize_t n = PySequence_Fast_GET_SIZE(seq);
        PyObject **items = PySequence_Fast_ITEMS(seq);
        if (at + n > total) { Py_DECREF(seq); PyErr_SetString(PyExc_RuntimeError, "flat_keys: a list grew"); goto fail; }
        for (Py_ssize_t i = 0; i < n; i++) {
            if (i + AHEAD < n) PREFETCH(items[i + AHEAD]);
            if (to_key(items[i], &keys[at + i]) < 0) { Py_DECREF(seq); goto fail; }
        }
        at += n;
        Py_DECREF(seq);
    }
    Py_DECREF(outer);
    if (at != total && PyByteArray_Resize(out, at * (Py_ssize_t)sizeof(uint64_t)) < 0) { Py_DECREF(out); return NULL; }
    return out;
fail:
    Py_DECREF(outer);
    Py_DECREF(out);
    return NULL;
}

static PyMethodDef module_methods[] = {
    {"prefix_matches", prefix_matches, METH_VARARGS, "BlockPool.prefix_match of one prompt in each of several pools."},
    {"level_runs", level_runs, METH_VARARGS, "Runs of consecutive depths one pool holds: [(pool, first, end)]."},
    {"lower_counts", lower_counts, METH_VARARGS, "The run from start some pool holds: blocks per pool."},
    {"flat_keys", flat_keys, METH_O, "Every int of every list, in order, as native u64 keys (a bytearray)."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "_pool", "The block pool with LRU, S3-FIFO, Belady or BeladyCompute, compiled.", -1,
                                    module_methods};

#ifndef SOURCE_SHA256
#define SOURCE_SHA256 ""
#endif

PyMODINIT_FUNC PyInit__pool(void) {
    if (PyType_Ready(&PoolType) < 0) return NULL;
    PyObject *m = PyModule_Create(&module);
    if (!m) return NULL;
    Refused = PyErr_NewException("replica.core.compiled._pool.Refused", NULL, NULL);
    Py_INCREF(&PoolType);
    if (!Refused || PyModule_AddObject(m, "Pool", (PyObject *)&PoolType) < 0
        || PyModule_AddObject(m, "Refused", Refused) < 0
        || PyModule_AddStringConstant(m, "SOURCE_SHA256", SOURCE_SHA256) < 0
        /* the one definition of the policy kinds and refusal codes: Python reads them from here */
        || PyModule_AddIntConstant(m, "KIND_LRU", KIND_LRU) < 0
        || PyModule_AddIntConstant(m, "KIND_S3FIFO", KIND_S3FIFO) < 0
        || PyModule_AddIntConstant(m, "KIND_BELADY", KIND_BELADY) < 0
        || PyModule_AddIntConstant(m, "KIND_BELADY_COMPUTE", KIND_BELADY_COMPUTE) < 0
        || PyModule_AddIntConstant(m, "TOO_LONG", TOO_LONG) < 0
        || PyModule_AddIntConstant(m, "REPEATS", REPEATS) < 0
        || PyModule_AddIntConstant(m, "BUSY", BUSY) < 0) {
        Py_DECREF(m);
        return NULL;
    }
    return m;
}
