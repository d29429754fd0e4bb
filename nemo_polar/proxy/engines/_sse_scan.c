// SPDX-License-Identifier: Apache-2.0
/* `lines(block)`: exactly what `vllm_stream._LINE.findall(block)` returns, without the regex engine.
 *
 * The proxy reads every line of a long stream; Python's `re` spends ~3 ns per byte on it, most of the proxy's own
 * CPU for a 512-token answer. The pattern is deterministic (possessive quantifiers, and every alternation's
 * branches differ in their first byte or in the byte that follows them), so a hand-written recursive descent
 * over the fixed key order decides the same match: each function below mirrors one piece of the pattern and is
 * named after it. Any change to `_TOKEN_CHUNK` in vllm_stream.py must be made here too; tests/proxy/test_sse_scan.py
 * compares both on a random corpus.
 *
 * Every matcher works inside one line (`end` is the line's '\n' or the end of the block): nothing in a token
 * chunk can match '\n' (string characters exclude control bytes, `\\.` excludes '\n'), so bounding the scan at the
 * line end decides the same match as the regex and makes every read bounds-checked by one comparison.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
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

/* `(?:,"logprobs":(?:null|\{"content":\[(_LP1(?:,_LP)*+)?+\]\}))?+`; g[0]: entries, g[1]: first logprob */
static void
logprobs(Scan *c, Span g[2])
{
    Py_ssize_t save = c->i;
    if (!LIT(c, ",\"logprobs\":") || LIT(c, "null")) {
        return;
    }
    int ok = LIT(c, "{\"content\":[");
    if (ok) {
        Py_ssize_t a = c->i;
        if (logprob_entry(c, &g[1])) {
            for (;;) {
                Py_ssize_t next = c->i;
                if (!(LIT(c, ",") && logprob_entry(c, NULL))) {
                    c->i = next;
                    break;
                }
            }
            g[0].a = a;
            g[0].b = c->i;
        }
        else {
            c->i = a;
            g[1].a = -1;
        }
        ok = LIT(c, "]}");
    }
    if (!ok) {
        c->i = save;
        g[0].a = g[1].a = -1;
    }
}

/* `_TOKEN_CHUNK`; `*kind`: an index into kind_names; g: text, logprob entries, first logprob, finish, ids */
static int
token_chunk(Scan *c, int *kind, Span g[5])
{
    if (!LIT(c, "{\"id\":") || !str(c, NULL) ||
        !LIT(c, ",\"object\":\"chat.completion.chunk\",\"created\":") || !digits(c) || !LIT(c, ",\"model\":") ||
        !str(c, NULL) || !LIT(c, ",\"choices\":[{\"index\":0,\"delta\":{")) {
        return 0;
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
    logprobs(c, &g[1]);

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
            g[4].a = -1;
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

/* The row of one `data:` line starting at `p` (after `data:` and its optional space), ending at `end`. */
static PyObject *
row(const char *s, Py_ssize_t p, Py_ssize_t end)
{
    Span g[NGROUPS];
    for (int k = 0; k < NGROUPS; k++) {
        g[k].a = -1;
    }
    Scan c = {s, end, p};
    Span parts[5] = {{-1, -1}, {-1, -1}, {-1, -1}, {-1, -1}, {-1, -1}};
    /* `(_TOKEN_CHUNK)\r?$`, else `([^\n]*+)`: the rest of the line, groups 1-7 not taking part */
    int kind = -1;
    if (token_chunk(&c, &kind, parts) && (c.i == end || (c.i + 1 == end && s[c.i] == '\r'))) {
        g[0].a = p;
        g[0].b = c.i;
        for (int k = 0; k < 5; k++) {
            g[k + 2] = parts[k];
        }
    }
    else {
        kind = -1;
        g[7].a = p;
        g[7].b = end;
    }
    PyObject *t = PyTuple_New(NGROUPS);
    if (!t) {
        return NULL;
    }
    for (int k = 0; k < NGROUPS; k++) {
        PyObject *v = (k == 1 && kind >= 0) ? Py_NewRef(kind_bytes[kind]) : slice(s, g[k]);
        if (!v) {
            Py_DECREF(t);
            return NULL;
        }
        PyTuple_SET_ITEM(t, k, v);
    }
    return t;
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
    Py_ssize_t n = buf.len;
    PyObject *out = PyList_New(0);
    /* `^` under re.M: the start of the block and every byte after a '\n'; a match always ends at a line end, so
     * findall's next search starts there and finds nothing before the next line */
    for (Py_ssize_t pos = 0; out && pos < n;) {
        const char *nl = memchr(s + pos, '\n', (size_t)(n - pos));
        Py_ssize_t end = nl ? nl - s : n;
        if (end - pos >= 5 && memcmp(s + pos, "data:", 5) == 0) {
            Py_ssize_t p = pos + 5;
            if (p < end && s[p] == ' ') {
                p++;
            }
            PyObject *t = row(s, p, end);
            if (!t || PyList_Append(out, t) < 0) {
                Py_XDECREF(t);
                Py_CLEAR(out);
                break;
            }
            Py_DECREF(t);
        }
        pos = end + 1;
    }
    PyBuffer_Release(&buf);
    return out;
}

static PyMethodDef methods[] = {
    {"lines", lines, METH_O,
     "lines(block) -> list of 8-tuples of bytes: exactly `vllm_stream._LINE.findall(block)`."},
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
