/* The trace reader's compiled parts: a well-formed JSON-lines block's named fields, column by column,
   in one pass (columns); and the sessions of a trace that has none, inferred from its prompts' chained
   block ids (infer_sessions).

   columns

   The Python definition is loadgen.jsonlines's (orjson per line, then a check of each column's kind):
   this scanner gives the same columns where it accepts a block, and accepts only a strict subset of
   JSON where that is sure. Wherever it is not sure (a string with an escape or a byte outside printable
   ASCII, a number with more than 18 digits, a blank line, a repeated named field, nesting deeper than
   64, a value of the wrong kind, anything not JSON) it answers False and the caller reads the block
   the Python way, which either gives the same columns or names the line at fault. It never raises for
   the block's content.

   Kinds of a named field:
     'n'  a number >= 0 without a sign: an int (at most 18 digits) or a float (fraction or exponent,
          read by Python's own correctly rounded parser, as orjson reads it; not inf)
     'i'  an int >= 0 (at most 18 digits)
     'h'  a list of ints in [0, 2**64), possibly empty
   Other fields are skipped whatever JSON value they hold (within the limits above).

   infer_sessions
   The Python definition is loadgen.sessions.SessionInferrer.assign, called on each prompt in turn: the
   same sessions and turns, from an ordered map of tail block id -> session kept here as a hash table
   (linear probing, deletion by backward shift) over a doubly linked list of entries, oldest first. */

#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>
#include <string.h>

#define MAX_FIELDS 16
#define MAX_DEPTH 64

typedef struct {
    const char *p;
    const char *end;
} Cursor;

static inline void skip_ws(Cursor *c) {
    while (c->p < c->end && (*c->p == ' ' || *c->p == '\t' || *c->p == '\r')) c->p++;
}

/* A string without escapes, of printable ASCII: its bytes [*start, *start + *len). */
static int scan_string(Cursor *c, const char **start, Py_ssize_t *len) {
    if (c->p >= c->end || *c->p != '"') return 0;
    const char *s = ++c->p;
    while (c->p < c->end) {
        unsigned char ch = (unsigned char)*c->p;
        if (ch == '"') {
            *start = s;
            *len = c->p - s;
            c->p++;
            return 1;
        }
        if (ch < 0x20 || ch > 0x7e || ch == '\\') return 0;
        c->p++;
    }
    return 0;
}

/* JSON's number grammar. Sets *integral (no fraction, no exponent), *negative and the digits of an
   integral one (*digits, their count *ndigits). */
static int scan_number(Cursor *c, int *integral, int *negative, const char **digits, Py_ssize_t *ndigits) {
    const char *p = c->p, *end = c->end;
    *negative = 0;
    if (p < end && *p == '-') {
        *negative = 1;
        p++;
    }
    const char *d = p;
    if (p >= end || *p < '0' || *p > '9') return 0;
    if (*p == '0') p++;
    else
        while (p < end && *p >= '0' && *p <= '9') p++;
    *digits = d;
    *ndigits = p - d;
    *integral = 1;
    if (p < end && *p == '.') {
        p++;
        if (p >= end || *p < '0' || *p > '9') return 0;
        while (p < end && *p >= '0' && *p <= '9') p++;
        *integral = 0;
    }
    if (p < end && (*p == 'e' || *p == 'E')) {
        p++;
        if (p < end && (*p == '+' || *p == '-')) p++;
        if (p >= end || *p < '0' || *p > '9') return 0;
        while (p < end && *p >= '0' && *p <= '9') p++;
        *integral = 0;
    }
    c->p = p;
    return 1;
}

static uint64_t digits_value(const char *d, Py_ssize_t n) {
    uint64_t v = 0;
    for (Py_ssize_t i = 0; i < n; i++) v = v * 10 + (uint64_t)(d[i] - '0');
    return v;
}

/* A u64 from 1-20 digits, or 0 where it does not fit. */
static int digits_u64(const char *d, Py_ssize_t n, uint64_t *out) {
    if (n > 20) return 0;
    uint64_t v = 0;
    for (Py_ssize_t i = 0; i < n; i++) {
        uint64_t digit = (uint64_t)(d[i] - '0');
        if (v > (UINT64_MAX - digit) / 10) return 0;
        v = v * 10 + digit;
    }
    *out = v;
    return 1;
}

static int skip_value(Cursor *c, int depth);

static int skip_container(Cursor *c, int depth, char close, int object) {
    c->p++;
    skip_ws(c);
    if (c->p < c->end && *c->p == close) {
        c->p++;
        return 1;
    }
    for (;;) {
        if (object) {
            const char *s;
            Py_ssize_t n;
            if (!scan_string(c, &s, &n)) return 0;
            skip_ws(c);
            if (c->p >= c->end || *c->p != ':') return 0;
            c->p++;
            skip_ws(c);
        }
        if (!skip_value(c, depth + 1)) return 0;
        skip_ws(c);
        if (c->p >= c->end) return 0;
        if (*c->p == close) {
            c->p++;
            return 1;
        }
        if (*c->p != ',') return 0;
        c->p++;
        skip_ws(c);
    }
}

static int skip_literal(Cursor *c, const char *word, Py_ssize_t n) {
    if (c->end - c->p < n || memcmp(c->p, word, (size_t)n) != 0) return 0;
    c->p += n;
    return 1;
}

static int skip_value(Cursor *c, int depth) {
    if (depth > MAX_DEPTH || c->p >= c->end) return 0;
    const char *s;
    Py_ssize_t n;
    int integral, negative;
    switch (*c->p) {
    case '"': return scan_string(c, &s, &n);
    case '{': return skip_container(c, depth, '}', 1);
    case '[': return skip_container(c, depth, ']', 0);
    case 't': return skip_literal(c, "true", 4);
    case 'f': return skip_literal(c, "false", 5);
    case 'n': return skip_literal(c, "null", 4);
    default: return scan_number(c, &integral, &negative, &s, &n);
    }
}

/* An 'n' or 'i' field's value, a new reference, or NULL (no error set) where the scanner is unsure. */
static PyObject *read_number(Cursor *c, char kind) {
    const char *start = c->p, *digits;
    Py_ssize_t ndigits;
    int integral, negative;
    if (!scan_number(c, &integral, &negative, &digits, &ndigits) || negative) return NULL;
    if (integral) {
        if (ndigits > 18) return NULL;
        return PyLong_FromUnsignedLongLong(digits_value(digits, ndigits));
    }
    if (kind != 'n') return NULL;
    Py_ssize_t len = c->p - start;
    char buf[64];
    if (len >= (Py_ssize_t)sizeof buf) return NULL;
    memcpy(buf, start, (size_t)len);
    buf[len] = '\0';
    char *stop = NULL;
    double v = PyOS_string_to_double(buf, &stop, NULL);  /* overflow gives inf: refused below */
    if (v == -1.0 && PyErr_Occurred()) {
        PyErr_Clear();
        return NULL;
    }
    if (stop != buf + len || !(v <= 1.7976931348623157e308)) return NULL;
    return PyFloat_FromDouble(v);
}

/* ---------------------------------------------------------------- interned ids */

/* One int object per distinct id across a whole read: a trace repeats its ids (every turn repeats
   the conversation so far), so its lists share a few hundred thousand ints instead of holding millions
   (8 bytes a repeated access instead of 40), and each is made once. */
typedef struct {
    PyObject_HEAD
    uint64_t *keys;
    PyObject **values; /* NULL: an empty slot */
    size_t mask, count;
} Interner;

static void interner_dealloc(Interner *self) {
    if (self->values != NULL)
        for (size_t i = 0; i <= self->mask; i++) Py_XDECREF(self->values[i]);
    PyMem_Free(self->keys);
    PyMem_Free(self->values);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

static inline size_t mix(uint64_t k) {
    k ^= k >> 33;
    k *= 0xff51afd7ed558ccdULL;
    k ^= k >> 33;
    return (size_t)k;
}

/* The interner's slot: ids a trace numbers in sequence (Mooncake's) fill neighbouring slots, so a
   prompt's run of ids reads neighbouring memory; hashed ids (xxhash's) are spread already. The high
   bits folded in keep ids that differ only there apart. */
static inline size_t near(uint64_t k) { return (size_t)(k ^ (k >> 23) ^ (k >> 47)); }

static int interner_grow(Interner *self) {
    size_t size = self->values == NULL ? 1024 : (self->mask + 1) * 2;
    uint64_t *keys = PyMem_Malloc(sizeof(uint64_t) * size);
    PyObject **values = PyMem_Calloc(size, sizeof(PyObject *));
    if (keys == NULL || values == NULL) {
        PyMem_Free(keys);
        PyMem_Free(values);
        return 0;
    }
    if (self->values != NULL)
        for (size_t i = 0; i <= self->mask; i++) {
            if (self->values[i] == NULL) continue;
            size_t j = near(self->keys[i]) & (size - 1);
            while (values[j] != NULL) j = (j + 1) & (size - 1);
            keys[j] = self->keys[i];
            values[j] = self->values[i];
        }
    PyMem_Free(self->keys);
    PyMem_Free(self->values);
    self->keys = keys;
    self->values = values;
    self->mask = size - 1;
    return 1;
}

/* The int of value v, a new reference; NULL (no error set) when out of memory. */
static PyObject *interned(Interner *self, uint64_t v) {
    if ((self->count + 1) * 2 > self->mask + 1 || self->values == NULL)
        if (!interner_grow(self)) return NULL;
    size_t i = near(v) & self->mask;
    while (self->values[i] != NULL) {
        if (self->keys[i] == v) {
            Py_INCREF(self->values[i]);
            return self->values[i];
        }
        i = (i + 1) & self->mask;
    }
    PyObject *obj = PyLong_FromUnsignedLongLong(v);
    if (obj == NULL) {
        PyErr_Clear();
        return NULL;
    }
    self->keys[i] = v;
    self->values[i] = obj;
    self->count++;
    Py_INCREF(obj);
    return obj;
}

static PyTypeObject InternerType = {
    PyVarObject_HEAD_INIT(NULL, 0).tp_name = "_traceread.Interner",
    .tp_basicsize = sizeof(Interner),
    .tp_dealloc = (destructor)interner_dealloc,
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = "One int object per distinct id across the blocks of one read (columns' last argument).",
    .tp_new = PyType_GenericNew,
};

/* An 'h' field's list, a new reference, or NULL (no error set) where the scanner is unsure. Its length
   is counted first (the items are ints and commas up to the first ']'), then the ints are read. */
static PyObject *read_hashes(Cursor *c, Interner *ints) {
    if (c->p >= c->end || *c->p != '[') return NULL;
    const char *close = memchr(c->p, ']', (size_t)(c->end - c->p));
    if (close == NULL) return NULL;
    Py_ssize_t n = 0, any = 0;
    for (const char *q = c->p + 1; q < close; q++) {
        n += *q == ',';
        any |= *q != ' ' && *q != '\t' && *q != '\r';
    }
    n = any ? n + 1 : 0;
    c->p++;
    PyObject *list = PyList_New(n);
    if (list == NULL) {
        PyErr_Clear();
        return NULL;
    }
    skip_ws(c);
    for (Py_ssize_t i = 0; i < n; i++) {
        const char *digits;
        Py_ssize_t ndigits;
        int integral, negative;
        uint64_t v;
        if (i > 0) {
            if (c->p >= c->end || *c->p != ',') goto unsure;
            c->p++;
            skip_ws(c);
        }
        if (!scan_number(c, &integral, &negative, &digits, &ndigits) || !integral || negative ||
            !digits_u64(digits, ndigits, &v))
            goto unsure;
        PyObject *item = ints != NULL ? interned(ints, v) : PyLong_FromUnsignedLongLong(v);
        if (item == NULL) {
            PyErr_Clear();
            goto unsure;
        }
        PyList_SET_ITEM(list, i, item);
        skip_ws(c);
    }
    if (c->p != close) goto unsure;
    c->p++;
    return list;
unsure: /* the items not set are NULL, which list_dealloc skips */
    Py_DECREF(list);
    return NULL;
}

typedef struct {
    Py_ssize_t count;
    const char *names[MAX_FIELDS];
    Py_ssize_t lengths[MAX_FIELDS];
    char kinds[MAX_FIELDS];
    PyObject *columns[MAX_FIELDS];
} Fields;

/* One line: its named values appended to their columns; 0 where the scanner is unsure (or out of
   memory, with no error set: the Python reader then meets the same). */
static int scan_line(Cursor *c, Fields *f, Interner *ints) {
    PyObject *values[MAX_FIELDS] = {NULL};
    int ok = 0;
    skip_ws(c);
    if (c->p >= c->end || *c->p != '{') return 0;
    c->p++;
    skip_ws(c);
    if (c->p < c->end && *c->p == '}') {
        c->p++;
        goto close;
    }
    for (;;) {
        const char *key;
        Py_ssize_t keylen;
        if (!scan_string(c, &key, &keylen)) goto done;
        skip_ws(c);
        if (c->p >= c->end || *c->p != ':') goto done;
        c->p++;
        skip_ws(c);
        Py_ssize_t k = 0;
        while (k < f->count && !(f->lengths[k] == keylen && memcmp(f->names[k], key, (size_t)keylen) == 0)) k++;
        if (k == f->count) {
            if (!skip_value(c, 1)) goto done;
        } else {
            if (values[k] != NULL) goto done;  /* a repeated field: the last one counts in JSON readers */
            values[k] = f->kinds[k] == 'h' ? read_hashes(c, ints) : read_number(c, f->kinds[k]);
            if (values[k] == NULL) goto done;
        }
        skip_ws(c);
        if (c->p >= c->end) goto done;
        if (*c->p == '}') {
            c->p++;
            break;
        }
        if (*c->p != ',') goto done;
        c->p++;
        skip_ws(c);
    }
close:
    skip_ws(c);
    if (c->p != c->end) goto done;
    for (Py_ssize_t k = 0; k < f->count; k++)
        if (values[k] == NULL) goto done;
    for (Py_ssize_t k = 0; k < f->count; k++)
        if (PyList_Append(f->columns[k], values[k]) < 0) {
            PyErr_Clear();
            goto done;
        }
    ok = 1;
done:
    for (Py_ssize_t k = 0; k < f->count; k++) Py_XDECREF(values[k]);
    return ok;
}

PyDoc_STRVAR(columns_doc,
"columns(block, names, kinds, out, ints=None) -> bool\n\n"
"Appends the values of ``names`` (a tuple of bytes) in every line of ``block`` (bytes, lines split at\n"
"b'\\n', no newline at its end) to the lists in ``out``, one per name, each checked against its kind\n"
"(one byte of ``kinds`` a name: b'n' a number >= 0, b'i' an int >= 0, b'h' a list of ints in\n"
"[0, 2**64)). False where the scanner is not sure of the block (the lists then hold a part of it):\n"
"read it the Python way. ``ints``: an Interner that gives the hash lists one int object per distinct\n"
"id across every block it is passed with.");

static PyObject *columns(PyObject *self, PyObject *args) {
    Py_buffer block;
    PyObject *names, *out, *ints = NULL;
    const char *kinds;
    Py_ssize_t nkinds;
    if (!PyArg_ParseTuple(args, "y*O!y#O!|O!:columns", &block, &PyTuple_Type, &names, &kinds, &nkinds, &PyList_Type,
                          &out, &InternerType, &ints))
        return NULL;
    Fields f;
    f.count = PyTuple_GET_SIZE(names);
    if (f.count < 1 || f.count > MAX_FIELDS || nkinds != f.count || PyList_GET_SIZE(out) != f.count) {
        PyBuffer_Release(&block);
        PyErr_Format(PyExc_ValueError, "columns: 1 to %d names, one kind and one list each", MAX_FIELDS);
        return NULL;
    }
    for (Py_ssize_t k = 0; k < f.count; k++) {
        PyObject *name = PyTuple_GET_ITEM(names, k), *column = PyList_GET_ITEM(out, k);
        char kind = kinds[k];
        if (!PyBytes_Check(name) || !PyList_Check(column) || (kind != 'n' && kind != 'i' && kind != 'h')) {
            PyBuffer_Release(&block);
            PyErr_SetString(PyExc_TypeError, "columns: names are bytes, kinds b'n', b'i' or b'h', out lists");
            return NULL;
        }
        f.names[k] = PyBytes_AS_STRING(name);
        f.lengths[k] = PyBytes_GET_SIZE(name);
        f.kinds[k] = kind;
        f.columns[k] = column;
    }
    const char *p = block.buf, *end = p + block.len;
    int ok = block.len > 0;
    while (ok) {
        const char *nl = memchr(p, '\n', (size_t)(end - p));
        Cursor line = {p, nl ? nl : end};
        ok = scan_line(&line, &f, (Interner *)ints);
        if (!nl) break;
        p = nl + 1;
    }
    PyBuffer_Release(&block);
    return PyBool_FromLong(ok);
}


/* ---------------------------------------------------------------- session inference */

typedef struct {
    uint64_t *keys;   /* per entry */
    Py_ssize_t *session, *prev, *next;
    Py_ssize_t head, tail, free, count, capacity;
    Py_ssize_t *slots; /* hash table: entry index + 1, 0 empty */
    size_t mask;
} Owners;

static int owners_init(Owners *o, Py_ssize_t capacity) {
    size_t table = 16;
    while (table < (size_t)capacity * 2) table <<= 1;
    o->keys = PyMem_Malloc(sizeof(uint64_t) * (size_t)capacity);
    o->session = PyMem_Malloc(sizeof(Py_ssize_t) * (size_t)capacity);
    o->prev = PyMem_Malloc(sizeof(Py_ssize_t) * (size_t)capacity);
    o->next = PyMem_Malloc(sizeof(Py_ssize_t) * (size_t)capacity);
    o->slots = PyMem_Calloc(table, sizeof(Py_ssize_t));
    o->mask = table - 1;
    o->head = o->tail = -1;
    o->free = -1;
    o->count = 0;
    o->capacity = capacity;
    return o->keys && o->session && o->prev && o->next && o->slots;
}

static void owners_free(Owners *o) {
    PyMem_Free(o->keys);
    PyMem_Free(o->session);
    PyMem_Free(o->prev);
    PyMem_Free(o->next);
    PyMem_Free(o->slots);
}

/* The table slot holding key, or the empty slot where it would go. */
static inline size_t owners_slot(const Owners *o, uint64_t key) {
    size_t i = mix(key) & o->mask;
    while (o->slots[i] && o->keys[o->slots[i] - 1] != key) i = (i + 1) & o->mask;
    return i;
}

static void unlink_entry(Owners *o, Py_ssize_t e) {
    if (o->prev[e] >= 0) o->next[o->prev[e]] = o->next[e];
    else o->head = o->next[e];
    if (o->next[e] >= 0) o->prev[o->next[e]] = o->prev[e];
    else o->tail = o->prev[e];
}

static void append_entry(Owners *o, Py_ssize_t e) {
    o->prev[e] = o->tail;
    o->next[e] = -1;
    if (o->tail >= 0) o->next[o->tail] = e;
    else o->head = e;
    o->tail = e;
}

/* owner[key] = session, then move_to_end(key). The caller sized the entries for every key it puts
   before its pops (limit + one request's tail, or every tail there is). */
static void owners_put(Owners *o, uint64_t key, Py_ssize_t session) {
    size_t i = owners_slot(o, key);
    Py_ssize_t e;
    if (o->slots[i]) {
        e = o->slots[i] - 1;
        unlink_entry(o, e);
    } else {
        if (o->free >= 0) {
            e = o->free;
            o->free = o->next[e];
        } else {
            e = o->count;
        }
        o->keys[e] = key;
        o->slots[i] = e + 1;
        o->count++;
    }
    o->session[e] = session;
    append_entry(o, e);
}

/* popitem(last=False): the oldest entry leaves; the table closes the gap by backward shift. */
static void owners_pop_oldest(Owners *o) {
    Py_ssize_t e = o->head;
    unlink_entry(o, e);
    size_t i = owners_slot(o, o->keys[e]);
    o->slots[i] = 0;
    for (size_t j = (i + 1) & o->mask; o->slots[j]; j = (j + 1) & o->mask) {
        size_t home = mix(o->keys[o->slots[j] - 1]) & o->mask;
        /* the entry at j may move to i when i lies cyclically in [home, j) */
        if (((j - home) & o->mask) >= ((j - i) & o->mask)) {
            o->slots[i] = o->slots[j];
            o->slots[j] = 0;
            i = j;
        }
    }
    o->next[e] = o->free;
    o->free = e;
    o->count--;
}

PyDoc_STRVAR(infer_sessions_doc,
"infer_sessions(hash_lists, tail_blocks, min_shared_blocks, limit) -> (sessions, turns)\n\n"
"SessionInferrer(tail_blocks, min_shared_blocks, limit).assign of each list of ``hash_lists`` (lists of\n"
"ints in [0, 2**64)) in turn: the sessions (str) and turns. tail_blocks >= 1, min_shared_blocks >= 0,\n"
"limit >= 0. TypeError or OverflowError where an id is not such an int.");

static PyObject *infer_sessions(PyObject *self, PyObject *args) {
    PyObject *lists;
    Py_ssize_t tail_blocks, min_shared, limit;
    if (!PyArg_ParseTuple(args, "O!nnn:infer_sessions", &PyList_Type, &lists, &tail_blocks, &min_shared, &limit))
        return NULL;
    if (tail_blocks < 1 || min_shared < 0 || limit < 0) {
        PyErr_SetString(PyExc_ValueError, "infer_sessions: tail_blocks >= 1, min_shared_blocks >= 0, limit >= 0");
        return NULL;
    }
    Py_ssize_t n = PyList_GET_SIZE(lists), most = 0;
    for (Py_ssize_t r = 0; r < n; r++) {
        PyObject *ids = PyList_GET_ITEM(lists, r);
        if (!PyList_Check(ids)) {
            PyErr_SetString(PyExc_TypeError, "infer_sessions: hash_lists holds lists");
            return NULL;
        }
        most += PyList_GET_SIZE(ids) < tail_blocks ? PyList_GET_SIZE(ids) : tail_blocks;
    }
    /* at most limit entries stay, and one request adds at most tail_blocks before the pops */
    Py_ssize_t capacity = (most < limit + tail_blocks ? most : limit + tail_blocks) + 1;
    Owners o;
    PyObject *sessions = PyList_New(n), *turns = PyList_New(n), *names = PyList_New(0);
    Py_ssize_t *counts = NULL, nsessions = 0, allocated = 0;
    uint64_t *keys = NULL;
    Py_ssize_t keys_len = 0;
    int ok = owners_init(&o, capacity) && sessions && turns && names;
    if (!ok && !PyErr_Occurred()) PyErr_NoMemory();
    for (Py_ssize_t r = 0; ok && r < n; r++) {
        PyObject *ids = PyList_GET_ITEM(lists, r);
        Py_ssize_t len = PyList_GET_SIZE(ids);
        if (len > keys_len) {
            PyMem_Free(keys);
            keys_len = len * 2;
            keys = PyMem_Malloc(sizeof(uint64_t) * (size_t)keys_len);
            if (keys == NULL) {
                PyErr_NoMemory();
                ok = 0;
                break;
            }
        }
        for (Py_ssize_t i = 0; i < len; i++) {
            PyObject *item = PyList_GET_ITEM(ids, i);
            if (!PyLong_Check(item) || PyBool_Check(item)) {
                PyErr_SetString(PyExc_TypeError, "infer_sessions: ids are ints");
                ok = 0;
                break;
            }
            keys[i] = PyLong_AsUnsignedLongLong(item); /* OverflowError outside [0, 2**64) */
            if (keys[i] == (uint64_t)-1 && PyErr_Occurred()) {
                ok = 0;
                break;
            }
        }
        if (!ok) break;
        Py_ssize_t session = -1;
        for (Py_ssize_t i = len - 1; i >= min_shared - 1 && i >= 0; i--) { /* the deepest match */
            size_t slot = owners_slot(&o, keys[i]);
            if (o.slots[slot]) {
                session = o.session[o.slots[slot] - 1];
                break;
            }
        }
        if (session < 0) {
            if (nsessions == allocated) {
                allocated = allocated ? allocated * 2 : 1024;
                Py_ssize_t *grown = PyMem_Realloc(counts, sizeof(Py_ssize_t) * (size_t)allocated);
                if (grown == NULL) {
                    PyErr_NoMemory();
                    ok = 0;
                    break;
                }
                counts = grown;
            }
            PyObject *name = PyUnicode_FromFormat("%zd", nsessions);
            if (name == NULL || PyList_Append(names, name) < 0) {
                Py_XDECREF(name);
                ok = 0;
                break;
            }
            Py_DECREF(name);
            counts[nsessions] = 0;
            session = nsessions++;
        }
        PyObject *turn = PyLong_FromSsize_t(counts[session]++);
        if (turn == NULL) {
            ok = 0;
            break;
        }
        PyList_SET_ITEM(turns, r, turn);
        PyObject *name = PyList_GET_ITEM(names, session);
        Py_INCREF(name);
        PyList_SET_ITEM(sessions, r, name);
        for (Py_ssize_t i = len > tail_blocks ? len - tail_blocks : 0; i < len; i++) {
            owners_put(&o, keys[i], session);
        }
        while (o.count > limit) owners_pop_oldest(&o);
    }
    owners_free(&o);
    PyMem_Free(keys);
    PyMem_Free(counts);
    Py_XDECREF(names);
    if (!ok) {
        Py_XDECREF(sessions);
        Py_XDECREF(turns);
        return NULL;
    }
    return Py_BuildValue("(NN)", sessions, turns);
}

static PyMethodDef methods[] = {
    {"columns", columns, METH_VARARGS, columns_doc},
    {"infer_sessions", infer_sessions, METH_VARARGS, infer_sessions_doc},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT, "_traceread",
    "The trace reader's compiled parts: a JSON-lines block's columns (loadgen.jsonlines.typed_columns) and"
    " session inference (loadgen.sessions.infer_sessions).", -1,
    methods,
};

PyMODINIT_FUNC PyInit__traceread(void) {
    if (PyType_Ready(&InternerType) < 0) return NULL;
    PyObject *m = PyModule_Create(&module);
    if (m == NULL) return NULL;
    Py_INCREF(&InternerType);
    if (PyModule_AddObject(m, "Interner", (PyObject *)&InternerType) < 0) {
        Py_DECREF(&InternerType);
        Py_DECREF(m);
        return NULL;
    }
    if (PyModule_AddStringConstant(m, "SOURCE_SHA256", SOURCE_SHA256) < 0) {
        Py_DECREF(m);
        return NULL;
    }
    return m;
}
