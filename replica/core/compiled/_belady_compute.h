/* BeladyCompute in the compiled pool: policies/belady.py's BeladyComputePolicy, the same
 * structures and the same victims (see there for why the order is exact). Included by _pool.c.
 *
 * Per depth, a max-heap of (next use, block); blocks never used again in one min-heap by
 * (cost, larger block first); depths ranked in a heap by an upper bound of their top's score
 * (next use - now) / cost(depth), re-scored lazily. Entries are stale when the block's record
 * changed or it is pinned; they are dropped when they reach a top. */

typedef struct { double t; uint64_t key; } DEntry;
typedef struct { double cost; uint64_t key; int32_t d; } NEntry;
typedef struct { double neg; uint64_t key; int32_t d; uint64_t ver; double now, top_t; uint64_t top_key; } REntry;
typedef struct { DEntry *a; Py_ssize_t len, cap; } DHeap;

struct BeladyCompute {
    DHeap *heaps;            /* by depth */
    double *cost;            /* by depth: recompute cost, floored above 0 */
    uint64_t *ver;           /* by depth: the version of its live ranked entry */
    double *scored_t;        /* by depth: next use its live entry was scored with (-inf: none) */
    uint8_t *is_dirty;       /* by depth: its top may exceed what its live entry scored */
    int32_t *dirty, ndirty;
    int32_t ndepths, cap;
    NEntry *never; Py_ssize_t never_len, never_cap;
    REntry *ranked; Py_ssize_t ranked_len, ranked_cap;
    long long entries;
    double ranked_at;
    double *policy_cost; Py_ssize_t npolicy_cost;  /* the policy's cost per depth (set_policy_costs) */
};

#define DBEFORE(x, y) ((x)->t > (y)->t || ((x)->t == (y)->t && (x)->key > (y)->key))
#define NBEFORE(x, y) ((x)->cost < (y)->cost || ((x)->cost == (y)->cost && ((x)->key > (y)->key \
                       || ((x)->key == (y)->key && (x)->d < (y)->d))))
#define RBEFORE(x, y) ((x)->neg < (y)->neg || ((x)->neg == (y)->neg && ((x)->key > (y)->key \
                       || ((x)->key == (y)->key && ((x)->d < (y)->d || ((x)->d == (y)->d && (x)->ver < (y)->ver))))))

#define DEFINE_HEAP(NAME, T, BEFORE)                                                                 \
    static void NAME##_down(T *a, Py_ssize_t n, Py_ssize_t i) {                                      \
        for (;;) {                                                                                   \
            Py_ssize_t l = 2 * i + 1, r = l + 1, m = i;                                              \
            if (l < n && BEFORE(&a[l], &a[m])) m = l;                                                \
            if (r < n && BEFORE(&a[r], &a[m])) m = r;                                                \
            if (m == i) return;                                                                      \
            T x = a[i]; a[i] = a[m]; a[m] = x;                                                       \
            i = m;                                                                                   \
        }                                                                                            \
    }                                                                                                \
    static int NAME##_append(T **a, Py_ssize_t *n, Py_ssize_t *cap, T v) { /* no sift: heapify after */ \
        if (*n == *cap) {                                                                            \
            Py_ssize_t c = *cap ? *cap * 2 : 16;                                                     \
            T *b = realloc(*a, (size_t)c * sizeof(T));                                               \
            if (!b) return -1;                                                                       \
            *a = b; *cap = c;                                                                        \
        }                                                                                            \
        (*a)[(*n)++] = v;                                                                            \
        return 0;                                                                                    \
    }                                                                                                \
    static int NAME##_push(T **a, Py_ssize_t *n, Py_ssize_t *cap, T v) {                             \
        if (NAME##_append(a, n, cap, v) < 0) return -1;                                              \
        Py_ssize_t i = *n - 1;                                                                       \
        while (i && BEFORE(&(*a)[i], &(*a)[(i - 1) / 2])) {                                          \
            T x = (*a)[i]; (*a)[i] = (*a)[(i - 1) / 2]; (*a)[(i - 1) / 2] = x;                       \
            i = (i - 1) / 2;                                                                         \
        }                                                                                            \
        return 0;                                                                                    \
    }                                                                                                \
    static T NAME##_pop(T *a, Py_ssize_t *n) {                                                       \
        T top = a[0];                                                                                \
        if (--*n) { a[0] = a[*n]; NAME##_down(a, *n, 0); }                                           \
        return top;                                                                                  \
    }                                                                                                \
    static void NAME##_heapify(T *a, Py_ssize_t n) {                                                 \
        for (Py_ssize_t i = n / 2; i-- > 0;) NAME##_down(a, n, i);                                   \
    }

DEFINE_HEAP(dheap, DEntry, DBEFORE)
DEFINE_HEAP(nheap, NEntry, NBEFORE)
DEFINE_HEAP(rheap, REntry, RBEFORE)

static int bc_init(Pool *k) {
    k->bc = calloc(1, sizeof(struct BeladyCompute));
    if (!k->bc) return -1;
    k->bc->ranked_at = -INFINITY;
    return 0;
}

static void bc_free(Pool *k) {
    struct BeladyCompute *b = k->bc;
    if (!b) return;
    for (int32_t d = 0; d < b->ndepths; d++) free(b->heaps[d].a);
    free(b->heaps); free(b->cost); free(b->ver); free(b->scored_t); free(b->is_dirty); free(b->dirty);
    free(b->never); free(b->ranked); free(b->policy_cost); free(b);
    k->bc = NULL;
}

static int bc_grow(Pool *k, int32_t depth) {  /* depths 0..depth exist: OK or a failure code, no Python error */
    struct BeladyCompute *b = k->bc;
    if (depth < b->ndepths) return OK;
    if (depth >= b->npolicy_cost) return POLICY_COSTS_SHORT;
    if (depth >= b->cap) {
        int32_t cap = b->cap ? b->cap : 64;
        while (cap <= depth) cap *= 2;
        DHeap *h = realloc(b->heaps, (size_t)cap * sizeof(DHeap)); if (h) b->heaps = h;
        double *c = realloc(b->cost, (size_t)cap * sizeof(double)); if (c) b->cost = c;
        uint64_t *v = realloc(b->ver, (size_t)cap * sizeof(uint64_t)); if (v) b->ver = v;
        double *st = realloc(b->scored_t, (size_t)cap * sizeof(double)); if (st) b->scored_t = st;
        uint8_t *isd = realloc(b->is_dirty, (size_t)cap); if (isd) b->is_dirty = isd;
        int32_t *dl = realloc(b->dirty, (size_t)cap * sizeof(int32_t)); if (dl) b->dirty = dl;
        if (!h || !c || !v || !st || !isd || !dl) return NO_MEMORY;
        b->cap = cap;
    }
    for (int32_t d = b->ndepths; d <= depth; d++) {
        double c = b->policy_cost[d];
        b->cost[d] = 1e-300 > c ? 1e-300 : c;
        b->heaps[d].a = NULL; b->heaps[d].len = b->heaps[d].cap = 0;
        b->ver[d] = 0; b->scored_t[d] = -INFINITY; b->is_dirty[d] = 0;
    }
    b->ndepths = depth + 1;
    return OK;
}

static inline void bc_mark(struct BeladyCompute *b, int32_t d) {
    if (!b->is_dirty[d]) { b->is_dirty[d] = 1; b->dirty[b->ndirty++] = d; }
}

static inline int bc_live(Pool *k, uint64_t key, double t, int32_t d) {  /* the block's record is this entry */
    int32_t s = table_find(&k->res, key);
    return s != NIL && k->has_rec[s] && k->nu[s] == t && k->depth[s] == d && !k->refs[s];
}

static int bc_top(Pool *k, int32_t d, DEntry *out) {  /* _top: drop stale entries from depth d's top */
    DHeap *h = &k->bc->heaps[d];
    while (h->len) {
        if (bc_live(k, h->a[0].key, h->a[0].t, d)) { *out = h->a[0]; return 1; }
        dheap_pop(h->a, &h->len);
    }
    return 0;
}

static int bc_never_top(Pool *k) {
    struct BeladyCompute *b = k->bc;
    while (b->never_len) {
        NEntry *e = &b->never[0];
        if (bc_live(k, e->key, INFINITY, e->d)) return 1;
        nheap_pop(b->never, &b->never_len);
    }
    return 0;
}

static int bc_rank(Pool *k, int32_t d, double now, REntry *out) {  /* _rank: 1 and the live entry, or 0 */
    struct BeladyCompute *b = k->bc;
    uint64_t ver = ++b->ver[d];
    DEntry top;
    if (!bc_top(k, d, &top)) { b->scored_t[d] = -INFINITY; return 0; }
    b->scored_t[d] = top.t;
    double gap = top.t - now;
    double score = (1e-9 > gap ? 1e-9 : gap) / b->cost[d];
    out->neg = -score; out->key = top.key; out->d = d; out->ver = ver; out->now = now;
    out->top_t = top.t; out->top_key = top.key;
    return 1;
}

static int bc_prepare(Pool *k, double now) {  /* _prepare_ranks */
    struct BeladyCompute *b = k->bc;
    if (now < b->ranked_at) {  /* scores rise as now falls: the bounds no longer hold */
        b->ranked_len = 0;
        for (int32_t d = 0; d < b->ndepths; d++) {
            b->scored_t[d] = -INFINITY;
            if (b->heaps[d].len) bc_mark(b, d);
        }
    }
    b->ranked_at = now;
    for (int32_t j = 0; j < b->ndirty; j++) {
        int32_t d = b->dirty[j];
        b->is_dirty[d] = 0;
        REntry live;
        if (bc_rank(k, d, now, &live) && rheap_push(&b->ranked, &b->ranked_len, &b->ranked_cap, live) < 0) return -1;
    }
    b->ndirty = 0;
    if (b->ranked_len > 2 * (Py_ssize_t)b->ndepths + 1024) {  /* drop superseded entries */
        Py_ssize_t m = 0;
        for (Py_ssize_t i = 0; i < b->ranked_len; i++)
            if (b->ranked[i].ver == b->ver[b->ranked[i].d]) b->ranked[m++] = b->ranked[i];
        b->ranked_len = m;
        rheap_heapify(b->ranked, m);
    }
    return 0;
}

static int32_t bc_best_depth(Pool *k, double now) {  /* _best_depth */
    struct BeladyCompute *b = k->bc;
    while (b->ranked_len) {
        REntry best = b->ranked[0];
        int32_t d = best.d;
        DEntry top;
        if (best.ver != b->ver[d]) {
            rheap_pop(b->ranked, &b->ranked_len);  /* superseded */
        } else if (best.now == now && bc_top(k, d, &top) && top.t == best.top_t && top.key == best.top_key) {
            rheap_pop(b->ranked, &b->ranked_len);  /* scored at this now and still the depth's top: exact */
            return d;
        } else {
            REntry live;
            if (bc_rank(k, d, now, &live)) { b->ranked[0] = live; rheap_down(b->ranked, b->ranked_len, 0); }
            else rheap_pop(b->ranked, &b->ranked_len);
        }
    }
    return -1;
}

static int32_t bc_take(Pool *k, uint64_t key) {  /* the victim leaves the records */
    int32_t s = table_find(&k->res, key);
    k->has_rec[s] = 0;
    k->records--;
    return s;
}

/* The next victim: never-used-again blocks first (cheapest first), then the best score. */
static int32_t bc_victim(Pool *k) {
    struct BeladyCompute *b = k->bc;
    if (bc_never_top(k)) return bc_take(k, nheap_pop(b->never, &b->never_len).key);
    double now = k->position;
    bc_prepare(k, now);  /* out of memory here only leaves bounds unscored: best_depth scores them */
    int32_t d = bc_best_depth(k, now);
    int32_t s = bc_take(k, dheap_pop(b->heaps[d].a, &b->heaps[d].len).key);
    REntry live;
    if (bc_rank(k, d, now, &live)) rheap_push(&b->ranked, &b->ranked_len, &b->ranked_cap, live);
    return s;
}

static void bc_rebuild(Pool *k) {  /* _rebuild: every unpinned record, heapified per depth */
    struct BeladyCompute *b = k->bc;
    Table *t = &k->res;
    b->never_len = 0;
    for (int32_t d = 0; d < b->ndepths; d++) { b->heaps[d].len = 0; b->scored_t[d] = -INFINITY; b->is_dirty[d] = 0; }
    b->ndirty = 0;
    for (int32_t s = 0; s < t->slots; s++) {
        if (!k->has_rec[s] || k->refs[s] || table_find(t, t->key[s]) != s) continue;
        int32_t d = k->depth[s];
        if (isinf(k->nu[s])) {  /* no room to grow (out of memory) only leaves the block out of the heaps */
            NEntry e = {b->cost[d], t->key[s], d};
            nheap_append(&b->never, &b->never_len, &b->never_cap, e);
        } else {
            DEntry e = {k->nu[s], t->key[s]};
            DHeap *h = &b->heaps[d];
            dheap_append(&h->a, &h->len, &h->cap, e);
        }
    }
    nheap_heapify(b->never, b->never_len);
    for (int32_t d = 0; d < b->ndepths; d++) {
        dheap_heapify(b->heaps[d].a, b->heaps[d].len);
        if (b->heaps[d].len) bc_mark(b, d);
    }
    b->entries = k->records;
    b->ranked_len = 0;
}

static int bc_release(Pool *k, const int32_t *freed, int32_t nfreed) {  /* on_release: OK or a failure code */
    struct BeladyCompute *b = k->bc;
    long long pushed = 0;
    for (int32_t j = 0; j < nfreed; j++) {
        int32_t s = freed[j];
        if (!k->has_rec[s]) continue;
        int32_t d = k->depth[s];
        double t = k->nu[s];
        int code = bc_grow(k, d);
        if (code != OK) return code;
        if (isinf(t)) {
            NEntry e = {b->cost[d], k->res.key[s], d};
            if (nheap_push(&b->never, &b->never_len, &b->never_cap, e) < 0) return NO_MEMORY;
        } else {
            DHeap *h = &b->heaps[d];
            DEntry e = {t, k->res.key[s]};
            if (dheap_push(&h->a, &h->len, &h->cap, e) < 0) return NO_MEMORY;
            if (t >= b->scored_t[d]) bc_mark(b, d);
        }
        pushed++;
    }
    b->entries += pushed;
    if (b->entries > 4 * (long long)k->records + 1024) bc_rebuild(k);
    return OK;
}
