// SPDX-License-Identifier: Apache-2.0
/* `lines(block)`: exactly what `vllm_stream._LINE.findall(block)` returns, without the regex engine; and
 * `segments(block)`: exactly `vllm_stream._segments_py(block)` (those rows, each run of token chunks' columns
 * joined), without making the rows; and `answer_logprobs(answer)`: a non-streamed answer with its logprob entries
 * cut down to their numbers (see its section below and `vllm.fast_answer`).
 *
 * The proxy reads every line of a long stream; Python's `re` spends ~3 ns per byte on it, and joining the rows'
 * columns as much again: most of the proxy's own CPU for a 512-token answer. The pattern is deterministic
 * (possessive quantifiers, and every alternation's branches differ in their first byte or in the byte that follows
 * them), so a hand-written recursive descent over the fixed key order decides the same match: each function below
 * mirrors one piece of the pattern and is named after it. Any change to `_TOKEN_CHUNK` in vllm_stream.py must be
 * made here too; tests/proxy/test_sse_scan.py compares both on a random corpus.
 *
 * Every matcher works inside one line (`end` is the line's '\n' or the end of the block): nothing in a token
 * chunk can match '\n' (string characters exclude control bytes, `\\.` excludes '\n'), so bounding the scan at the
 * line end decides the same match as the regex and makes every read bounds-checked by one comparison.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>
#include <string.h>

#define NGROUPS 8 /* payload, kind, text, logprob entries, first logprob, finish, ids, other line */

typedef struct {
    const char *s;  /* the block */
    Py_ssize_t end; /* end of the current line */
    Py_ssize_t i;   /* read position */
} Scan;

typedef struct {
    Py_ssize_t a, b; /* a < 0: the group did not take part (findall gives b"") */
} Span;

static const Span NONE = {-1, -1};

/* `_CH`: a byte a JSON string holds as itself (no quote, backslash or control byte; 0x7f and non-ASCII are in) */
static unsigned char plain_char[256];

static PyObject *empty_bytes;   /* every group that did not take part, and every empty one */
static PyObject *kind_bytes[3]; /* the three kinds, shared rather than one new object per chunk */
static const char *const kind_names[3] = {"content", "reasoning_content", "reasoning"};

static int
at_digit(const Scan *c)
{
    return c->i < c->end && c->s[c->i] >= '0' && c->s[c->i] <= '9';
}

/* A literal; on a mismatch the position does not move. */
static int
lit(Scan *c, const char *t, Py_ssize_t len)
{
    if (c->end - c->i < len || memcmp(c->s + c->i, t, (size_t)len) != 0) {
        return 0;
    }
    c->i += len;
    return 1;
}
#define LIT(c, t) lit((c), (t), (Py_ssize_t)sizeof(t) - 1)

/* `\d++` */
static int
digits(Scan *c)
{
    Py_ssize_t start = c->i;
    while (at_digit(c)) {
        c->i++;
    }
    return c->i > start;
}

/* `_CH*+(?:\\._CH*+)*+`: a string's body; `.` is any byte but '\n', i.e. any byte before the line end. */
static void
str_body(Scan *c)
{
    for (;;) {
        while (c->i < c->end && plain_char[(unsigned char)c->s[c->i]]) {
            c->i++;
        }
        if (c->end - c->i < 2 || c->s[c->i] != '\\') {
            return;
        }
        c->i += 2;
    }
}

/* `_STR` (and `_CSTR`, whose group is the body: `span` when not NULL) */
static int
str(Scan *c, Span *span)
{
    if (!LIT(c, "\"")) {
        return 0;
    }
    Py_ssize_t a = c->i;
    str_body(c);
    if (span) {
        span->a = a;
        span->b = c->i;
    }
    return LIT(c, "\"");
}

/* `_NUM`: -?+(?:0|[1-9]\d*+)(?:\.\d++)?+(?:[eE][+-]?+\d++)?+ */
static int
num(Scan *c)
{
    LIT(c, "-");
    if (!LIT(c, "0")) {
        if (!at_digit(c)) { /* '0' was taken above, so this is [1-9] */
            return 0;
        }
        digits(c);
    }
    Py_ssize_t save = c->i;
    if (!(LIT(c, ".") && digits(c))) {
        c->i = save;
    }
    save = c->i;
    if (LIT(c, "e") || LIT(c, "E")) {
        if (!LIT(c, "+")) {
            LIT(c, "-");
        }
        if (!digits(c)) {
            c->i = save;
        }
    }
    return 1;
}

/* `\[[\d,]*+\]` */
static int
byte_list(Scan *c)
{
    if (!LIT(c, "[")) {
        return 0;
    }
    while (c->i < c->end && (at_digit(c) || c->s[c->i] == ',')) {
        c->i++;
    }
    return LIT(c, "]");
}

/* `"([a-z_]*+)"`; sets `span` only on a match */
static int
finish_name(Scan *c, Span *span)
{
    if (!LIT(c, "\"")) {
        return 0;
    }
    Py_ssize_t a = c->i;
    while (c->i < c->end && ((c->s[c->i] >= 'a' && c->s[c->i] <= 'z') || c->s[c->i] == '_')) {
        c->i++;
    }
    if (!LIT(c, "\"")) {
        return 0;
    }
    span->a = a;
    span->b = c->i - 1;
    return 1;
}

/* `_LP` (`_LP1` when `first` is not NULL: the logprob's span is its group) */
static int
logprob_entry(Scan *c, Span *first)
{
    if (!LIT(c, "{\"token\":") || !str(c, NULL) || !LIT(c, ",\"logprob\":")) {
        return 0;
    }
    Py_ssize_t a = c->i;
    if (!num(c)) {
        return 0;
    }
    if (first) {
        first->a = a;
        first->b = c->i;
    }
    Py_ssize_t save = c->i; /* (?:,"bytes":(?:null|\[[\d,]*+\]))?+ */
    if (LIT(c, ",\"bytes\":") && !LIT(c, "null") && !byte_list(c)) {
        c->i = save;
    }
    save = c->i;
    if (!LIT(c, ",\"top_logprobs\":[]")) {
        c->i = save;
    }
    return LIT(c, "}");
}

/* `(?:,"logprobs":(?:null|\{"content":\[(_LP1(?:,_LP)*+)?+\]\}))?+`; g[0]: entries, g[1]: first logprob; `*n`: how
 * many entries (0 when the group did not take part) */
static void
logprobs(Scan *c, Span g[2], int *n)
{
    *n = 0;
    Py_ssize_t save = c->i;
    if (!LIT(c, ",\"logprobs\":") || LIT(c, "null")) {
        return;
    }
    int ok = LIT(c, "{\"content\":[");
    if (ok) {
        Py_ssize_t a = c->i;
        if (logprob_entry(c, &g[1])) {
            *n = 1;
            for (;;) {
                Py_ssize_t next = c->i;
                if (!(LIT(c, ",") && logprob_entry(c, NULL))) {
                    c->i = next;
                    break;
                }
                ++*n;
            }
            g[0].a = a;
            g[0].b = c->i;
        }
        else {
            c->i = a;
            g[1] = NONE;
        }
        ok = LIT(c, "]}");
    }
    if (!ok) {
        c->i = save;
        g[0] = g[1] = NONE;
        *n = 0;
    }
}

/* `_TOKEN_CHUNK`; `*kind`: an index into kind_names; g: text, logprob entries, first logprob, finish, ids;
 * `*entries`: how many logprob entries. `*prefix`: where the last chunk's prefix (up to its delta's `{`) was, NONE if
 * none yet. Every chunk of a stream starts with the same id, created time and model, so a chunk whose first bytes
 * equal that prefix's matches it the same way (the prefix is read without looking past its end) and is read on
 * from there; else the prefix is read here and becomes the next chunk's. */
static int
token_chunk(Scan *c, int *kind, Span g[5], int *entries, Span *prefix)
{
    Py_ssize_t len = prefix->b - prefix->a;
    if (len > 0 && c->end - c->i >= len && memcmp(c->s + c->i, c->s + prefix->a, (size_t)len) == 0) {
        c->i += len;
    }
    else {
        Py_ssize_t a = c->i;
        if (!LIT(c, "{\"id\":") || !str(c, NULL) ||
            !LIT(c, ",\"object\":\"chat.completion.chunk\",\"created\":") || !digits(c) ||
            !LIT(c, ",\"model\":") || !str(c, NULL) || !LIT(c, ",\"choices\":[{\"index\":0,\"delta\":{")) {
            return 0;
        }
        prefix->a = a;
        prefix->b = c->i;
    }
    LIT(c, "\"role\":\"assistant\",");
    if (!LIT(c, "\"")) {
        return 0;
    }
    *kind = -1; /* (content|reasoning_content|reasoning)": only one of them can be followed by `"` */
    for (int k = 0; k < 3 && *kind < 0; k++) {
        Py_ssize_t save = c->i;
        if (lit(c, kind_names[k], (Py_ssize_t)strlen(kind_names[k])) && LIT(c, "\":")) {
            *kind = k;
        }
        else {
            c->i = save;
        }
    }
    if (*kind < 0) {
        return 0;
    }
    if (!str(c, &g[0]) || !LIT(c, "}")) {
        return 0;
    }
    logprobs(c, &g[1], entries);

    Py_ssize_t save = c->i; /* (?:,"finish_reason":(?:null|"([a-z_]*+)"))?+ */
    if (LIT(c, ",\"finish_reason\":") && !LIT(c, "null") && !finish_name(c, &g[3])) {
        c->i = save;
    }

    save = c->i; /* (?:,"stop_reason":(?:null|\d++|_STR))?+ */
    if (LIT(c, ",\"stop_reason\":") && !(LIT(c, "null") || digits(c) || str(c, NULL))) {
        c->i = save;
    }

    save = c->i; /* (?:,"token_ids":\[(\d++(?:,\d++)*+)?+\])?+ */
    if (LIT(c, ",\"token_ids\":[")) {
        Py_ssize_t a = c->i;
        if (digits(c)) {
            for (;;) {
                Py_ssize_t next = c->i;
                if (!(LIT(c, ",") && digits(c))) {
                    c->i = next;
                    break;
                }
            }
            g[4].a = a;
            g[4].b = c->i;
        }
        if (!LIT(c, "]")) {
            c->i = save;
            g[4] = NONE;
        }
    }

    if (!LIT(c, "}]")) {
        return 0;
    }
    for (;;) { /* (?:,"(?:usage|prompt_token_ids|system_fingerprint)":null)*+ */
        Py_ssize_t next = c->i;
        if (!(LIT(c, ",\"") && (LIT(c, "usage") || LIT(c, "prompt_token_ids") || LIT(c, "system_fingerprint")) &&
              LIT(c, "\":null"))) {
            c->i = next;
            break;
        }
    }
    return LIT(c, "}");
}

static PyObject *
slice(const char *s, Span span)
{
    if (span.a < 0 || span.b == span.a) {
        return Py_NewRef(empty_bytes);
    }
    return PyBytes_FromStringAndSize(s + span.a, span.b - span.a);
}

/* One `data:` line: what `_LINE` makes of it */
typedef struct {
    int kind;          /* an index into kind_names; < 0: not a token chunk (g[7] is the rest of the line) */
    int entries;       /* a token chunk's logprob entries */
    Span g[NGROUPS];   /* the groups (g[1], the kind, unused) */
} Row;

/* The line's payload starts at `p` (after `data:` and its optional space) and ends at `end`:
 * `(_TOKEN_CHUNK)\r?$`, else `([^\n]*+)`, the rest of the line, with groups 1-7 not taking part. */
static void
scan_line(const char *s, Py_ssize_t p, Py_ssize_t end, Row *r, Span *prefix)
{
    for (int k = 0; k < NGROUPS; k++) {
        r->g[k] = NONE;
    }
    Scan c = {s, end, p};
    if (token_chunk(&c, &r->kind, &r->g[2], &r->entries, prefix) && (c.i == end || (c.i + 1 == end && s[c.i] == '\r'))) {
        r->g[0].a = p;
        r->g[0].b = c.i;
        return;
    }
    for (int k = 0; k < NGROUPS; k++) { /* token_chunk may have set some before it failed */
        r->g[k] = NONE;
    }
    r->kind = -1;
    r->entries = 0;
    r->g[7].a = p;
    r->g[7].b = end;
}

/* The next `data:` line from `*pos` on: where it starts (`*line`), its payload (`*p`), its end (`*end`: its '\n' or
 * the end of the block); `*pos` moves past it. `^` under re.M is the start of the block and every byte after a
 * '\n'; a match always ends at a line end, so findall's next search starts there and finds nothing before the next
 * line. */
static int
next_data_line(const char *s, Py_ssize_t n, Py_ssize_t *pos, Py_ssize_t *line, Py_ssize_t *p, Py_ssize_t *end)
{
    while (*pos < n) {
        Py_ssize_t start = *pos;
        const char *nl = memchr(s + start, '\n', (size_t)(n - start));
        *end = nl ? nl - s : n;
        *pos = *end + 1;
        if (*end - start >= 5 && memcmp(s + start, "data:", 5) == 0) {
            *line = start;
            *p = start + 5 + (start + 5 < *end && s[start + 5] == ' ');
            return 1;
        }
    }
    return 0;
}

/* A tuple of `n` new references (stolen); NULL, every one released, when one of them is NULL or memory is out. */
static PyObject *
tuple_of(PyObject **items, Py_ssize_t n)
{
    PyObject *t = NULL;
    for (Py_ssize_t k = 0; k < n; k++) {
        if (!items[k]) {
            goto fail;
        }
    }
    if (!(t = PyTuple_New(n))) {
        goto fail;
    }
    for (Py_ssize_t k = 0; k < n; k++) {
        PyTuple_SET_ITEM(t, k, items[k]);
    }
    return t;
fail:
    for (Py_ssize_t k = 0; k < n; k++) {
        Py_XDECREF(items[k]);
    }
    return NULL;
}

static PyObject *
row_tuple(const char *s, const Row *r)
{
    PyObject *items[NGROUPS];
    for (int k = 0; k < NGROUPS; k++) {
        items[k] = (k == 1 && r->kind >= 0) ? Py_NewRef(kind_bytes[r->kind]) : slice(s, r->g[k]);
    }
    return tuple_of(items, NGROUPS);
}

static PyObject *
lines(PyObject *module, PyObject *arg)
{
    (void)module;
    Py_buffer buf;
    if (PyObject_GetBuffer(arg, &buf, PyBUF_SIMPLE) < 0) {
        return NULL;
    }
    const char *s = buf.buf;
    Py_ssize_t pos = 0, line, p, end;
    Span prefix = NONE; /* token_chunk */
    PyObject *out = PyList_New(0);
    while (out && next_data_line(s, buf.len, &pos, &line, &p, &end)) {
        Row r;
        scan_line(s, p, end, &r, &prefix);
        PyObject *t = row_tuple(s, &r);
        if (!t || PyList_Append(out, t) < 0) {
            Py_CLEAR(out);
        }
        Py_XDECREF(t);
    }
    PyBuffer_Release(&buf);
    return out;
}

/* -- segments: each run of token chunks joined while it is scanned (vllm_stream._columns, without the rows) ------ */

typedef struct {
    Span *v;
    Py_ssize_t n, cap;
} Spans;

static int
push(Spans *sp, Span x)
{
    if (sp->n == sp->cap) {
        Py_ssize_t cap = sp->cap ? 2 * sp->cap : 64;
        Span *v = PyMem_Realloc(sp->v, (size_t)cap * sizeof(Span));
        if (!v) {
            PyErr_NoMemory();
            return -1;
        }
        sp->v = v;
        sp->cap = cap;
    }
    sp->v[sp->n++] = x;
    return 0;
}

/* The spans' bytes joined with `sep` between them (0: none), empty ones left out: `sep.join([x for x in xs if x])` */
static PyObject *
join(const char *s, const Spans *sp, char sep)
{
    Py_ssize_t total = 0, m = 0;
    for (Py_ssize_t k = 0; k < sp->n; k++) {
        total += sp->v[k].b - sp->v[k].a;
        m += sp->v[k].b > sp->v[k].a;
    }
    if (sep && m) {
        total += m - 1;
    }
    if (!total) {
        return Py_NewRef(empty_bytes);
    }
    PyObject *out = PyBytes_FromStringAndSize(NULL, total);
    if (!out) {
        return NULL;
    }
    char *d = PyBytes_AS_STRING(out);
    for (Py_ssize_t k = 0; k < sp->n; k++) {
        Py_ssize_t len = sp->v[k].b - sp->v[k].a;
        if (len > 0) {
            if (sep && d != PyBytes_AS_STRING(out)) {
                *d++ = sep;
            }
            memcpy(d, s + sp->v[k].a, (size_t)len);
            d += len;
        }
    }
    return out;
}

/* `b"\\u" in joined` */
static int
has_u_escape(PyObject *joined)
{
    const char *q = PyBytes_AS_STRING(joined), *e = q + PyBytes_GET_SIZE(joined);
    while ((q = memchr(q, '\\', (size_t)(e - q))) && e - q > 1) {
        if (q[1] == 'u') {
            return 1;
        }
        q++;
    }
    return 0;
}

/* The run being joined; spans only (no objects) until it ends */
typedef struct {
    Py_ssize_t start, end;           /* from its first line's start to its last line's end */
    Py_ssize_t count;                /* chunks */
    int kind;                        /* the current stretch's kind */
    Span finish;                     /* the last non-empty finish reason */
    Spans texts;                     /* the current stretch's texts, empty ones too */
    Spans ids, lps;                  /* non-empty only; lps: every logprob entry's number */
    PyObject *stretches;             /* the finished stretches: list of (kind, text, texts or None) */
} RunBuild;

/* The texts of the current stretch one by one */
static PyObject *
stretch_texts(const char *s, const RunBuild *r)
{
    PyObject *t = PyTuple_New(r->texts.n);
    for (Py_ssize_t k = 0; t && k < r->texts.n; k++) {
        PyObject *v = slice(s, r->texts.v[k]);
        if (!v) {
            Py_CLEAR(t);
            break;
        }
        PyTuple_SET_ITEM(t, k, v);
    }
    return t;
}

/* The current stretch as (kind, joined text, its texts one by one when they hold a `\u`, else None), appended to
 * the run's stretches */
static int
end_stretch(const char *s, RunBuild *r)
{
    PyObject *items[3] = {Py_NewRef(kind_bytes[r->kind]), join(s, &r->texts, 0), NULL};
    if (items[1]) {
        items[2] = has_u_escape(items[1]) ? stretch_texts(s, r) : Py_NewRef(Py_None);
    }
    PyObject *t = tuple_of(items, 3);
    int rc = t ? PyList_Append(r->stretches, t) : -1;
    Py_XDECREF(t);
    r->texts.n = 0;
    return rc;
}

static int
add_row(const char *s, RunBuild *r, const Row *row, Py_ssize_t line, Py_ssize_t end)
{
    if (r->count == 0) {
        if (!(r->stretches = PyList_New(0))) {
            return -1;
        }
        r->start = line;
        r->kind = row->kind;
        r->finish = NONE;
    }
    else if (row->kind != r->kind) {
        if (end_stretch(s, r) < 0) {
            return -1;
        }
        r->kind = row->kind;
    }
    r->end = end;
    r->count++;
    const Span *g = row->g;
    if (g[5].b > g[5].a) {
        r->finish = g[5];
    }
    if (push(&r->texts, g[2]) < 0 || (g[6].b > g[6].a && push(&r->ids, g[6]) < 0)) {
        return -1;
    }
    if (g[3].b <= g[3].a) {
        return 0;
    }
    if (row->entries == 1) {
        return push(&r->lps, g[4]);
    }
    /* several tokens a chunk (a stream interval): every entry's logprob, from the entries the row matched */
    Scan c = {s, g[3].b, g[3].a};
    for (int k = 0; k < row->entries; k++) {
        Span lp = NONE;
        if ((k && !LIT(&c, ",")) || !logprob_entry(&c, &lp)) {
            PyErr_SetString(PyExc_SystemError, "_sse_scan: a chunk's logprob entries read twice differ");
            return -1;
        }
        if (push(&r->lps, lp) < 0) {
            return -1;
        }
    }
    return 0;
}

/* The run as a vllm_stream.Run, appended to `out`; the builder emptied for the next one */
static int
end_run(const char *s, RunBuild *r, PyObject *out)
{
    PyObject *where = NULL, *stretches = NULL;
    if (end_stretch(s, r) == 0) {
        PyObject *a = PyLong_FromSsize_t(r->start), *b = PyLong_FromSsize_t(r->end);
        where = a && b ? PySlice_New(a, b, NULL) : NULL;
        Py_XDECREF(a);
        Py_XDECREF(b);
        stretches = PyList_AsTuple(r->stretches);
    }
    PyObject *items[6] = {
        where,
        PyLong_FromSsize_t(r->count),
        join(s, &r->ids, ','),
        join(s, &r->lps, ','),
        slice(s, r->finish),
        stretches,
    };
    PyObject *t = tuple_of(items, 6);
    int rc = t ? PyList_Append(out, t) : -1;
    Py_XDECREF(t);
    Py_CLEAR(r->stretches);
    r->count = r->texts.n = r->ids.n = r->lps.n = 0;
    return rc;
}

static PyObject *
segments(PyObject *module, PyObject *arg)
{
    (void)module;
    Py_buffer buf;
    if (PyObject_GetBuffer(arg, &buf, PyBUF_SIMPLE) < 0) {
        return NULL;
    }
    const char *s = buf.buf;
    Py_ssize_t pos = 0, line, p, end;
    RunBuild run;
    memset(&run, 0, sizeof run);
    Span prefix = NONE; /* token_chunk */
    PyObject *out = PyList_New(0);
    while (out && next_data_line(s, buf.len, &pos, &line, &p, &end)) {
        Row r;
        scan_line(s, p, end, &r, &prefix);
        if (r.kind >= 0) {
            if (add_row(s, &run, &r, line, end) < 0) {
                Py_CLEAR(out);
            }
            continue;
        }
        PyObject *other = NULL;
        if ((run.count && end_run(s, &run, out) < 0) || !(other = slice(s, r.g[7])) ||
            PyList_Append(out, other) < 0) {
            Py_CLEAR(out);
        }
        Py_XDECREF(other);
    }
    if (out && run.count && end_run(s, &run, out) < 0) {
        Py_CLEAR(out);
    }
    Py_XDECREF(run.stretches);
    PyMem_Free(run.texts.v);
    PyMem_Free(run.ids.v);
    PyMem_Free(run.lps.v);
    PyBuffer_Release(&buf);
    return out;
}

/* -- answer_logprobs: a non-streamed answer's logprob entries cut down to their numbers ------------------------- */
/* `orjson` spends most of its time on a long answer building `choices[0].logprobs.content`: one dict per token, of
 * which the proxy reads one number; and to the top-level `prompt_token_ids`, 8,000 Python ints for an 8k-token
 * prompt that the record packs as int32 again. This walks the answer's structure down to that array, reads its
 * entries in the exact shapes vLLM writes, and writes the answer again with each entry replaced by its logprob's
 * text; with `ids`, it packs the prompt ids (token ids only: ints in [0, 2**31) as JSON writes them) and leaves `[]`
 * in their place; then one `orjson` parse reads the rest.
 *
 * Why the result is the full parse's: the walk reads keys and skips values by quotes, escapes and brackets only,
 * which finds the same structure as a JSON parser on any valid JSON, and it reads the rewritten answer up to and
 * after the array exactly as it reads the original. So when orjson accepts the rewritten answer (the caller parses
 * it, and takes the full parse if that fails), the array stood at `choices[0].logprobs.content` of a valid answer;
 * the entries are checked to be JSON the full parse accepts (the token string strictly), and so are the ids, so the
 * original is valid with the same structure, each logprob is the same number text read by the same parser, and
 * each id the int the full parse would make. The keys on the way
 * must appear once, unescaped: JSON's last-one-wins for a repeated key, or an escape spelling one of them, could
 * otherwise point the full parse elsewhere. */

/* Whitespace as JSON has it */
static void
skip_ws(Scan *c)
{
    while (c->i < c->end && (c->s[c->i] == ' ' || c->s[c->i] == '\t' || c->s[c->i] == '\n' || c->s[c->i] == '\r')) {
        c->i++;
    }
}

/* Past a string that starts at the read position (its quote); 0 if it does not end. Only the quotes and escapes
 * matter here: whatever lies outside the cut is checked by orjson when it parses the rewritten answer. */
static int
skip_string(Scan *c)
{
    c->i++;
    while (c->i < c->end) {
        const char *q = memchr(c->s + c->i, '"', (size_t)(c->end - c->i));
        if (!q) {
            return 0;
        }
        Py_ssize_t k = q - c->s, back = 0;
        while (k - back - 1 >= c->i && c->s[k - back - 1] == '\\') {
            back++;
        }
        c->i = k + 1;
        if (!(back & 1)) {
            return 1;
        }
    }
    return 0;
}

/* The bytes that matter while a container is skipped: quotes and brackets */
static unsigned char structural[256];

/* Past one value (a string, a container by its brackets and strings, or a scalar up to the next `,`, `]` or `}`);
 * 0 if the answer ends inside it */
static int
skip_value(Scan *c)
{
    if (c->i >= c->end) {
        return 0;
    }
    char first = c->s[c->i];
    if (first == '"') {
        return skip_string(c);
    }
    if (first != '{' && first != '[') {
        while (c->i < c->end && c->s[c->i] != ',' && c->s[c->i] != '}' && c->s[c->i] != ']') {
            c->i++;
        }
        return 1;
    }
    const unsigned char *s = (const unsigned char *)c->s;
    Py_ssize_t depth = 0, i = c->i, end = c->end;
    while (i < end) {
        while (i < end && !structural[s[i]]) {
            i++;
        }
        if (i == end) {
            break;
        }
        if (s[i] == '"') {
            c->i = i;
            if (!skip_string(c)) {
                return 0;
            }
            i = c->i;
            continue;
        }
        depth += s[i] == '{' || s[i] == '[' ? 1 : -1;
        i++;
        if (depth == 0) {
            c->i = i;
            return 1;
        }
    }
    return 0;
}

/* An object key: its bytes between the quotes (`*a`, `*b`) and the colon after it; 0 when it holds an escape (it
 * could spell one of the keys looked for another way) or is not a key. */
static int
object_key(Scan *c, Py_ssize_t *a, Py_ssize_t *b)
{
    skip_ws(c);
    if (c->i >= c->end || c->s[c->i] != '"') {
        return 0;
    }
    *a = c->i + 1;
    if (!skip_string(c)) {
        return 0;
    }
    *b = c->i - 1;
    if (memchr(c->s + *a, '\\', (size_t)(*b - *a))) {
        return 0;
    }
    skip_ws(c);
    if (!LIT(c, ":")) {
        return 0;
    }
    skip_ws(c);
    return 1;
}

static int
key_is(const Scan *c, Py_ssize_t a, Py_ssize_t b, const char *name)
{
    size_t len = strlen(name);
    return (size_t)(b - a) == len && memcmp(c->s + a, name, len) == 0;
}

/* After a member's value: `,` (another member follows: 1) or `}` (the object ended: 0); -1 otherwise */
static int
next_member(Scan *c)
{
    skip_ws(c);
    if (LIT(c, ",")) {
        return 1;
    }
    return LIT(c, "}") ? 0 : -1;
}

/* The length of the UTF-8 sequence at `q` (at most `left` bytes) if it is a well-formed one (no overlong form, no
 * surrogate, nothing over U+10FFFF), else 0 */
static int
utf8_len(const unsigned char *q, Py_ssize_t left)
{
    unsigned char b0 = q[0];
    int n;
    unsigned char lo = 0x80, hi = 0xbf; /* the second byte's range */
    if (b0 >= 0xc2 && b0 <= 0xdf) {
        n = 2;
    }
    else if (b0 >= 0xe0 && b0 <= 0xef) {
        n = 3;
        lo = b0 == 0xe0 ? 0xa0 : 0x80;
        hi = b0 == 0xed ? 0x9f : 0xbf;
    }
    else if (b0 >= 0xf0 && b0 <= 0xf4) {
        n = 4;
        lo = b0 == 0xf0 ? 0x90 : 0x80;
        hi = b0 == 0xf4 ? 0x8f : 0xbf;
    }
    else {
        return 0;
    }
    if (left < n || q[1] < lo || q[1] > hi) {
        return 0;
    }
    for (int k = 2; k < n; k++) {
        if (q[k] < 0x80 || q[k] > 0xbf) {
            return 0;
        }
    }
    return n;
}

/* The four hex digits at `q` as `*v`; 0 if they are not four hex digits */
static int
hex4(const char *q, unsigned *v)
{
    *v = 0;
    for (int k = 0; k < 4; k++) {
        char h = q[k];
        int d = -1;
        if (h >= '0' && h <= '9') {
            d = h - '0';
        }
        else if ((h | 0x20) >= 'a' && (h | 0x20) <= 'f') {
            d = (h | 0x20) - 'a' + 10;
        }
        if (d < 0) {
            return 0;
        }
        *v = *v * 16 + (unsigned)d;
    }
    return 1;
}

/* A token string that every JSON parser reads the same way: plain characters, well-formed UTF-8, the two-character
 * escapes and `\uXXXX` outside the surrogates (a surrogate escape, even a proper pair, is left to orjson's parse) */
static int
token_string(Scan *c)
{
    if (!LIT(c, "\"")) {
        return 0;
    }
    const unsigned char *s = (const unsigned char *)c->s;
    while (c->i < c->end) {
        unsigned char ch = s[c->i];
        if (ch == '"') {
            c->i++;
            return 1;
        }
        if (ch < 0x20) {
            return 0;
        }
        if (ch < 0x80 && ch != '\\') {
            c->i++;
        }
        else if (ch >= 0x80) {
            int n = utf8_len(s + c->i, c->end - c->i);
            if (!n) {
                return 0;
            }
            c->i += n;
        }
        else { /* a backslash */
            if (c->end - c->i < 2) {
                return 0;
            }
            char e = c->s[c->i + 1];
            if (e == 'u') {
                unsigned v;
                if (c->end - c->i < 6 || !hex4(c->s + c->i + 2, &v) || (v >= 0xd800 && v <= 0xdfff)) {
                    return 0;
                }
                c->i += 6;
            }
            else if (strchr("\"\\/bfnrt", e) && e) {
                c->i += 2;
            }
            else {
                return 0;
            }
        }
    }
    return 0;
}

/* A JSON integer of at most 18 digits (`0|[1-9]\d{0,17}`: one orjson and the full parse read alike) */
static int
small_int(Scan *c)
{
    if (LIT(c, "0")) {
        return 1;
    }
    Py_ssize_t a = c->i;
    if (!at_digit(c)) {
        return 0;
    }
    digits(c);
    return c->i - a <= 18;
}

/* `{"token":STR,"logprob":NUM(,"bytes":(null|[INT(,INT)*]))?(,"top_logprobs":[])?}`, vLLM's entry at
 * `top_logprobs: 0`, written without whitespace; `num` gets the logprob's span. Stricter than `_LP` in what a string
 * or a byte list may hold: the entry must be JSON that the full parse would read without error. */
static int
answer_entry(Scan *c, Span *num_span)
{
    if (!LIT(c, "{\"token\":") || !token_string(c) || !LIT(c, ",\"logprob\":")) {
        return 0;
    }
    num_span->a = c->i;
    if (!num(c)) {
        return 0;
    }
    num_span->b = c->i;
    if (LIT(c, ",\"bytes\":") && !LIT(c, "null")) {
        if (!LIT(c, "[")) {
            return 0;
        }
        if (!LIT(c, "]")) {
            do {
                if (!small_int(c)) {
                    return 0;
                }
            } while (LIT(c, ","));
            if (!LIT(c, "]")) {
                return 0;
            }
        }
    }
    LIT(c, ",\"top_logprobs\":[]");
    return LIT(c, "}");
}

/* Walks the members of the object at the read position (past its `{`), skipping every value but those of `key` and
 * `key2` (NULL: none), which `inner` and `inner2` read (leaving the position after the value); 0 when the object is
 * not one this reader can be sure of (an escaped key, a repeated one of those two, a value it cannot find the end
 * of). */
typedef int (*Inner)(Scan *c, void *state);

static int
walk_object(Scan *c, const char *key, Inner inner, const char *key2, Inner inner2, void *state)
{
    int found = 0, found2 = 0;
    skip_ws(c);
    if (LIT(c, "}")) {
        return 1;
    }
    for (;;) {
        Py_ssize_t a, b;
        if (!object_key(c, &a, &b)) {
            return 0;
        }
        if (key_is(c, a, b, key)) {
            if (found++ || !inner(c, state)) {
                return 0;
            }
        }
        else if (key2 && key_is(c, a, b, key2)) {
            if (found2++ || !inner2(c, state)) {
                return 0;
            }
        }
        else if (!skip_value(c)) {
            return 0;
        }
        int more = next_member(c);
        if (more < 0) {
            return 0;
        }
        if (!more) {
            return 1;
        }
    }
}

typedef struct {
    Spans nums;                     /* the logprobs' spans */
    Py_ssize_t open, close;         /* the content array's `[` and `]` (close 0: not found) */
    int want_ids;                   /* look for the top-level prompt_token_ids */
    Py_ssize_t ids_open, ids_close; /* its `[` and `]` (close 0: not found) */
    char *ids;                      /* its ints, packed little-endian int32 */
    Py_ssize_t n_ids, cap_ids;
} Cut;

/* The logprob entries (an array of vLLM's entries; anything else is left as it is) */
static int
content_array(Scan *c, void *state)
{
    Cut *cut = state;
    cut->open = c->i;
    if (!LIT(c, "[") || LIT(c, "]")) { /* not an array, or an empty one: nothing to gain */
        c->i = cut->open;
        return skip_value(c);
    }
    do {
        Span span;
        if (!answer_entry(c, &span) || push(&cut->nums, span) < 0) {
            return 0;
        }
    } while (LIT(c, ","));
    cut->close = c->i;
    return LIT(c, "]");
}

static int
logprobs_object(Scan *c, void *state)
{
    if (!LIT(c, "{")) {
        return skip_value(c);
    }
    return walk_object(c, "content", content_array, NULL, NULL, state);
}

static int
first_choice(Scan *c, void *state)
{
    if (!LIT(c, "{")) {
        return skip_value(c);
    }
    return walk_object(c, "logprobs", logprobs_object, NULL, NULL, state);
}

static int
choices_array(Scan *c, void *state)
{
    if (!LIT(c, "[")) {
        return skip_value(c);
    }
    skip_ws(c);
    if (LIT(c, "]")) {
        return 1;
    }
    if (!first_choice(c, state)) {
        return 0;
    }
    for (;;) { /* the other choices */
        skip_ws(c);
        if (LIT(c, "]")) {
            return 1;
        }
        if (!LIT(c, ",")) {
            return 0;
        }
        skip_ws(c);
        if (!skip_value(c)) {
            return 0;
        }
    }
}

/* Append id `v` (< 2**31) to the packed ids, little-endian int32; -1 (MemoryError set) when out of memory */
static inline int
push_id(Cut *cut, uint64_t v)
{
    if (cut->n_ids == cut->cap_ids) {
        Py_ssize_t cap = cut->cap_ids ? 2 * cut->cap_ids : 4096;
        char *p = PyMem_Realloc(cut->ids, (size_t)cap * 4);
        if (!p) {
            PyErr_NoMemory();
            return -1;
        }
        cut->ids = p;
        cut->cap_ids = cap;
    }
    unsigned char *o = (unsigned char *)cut->ids + 4 * cut->n_ids++;
    o[0] = (unsigned char)v;
    o[1] = (unsigned char)(v >> 8);
    o[2] = (unsigned char)(v >> 16);
    o[3] = (unsigned char)(v >> 24);
    return 0;
}

/* The prompt ids: a non-empty array of ints in [0, 2**31) written as JSON writes them (`0|[1-9]\d*`, no
 * whitespace), packed; anything else in such an array declines (the full parse decides, `check_token_data` refuses
 * what is not a token id); another value is left as it is.
 * The answer is a bytes object (`answer_logprobs`), so a NUL, no digit, follows its last byte: a digit run is read to
 * its end with one unsigned compare a byte and no bounds check, its length (at most 10 digits: no 64-bit overflow
 * before the check), value and leading zero checked once it has ended. */
static int
ids_array(Scan *c, void *state)
{
    Cut *cut = state;
    if (!cut->want_ids || c->end - c->i < 2 || c->s[c->i] != '[' || c->s[c->i + 1] < '0' || c->s[c->i + 1] > '9') {
        return skip_value(c);
    }
    cut->ids_open = c->i++;
    const unsigned char *s = (const unsigned char *)c->s, *end = s + c->end, *q = s + c->i;
    for (;;) {
        const unsigned char *p = q;
        unsigned d = (unsigned)*q - '0';
        if (q >= end || d > 9) {
            return 0;
        }
        uint64_t v = d;
        q++;
        while ((d = (unsigned)*q - '0') <= 9) {
            v = v * 10 + d;
            q++;
        }
        if (q > end || q - p > 10 || v >= ((uint64_t)1 << 31) || (*p == '0' && q - p > 1) || push_id(cut, v) < 0) {
            return 0;
        }
        if (q < end && *q == ',') {
            q++;
            continue;
        }
        c->i = q - s;
        cut->ids_close = c->i;
        return LIT(c, "]");
    }
}

/* The answer with the cuts made: the content entries replaced by their logprobs' texts, the prompt ids by nothing */
static PyObject *
rewritten(const char *s, Py_ssize_t len, const Cut *cut)
{
    Py_ssize_t total = len;
    if (cut->close) {
        total -= cut->close - cut->open - 1 - (cut->nums.n - 1);
        for (Py_ssize_t k = 0; k < cut->nums.n; k++) {
            total += cut->nums.v[k].b - cut->nums.v[k].a;
        }
    }
    if (cut->ids_close) {
        total -= cut->ids_close - cut->ids_open - 1;
    }
    PyObject *body = PyBytes_FromStringAndSize(NULL, total);
    if (!body) {
        return NULL;
    }
    char *d = PyBytes_AS_STRING(body);
    Py_ssize_t at = 0;
    for (int pass = 0; pass < 2; pass++) { /* the two cuts in the order they come */
        int lp_first = !cut->ids_close || (cut->close && cut->open < cut->ids_open);
        int which_lp = pass == 0 ? lp_first : !lp_first;
        if (which_lp && cut->close) {
            memcpy(d, s + at, (size_t)(cut->open + 1 - at));
            d += cut->open + 1 - at;
            for (Py_ssize_t k = 0; k < cut->nums.n; k++) {
                if (k) {
                    *d++ = ',';
                }
                Py_ssize_t n = cut->nums.v[k].b - cut->nums.v[k].a;
                memcpy(d, s + cut->nums.v[k].a, (size_t)n);
                d += n;
            }
            at = cut->close;
        }
        else if (!which_lp && cut->ids_close) {
            memcpy(d, s + at, (size_t)(cut->ids_open + 1 - at));
            d += cut->ids_open + 1 - at;
            at = cut->ids_close;
        }
    }
    memcpy(d, s + at, (size_t)(len - at));
    return body;
}

static PyObject *
answer_logprobs(PyObject *module, PyObject *const *args, Py_ssize_t nargs)
{
    (void)module;
    if (nargs < 1 || nargs > 2) {
        PyErr_SetString(PyExc_TypeError, "answer_logprobs(answer, ids=False)");
        return NULL;
    }
    /* read from a bytes object, whose last byte is followed by a NUL (`ids_array`); another buffer is copied into
     * one (the proxy's answers are bytes already) */
    PyObject *answer = PyBytes_Check(args[0]) ? Py_NewRef(args[0]) : PyBytes_FromObject(args[0]);
    if (!answer) {
        return NULL;
    }
    Py_buffer buf;
    if (PyObject_GetBuffer(answer, &buf, PyBUF_SIMPLE) < 0) {
        Py_DECREF(answer);
        return NULL;
    }
    Cut cut;
    memset(&cut, 0, sizeof cut);
    cut.want_ids = nargs > 1 && PyObject_IsTrue(args[1]) > 0;
    Scan c = {buf.buf, buf.len, 0};
    PyObject *out = NULL;
    skip_ws(&c);
    int ok = LIT(&c, "{") && walk_object(&c, "choices", choices_array, "prompt_token_ids", ids_array, &cut);
    skip_ws(&c);
    if (PyErr_Occurred()) {
        goto done;
    }
    if (!ok || c.i != c.end || (!cut.close && !cut.ids_close)) {
        out = Py_NewRef(Py_None);
        goto done;
    }
    PyObject *body = rewritten(buf.buf, buf.len, &cut);
    PyObject *ids = cut.ids_close ? PyBytes_FromStringAndSize(cut.ids, 4 * cut.n_ids) : Py_NewRef(Py_None);
    if (body && ids) {
        out = Py_BuildValue("(NnN)", body, cut.nums.n, ids);
    }
    else {
        Py_XDECREF(body);
        Py_XDECREF(ids);
    }
done:
    PyMem_Free(cut.nums.v);
    PyMem_Free(cut.ids);
    PyBuffer_Release(&buf);
    Py_DECREF(answer);
    return out;
}

static PyMethodDef methods[] = {
    {"lines", lines, METH_O,
     "lines(block) -> list of 8-tuples of bytes: exactly `vllm_stream._LINE.findall(block)`."},
    {"segments", segments, METH_O,
     "segments(block) -> list of bytes (another line) and runs: exactly `vllm_stream._segments_py(block)`, but "
     "a run's rows given as the slice of the block that holds them."},
    {"answer_logprobs", (PyCFunction)(void (*)(void))answer_logprobs, METH_FASTCALL,
     "answer_logprobs(answer) -> (answer', n) or None: a non-streamed vLLM chat answer with the n entries of "
     "choices[0].logprobs.content replaced by their logprob numbers (None: not an answer it can be sure of)."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module_def = {
    PyModuleDef_HEAD_INIT,
    .m_name = "_sse_scan",
    .m_doc = "The C scan of vLLM's SSE lines (see vllm_stream.py).",
    .m_size = -1,
    .m_methods = methods,
};

PyMODINIT_FUNC
PyInit__sse_scan(void)
{
    for (int b = 0; b < 256; b++) {
        plain_char[b] = b >= 0x20 && b != '"' && b != '\\';
        structural[b] = b == '"' || b == '[' || b == ']' || b == '{' || b == '}';
    }
    if (!empty_bytes && !(empty_bytes = PyBytes_FromStringAndSize(NULL, 0))) {
        return NULL;
    }
    for (int k = 0; k < 3; k++) {
        if (!kind_bytes[k] && !(kind_bytes[k] = PyBytes_FromString(kind_names[k]))) {
            return NULL;
        }
    }
    return PyModule_Create(&module_def);
}
