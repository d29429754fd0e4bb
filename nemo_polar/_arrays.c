// SPDX-License-Identifier: Apache-2.0
/* Whole-list work on token ids and logprobs in one pass, for `types.py`, `proxy/store.py` and
 * `proxy/engines/base.py`, which fall back to their pure-Python code when this module is not built:
 *
 *   ids_ok(ids)  -> bool:      a list or tuple of exact ints in [0, 2**31), what `check_token_data` accepts;
 *   encode_i32(values) -> str | None: "b64:i32:" + base64 of the little-endian int32s;
 *   encode_f64(values) -> str | None: "b64:f64:" + base64 of the little-endian float64s.
 *
 * The Python code did each with `struct.pack(fmt, *values)`, which first builds an argument tuple as long as the
 * list (an 8k-token prompt: three 8,000-item tuples per record). Here each item is read once and written straight
 * into the result.
 *
 * The encoders take only what they can encode exactly as `struct` does without calling back into Python: a list or
 * tuple of exact ints in int32 range (i32), of exact floats and ints (f64; an int as `float(int)` rounds it). For
 * anything else (a bool, a numpy scalar, an out-of-range int, a None) they return None and the caller's Python path
 * decides, so the result, or the error raised, is the same as without this module. Nothing here calls Python code
 * while it walks a list, so the list cannot change under it.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>
#include <string.h>

static const char b64_alphabet[] = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
static Py_UCS1 b64_pairs[4096][2]; /* the two characters of each 12 bits: one lookup per half of a 3-byte group */

_Static_assert(sizeof(double) == 8, "float64 is a C double");

#define PREFIX_LEN 8 /* "b64:i32:" and "b64:f64:" */
#define CHUNK 48     /* bytes packed before they are encoded: a multiple of 3 (base64) and of 4 and 8 (items) */

/* Standard base64 (with '=' padding) of `len` bytes into `out`, which has room for 4 * ceil(len / 3) chars. */
static Py_UCS1 *
b64(const unsigned char *in, size_t len, Py_UCS1 *out)
{
    size_t i = 0;
    for (; i + 3 <= len; i += 3) {
        uint32_t v = (uint32_t)in[i] << 16 | (uint32_t)in[i + 1] << 8 | in[i + 2];
        memcpy(out, b64_pairs[v >> 12], 2);
        memcpy(out + 2, b64_pairs[v & 0xfff], 2);
        out += 4;
    }
    if (i < len) {
        uint32_t v = (uint32_t)in[i] << 16 | (i + 1 < len ? (uint32_t)in[i + 1] << 8 : 0);
        *out++ = (Py_UCS1)b64_alphabet[v >> 18];
        *out++ = (Py_UCS1)b64_alphabet[v >> 12 & 63];
        *out++ = i + 1 < len ? (Py_UCS1)b64_alphabet[v >> 6 & 63] : '=';
        *out++ = '=';
    }
    return out;
}

/* The items of a list or tuple (borrowed; NULL when there are none) and their count; -1 for any other object,
 * with no error set. */
static int
items_of(PyObject *seq, PyObject ***items, Py_ssize_t *n)
{
    if (!PyList_Check(seq) && !PyTuple_Check(seq)) {
        return -1;
    }
    *items = PySequence_Fast_ITEMS(seq);
    *n = PySequence_Fast_GET_SIZE(seq);
    return 0;
}

/* The value of an exact int of at most one digit (|v| < 2**PyLong_SHIFT, 2**30 on usual builds: every token id of
 * any vocabulary), read without a function call; 0 for a larger one (then `PyLong_AsLongAndOverflow` reads it). */
static inline int
small_int(PyObject *item, long *v)
{
#if PY_VERSION_HEX >= 0x030C0000
    if (PyUnstable_Long_IsCompact((PyLongObject *)item)) {
        *v = (long)PyUnstable_Long_CompactValue((PyLongObject *)item);
        return 1;
    }
#else
    Py_ssize_t size = Py_SIZE(item); /* the digit count, negative for a negative int */
    if (size == 0) {
        *v = 0;
        return 1;
    }
    if (size == 1 || size == -1) {
        *v = (long)size * (long)((PyLongObject *)item)->ob_digit[0];
        return 1;
    }
#endif
    return 0;
}

/* An int32 (as its two's-complement bits) if `item` is an exact int in [lo, 2**31); else -1 with no error set. */
static int
int32_of(PyObject *item, long lo, uint32_t *bits)
{
    if (!PyLong_CheckExact(item)) {
        return -1;
    }
    long v;
    if (small_int(item, &v) && v >= lo) { /* |v| < 2**30 (or 2**15) <= 2**31 */
        *bits = (uint32_t)(int32_t)v;
        return 0;
    }
    int overflow;
    v = PyLong_AsLongAndOverflow(item, &overflow); /* an exact int: no Python code runs */
    if (v == -1 && PyErr_Occurred()) {
        PyErr_Clear();
        return -1;
    }
    if (overflow || v < lo || v > INT32_MAX) {
        return -1;
    }
    *bits = (uint32_t)(int32_t)v;
    return 0;
}

static PyObject *
ids_ok(PyObject *Py_UNUSED(module), PyObject *ids)
{
    PyObject **items;
    Py_ssize_t n;
    if (items_of(ids, &items, &n) < 0) {
        Py_RETURN_FALSE;
    }
    for (Py_ssize_t i = 0; i < n; i++) {
        uint32_t bits;
        if (int32_of(items[i], 0, &bits) < 0) {
            Py_RETURN_FALSE;
        }
    }
    Py_RETURN_TRUE;
}

/* The 8-byte little-endian float64 of `item` if it is an exact float or exact int that a float holds (as
 * `struct.pack("<d", item)` writes it, NaN payloads and signed zeros included); else -1 with no error set. */
static int
float64_of(PyObject *item, uint64_t *bits)
{
    double d;
    if (PyFloat_CheckExact(item)) {
        d = PyFloat_AS_DOUBLE(item);
    }
    else if (PyLong_CheckExact(item)) {
        d = PyLong_AsDouble(item); /* correctly rounded, as float(item); OverflowError past the float range */
        if (d == -1.0 && PyErr_Occurred()) {
            PyErr_Clear();
            return -1;
        }
    }
    else {
        return -1;
    }
    memcpy(bits, &d, sizeof d); /* a double's bytes in the host's integer order (IEEE hosts), written out LE below */
    return 0;
}

/* `prefix` + base64 of the items, each `size` (4: int32, 8: float64) little-endian bytes; None when `values` is
 * not a list or tuple or an item is not one `int32_of` / `float64_of` takes. */
static PyObject *
encode(PyObject *values, const char *prefix, int size)
{
    PyObject **items;
    Py_ssize_t n;
    if (items_of(values, &items, &n) < 0) {
        Py_RETURN_NONE;
    }
    /* 4 chars per 3 bytes, rounded up; n <= PY_SSIZE_T_MAX / sizeof(PyObject *), so 8n fits but 4/3 of it may not */
    size_t nbytes = (size_t)n * (size_t)size;
    size_t groups = nbytes / 3 + (nbytes % 3 != 0);
    if (groups > ((size_t)PY_SSIZE_T_MAX - PREFIX_LEN) / 4) {
        return PyErr_NoMemory();
    }
    PyObject *out = PyUnicode_New((Py_ssize_t)(PREFIX_LEN + 4 * groups), 127);
    if (!out) {
        return NULL;
    }
    Py_UCS1 *w = PyUnicode_1BYTE_DATA(out);
    memcpy(w, prefix, PREFIX_LEN);
    w += PREFIX_LEN;
    unsigned char buf[CHUNK];
    size_t used = 0;
    for (Py_ssize_t i = 0; i < n; i++) {
        uint64_t bits;
        if (size == 4) {
            uint32_t b32;
            if (int32_of(items[i], INT32_MIN, &b32) < 0) {
                Py_DECREF(out);
                Py_RETURN_NONE;
            }
            bits = b32;
        }
        else if (float64_of(items[i], &bits) < 0) {
            Py_DECREF(out);
            Py_RETURN_NONE;
        }
        for (int k = 0; k < size; k++) {
            buf[used++] = (unsigned char)(bits >> (8 * k));
        }
        if (used == CHUNK) {
            w = b64(buf, CHUNK, w);
            used = 0;
        }
    }
    b64(buf, used, w);
    return out;
}

static PyObject *
encode_i32(PyObject *Py_UNUSED(module), PyObject *values)
{
    return encode(values, "b64:i32:", 4);
}

static PyObject *
encode_f64(PyObject *Py_UNUSED(module), PyObject *values)
{
    return encode(values, "b64:f64:", 8);
}

/* "b64:i32:" + base64 of a buffer that already holds little-endian int32s (`types.TokenIds`' bytes) */
static PyObject *
encode_i32_packed(PyObject *Py_UNUSED(module), PyObject *arg)
{
    Py_buffer buf;
    if (PyObject_GetBuffer(arg, &buf, PyBUF_SIMPLE) < 0) {
        return NULL;
    }
    size_t nbytes = (size_t)buf.len;
    size_t groups = nbytes / 3 + (nbytes % 3 != 0);
    PyObject *out = NULL;
    if (nbytes % 4) {
        PyErr_SetString(PyExc_ValueError, "not a whole number of int32s");
    }
    else if (groups > ((size_t)PY_SSIZE_T_MAX - PREFIX_LEN) / 4) {
        PyErr_NoMemory();
    }
    else if ((out = PyUnicode_New((Py_ssize_t)(PREFIX_LEN + 4 * groups), 127))) {
        Py_UCS1 *w = PyUnicode_1BYTE_DATA(out);
        memcpy(w, "b64:i32:", PREFIX_LEN);
        b64(buf.buf, nbytes, w + PREFIX_LEN);
    }
    PyBuffer_Release(&buf);
    return out;
}

static PyMethodDef methods[] = {
    {"ids_ok", ids_ok, METH_O,
     "ids_ok(ids) -> bool: `ids` is a list or tuple of exact ints (no bools) in [0, 2**31), the stored int32 range."},
    {"encode_i32", encode_i32, METH_O,
     "encode_i32(values) -> str | None: \"b64:i32:\" + base64 of the little-endian int32s, or None unless `values` "
     "is a list or tuple of exact ints in int32 range."},
    {"encode_i32_packed", encode_i32_packed, METH_O,
     "encode_i32_packed(data) -> str: \"b64:i32:\" + base64 of `data`, little-endian int32s already."},
    {"encode_f64", encode_f64, METH_O,
     "encode_f64(values) -> str | None: \"b64:f64:\" + base64 of the little-endian float64s, or None unless "
     "`values` is a list or tuple of exact floats and ints a float holds."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module_def = {
    PyModuleDef_HEAD_INIT,
    .m_name = "_arrays",
    .m_doc = "One-pass checks and compact base64 encodings of token-id and logprob lists (see types.py).",
    .m_size = -1,
    .m_methods = methods,
};

PyMODINIT_FUNC
PyInit__arrays(void)
{
    for (int v = 0; v < 4096; v++) {
        b64_pairs[v][0] = (Py_UCS1)b64_alphabet[v >> 6];
        b64_pairs[v][1] = (Py_UCS1)b64_alphabet[v & 63];
    }
    return PyModule_Create(&module_def);
}
