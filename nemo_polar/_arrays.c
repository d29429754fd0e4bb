// SPDX-License-Identifier: Apache-2.0
/* Whole-list work on token ids and logprobs in one pass, for `types.py`, `proxy/store.py` and
 * `proxy/engines/base.py`, which fall back to their pure-Python code when this module is not built:
 *
 *   ids_ok(ids)  -> bool:      a list or tuple of exact ints in [0, 2**31), what `check_token_data` accepts;
 *   encode_i32(values) -> str | None: "b64:i32:" + base64 of the little-endian int32s;
 *   encode_f64(values) -> str | None: "b64:f64:" + base64 of the little-endian float64s;
 *   crc32(data, value=0) -> int: zlib's crc32, the payload file's checksum (`proxy/payloads.py`);
 *   same_json(a, b) -> bool: whether two values of JSON types serialise to the same JSON (`proxy/deltas.py`).
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
 *
 * Their base64 takes 24 bytes a step (32 chars) with AVX2 where the CPU has it (checked at import; `b64_avx2`), the
 * rest, and everything where there is no AVX2, through a table of the two characters of each 12 bits. The private
 * `_set_simd(False)` turns the AVX2 step off, so the tests can hold both to `base64.b64encode`.
 *
 * crc32 gives zlib.crc32's value (the same polynomial, init and final xor) at about 4x its speed on a large buffer:
 * where the CPU has carry-less multiplication (x86-64 PCLMULQDQ, checked at import: `CRC32_SIMD`), 64 bytes a step
 * are folded four 16-byte lanes at a time, then reduced to 32 bits (Barrett), the folding of Intel's white paper
 * "Fast CRC Computation for Generic Polynomials Using PCLMULQDQ Instruction" (Gopal et al., 2009) that zlib-ng and
 * Chromium's zlib also use; the last bytes, and every byte where there is no such instruction, go through a
 * byte-at-a-time table. `proxy/payloads.py` uses it only when `CRC32_SIMD` is true, else zlib.crc32.
 *
 * same_json is `==` without Python's numeric tower: the two values must have exactly the same types all the way down
 * (so `1`, `1.0` and `True` differ, as their JSON does), floats the same bits (`0.0` and `-0.0` differ), dicts the
 * same keys in the same order, strings the same code points. It is True only when the JSON is the same; anything
 * else (another type, nesting deeper than 256) is False, which the caller takes as "not the same". No Python code
 * runs during the walk (exact ints compare in C), so nothing can change under it.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>
#include <string.h>

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#include <immintrin.h>
#define CRC32_FOLD 1
#define B64_AVX2 1
#endif

static const char b64_alphabet[] = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
static Py_UCS1 b64_pairs[4096][2]; /* the two characters of each 12 bits: one lookup per half of a 3-byte group */

_Static_assert(sizeof(double) == 8, "float64 is a C double");

#define PREFIX_LEN 8 /* "b64:i32:" and "b64:f64:" */
#define CHUNK 48     /* bytes packed before they are encoded: a multiple of 3 (base64) and of 4 and 8 (items) */

#ifdef B64_AVX2
static int b64_avx2_cpu; /* the CPU has AVX2 (checked at import) */
static int b64_avx2_ok;  /* ... and base64 uses it: `_set_simd(False)` turns it off for the tests */

/* The base64 of whole 24-byte blocks, 32 chars each, while a whole block is left: returns the bytes it took (a
 * multiple of 24). Each 128-bit half takes 12 bytes, four 3-byte groups, one to a 32-bit lane: the low half loads
 * in[0..15] and uses bytes 0..11, the high half loads in[8..23] and uses bytes 4..15, so no load reads past the block.
 * A group (a, b, c) is shuffled into its lane as the bytes [b, a, c, b]: its low 16 bits are a:b, its high 16 bits
 * b:c. The four 6-bit indices are then bits 10..15 and 4..9 of the low half, 6..11 and 0..5 of the high half; the
 * multiply-high moves the first and third down to bits 0..5 of their halves (x * 2^6 >> 16, x * 2^10 >> 16), the
 * multiply-low moves the second and fourth up to bits 8..13 (x * 2^4, x * 2^8), and or-ing them puts the lane's
 * indices in output order, one per byte. An index becomes its character by adding an offset that depends on its
 * range (A-Z, a-z, 0-9, '+', '/'), taken from a 16-entry table with a byte shuffle: the table row is index - 51
 * (saturating at 0) for 52..63, 0 for 26..51, and 13 for 0..25. */
__attribute__((target("avx2"))) static size_t
b64_avx2(const unsigned char *in, size_t len, Py_UCS1 *out)
{
    const __m256i groups = _mm256_setr_epi8(1, 0, 2, 1, 4, 3, 5, 4, 7, 6, 8, 7, 10, 9, 11, 10,     /* low half */
                                            5, 4, 6, 5, 8, 7, 9, 8, 11, 10, 12, 11, 14, 13, 15, 14); /* high half */
    const __m256i hi_bits = _mm256_set1_epi32(0x0FC0FC00);   /* the first and third index */
    const __m256i hi_mul = _mm256_set1_epi32(0x04000040);    /* >> 6 in the high half, >> 10 in the low one */
    const __m256i lo_bits = _mm256_set1_epi32(0x003F03F0);   /* the second and fourth index */
    const __m256i lo_mul = _mm256_set1_epi32(0x01000010);    /* << 8 in the high half, << 4 in the low one */
    const __m256i offsets = _mm256_setr_epi8('a' - 26, '0' - 52, '0' - 52, '0' - 52, '0' - 52, '0' - 52, '0' - 52,
                                             '0' - 52, '0' - 52, '0' - 52, '0' - 52, '+' - 62, '/' - 63, 'A', 0, 0,
                                             'a' - 26, '0' - 52, '0' - 52, '0' - 52, '0' - 52, '0' - 52, '0' - 52,
                                             '0' - 52, '0' - 52, '0' - 52, '0' - 52, '+' - 62, '/' - 63, 'A', 0, 0);
    const __m256i v51 = _mm256_set1_epi8(51), v26 = _mm256_set1_epi8(26), v13 = _mm256_set1_epi8(13);
    size_t i = 0;
    for (; i + 24 <= len; i += 24) {
        __m128i lo = _mm_loadu_si128((const __m128i *)(in + i));
        __m128i hi = _mm_loadu_si128((const __m128i *)(in + i + 8));
        __m256i v = _mm256_inserti128_si256(_mm256_castsi128_si256(lo), hi, 1);
        v = _mm256_shuffle_epi8(v, groups);
        __m256i idx = _mm256_or_si256(_mm256_mulhi_epu16(_mm256_and_si256(v, hi_bits), hi_mul),
                                      _mm256_mullo_epi16(_mm256_and_si256(v, lo_bits), lo_mul));
        __m256i row = _mm256_or_si256(_mm256_subs_epu8(idx, v51),
                                      _mm256_and_si256(_mm256_cmpgt_epi8(v26, idx), v13));
        _mm256_storeu_si256((__m256i *)(out + i / 3 * 4), _mm256_add_epi8(idx, _mm256_shuffle_epi8(offsets, row)));
    }
    return i;
}
#endif

/* Standard base64 (with '=' padding) of `len` bytes into `out`, which has room for 4 * ceil(len / 3) chars. */
static Py_UCS1 *
b64(const unsigned char *in, size_t len, Py_UCS1 *out)
{
    size_t i = 0;
#ifdef B64_AVX2
    if (b64_avx2_ok && len >= 24) {
        i = b64_avx2(in, len, out);
        out += i / 3 * 4;
    }
#endif
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

/* -- crc32 ------------------------------------------------------------------------------------------------------- */

static uint32_t crc_table[256]; /* the reflected polynomial 0xEDB88320, one byte at a time (filled at import) */
static int crc_fold_ok;         /* the CPU has PCLMULQDQ and SSE4.1 (checked at import) */

/* zlib's register update over `len` bytes: `reg` is the inverted crc */
static uint32_t
crc_bytes(uint32_t reg, const unsigned char *p, size_t len)
{
    while (len--) {
        reg = crc_table[(reg ^ *p++) & 0xff] ^ (reg >> 8);
    }
    return reg;
}

#ifdef CRC32_FOLD
/* The register after `len` bytes (len >= 64, a multiple of 16), `reg` the register before them. The constants are
 * x^k mod P for the fold distances, bit-reflected and shifted left by one (k1/k2: 512 +/- 32 bits, four lanes at
 * once; k3/k4: 128 +/- 32, one lane into the next; k5: 64; then P itself and floor(x^64 / P) for the Barrett step). */
__attribute__((target("pclmul,sse4.1"))) static uint32_t
crc_fold(uint32_t reg, const unsigned char *p, size_t len)
{
    const __m128i k1k2 = _mm_set_epi64x(0x01c6e41596LL, 0x0154442bd4LL);
    const __m128i k3k4 = _mm_set_epi64x(0x00ccaa009eLL, 0x01751997d0LL);
    const __m128i k5 = _mm_set_epi64x(0, 0x0163cd6124LL);
    const __m128i poly = _mm_set_epi64x(0x01f7011641LL, 0x01db710641LL);
    const __m128i low32 = _mm_setr_epi32(~0, 0, ~0, 0);
    __m128i x1 = _mm_loadu_si128((const __m128i *)(p + 0x00));
    __m128i x2 = _mm_loadu_si128((const __m128i *)(p + 0x10));
    __m128i x3 = _mm_loadu_si128((const __m128i *)(p + 0x20));
    __m128i x4 = _mm_loadu_si128((const __m128i *)(p + 0x30));
    __m128i t1, t2, t3, t4;
    x1 = _mm_xor_si128(x1, _mm_cvtsi32_si128((int)reg));
    p += 64;
    len -= 64;
    while (len >= 64) { /* each lane moves 512 bits on and takes in the next 16 bytes of its own */
        t1 = _mm_clmulepi64_si128(x1, k1k2, 0x00);
        t2 = _mm_clmulepi64_si128(x2, k1k2, 0x00);
        t3 = _mm_clmulepi64_si128(x3, k1k2, 0x00);
        t4 = _mm_clmulepi64_si128(x4, k1k2, 0x00);
        x1 = _mm_clmulepi64_si128(x1, k1k2, 0x11);
        x2 = _mm_clmulepi64_si128(x2, k1k2, 0x11);
        x3 = _mm_clmulepi64_si128(x3, k1k2, 0x11);
        x4 = _mm_clmulepi64_si128(x4, k1k2, 0x11);
        x1 = _mm_xor_si128(_mm_xor_si128(x1, t1), _mm_loadu_si128((const __m128i *)(p + 0x00)));
        x2 = _mm_xor_si128(_mm_xor_si128(x2, t2), _mm_loadu_si128((const __m128i *)(p + 0x10)));
        x3 = _mm_xor_si128(_mm_xor_si128(x3, t3), _mm_loadu_si128((const __m128i *)(p + 0x20)));
        x4 = _mm_xor_si128(_mm_xor_si128(x4, t4), _mm_loadu_si128((const __m128i *)(p + 0x30)));
        p += 64;
        len -= 64;
    }
    /* the four lanes into one: each folded 128 bits into the next */
    t1 = _mm_clmulepi64_si128(x1, k3k4, 0x00);
    x1 = _mm_xor_si128(_mm_xor_si128(_mm_clmulepi64_si128(x1, k3k4, 0x11), t1), x2);
    t1 = _mm_clmulepi64_si128(x1, k3k4, 0x00);
    x1 = _mm_xor_si128(_mm_xor_si128(_mm_clmulepi64_si128(x1, k3k4, 0x11), t1), x3);
    t1 = _mm_clmulepi64_si128(x1, k3k4, 0x00);
    x1 = _mm_xor_si128(_mm_xor_si128(_mm_clmulepi64_si128(x1, k3k4, 0x11), t1), x4);
    while (len >= 16) { /* the remaining 16-byte blocks, one at a time */
        t1 = _mm_clmulepi64_si128(x1, k3k4, 0x00);
        x1 = _mm_xor_si128(_mm_xor_si128(_mm_clmulepi64_si128(x1, k3k4, 0x11), t1),
                           _mm_loadu_si128((const __m128i *)p));
        p += 16;
        len -= 16;
    }
    /* 128 bits to 64 */
    t2 = _mm_clmulepi64_si128(x1, k3k4, 0x10);
    x1 = _mm_xor_si128(_mm_srli_si128(x1, 8), t2);
    t2 = _mm_srli_si128(x1, 4);
    x1 = _mm_xor_si128(_mm_clmulepi64_si128(_mm_and_si128(x1, low32), k5, 0x00), t2);
    /* Barrett reduction to 32 bits */
    t2 = _mm_clmulepi64_si128(_mm_and_si128(x1, low32), poly, 0x10);
    t2 = _mm_clmulepi64_si128(_mm_and_si128(t2, low32), poly, 0x00);
    x1 = _mm_xor_si128(x1, t2);
    return (uint32_t)_mm_extract_epi32(x1, 1);
}
#endif

static PyObject *
crc32(PyObject *Py_UNUSED(module), PyObject *args)
{
    Py_buffer buf;
    unsigned int value = 0;
    if (!PyArg_ParseTuple(args, "y*|I:crc32", &buf, &value)) {
        return NULL;
    }
    const unsigned char *p = buf.buf;
    size_t len = (size_t)buf.len;
    uint32_t reg = ~(uint32_t)value;
#ifdef CRC32_FOLD
    if (crc_fold_ok && len >= 64) {
        size_t whole = len & ~(size_t)15;
        reg = crc_fold(reg, p, whole);
        p += whole;
        len -= whole;
    }
#endif
    reg = crc_bytes(reg, p, len);
    PyBuffer_Release(&buf);
    return PyLong_FromUnsignedLong((unsigned long)~reg);
}

static int
same_json_walk(PyObject *a, PyObject *b, int depth)
{
    if (a == b) {
        return 1;
    }
    PyTypeObject *t = Py_TYPE(a);
    if (t != Py_TYPE(b) || depth > 256) {
        return 0;
    }
    if (t == &PyUnicode_Type) {
        Py_ssize_t n = PyUnicode_GET_LENGTH(a);
        int kind = PyUnicode_KIND(a);
        return n == PyUnicode_GET_LENGTH(b) && kind == (int)PyUnicode_KIND(b) &&
               memcmp(PyUnicode_DATA(a), PyUnicode_DATA(b), (size_t)n * (size_t)kind) == 0;
    }
    if (t == &PyLong_Type) {
        return PyObject_RichCompareBool(a, b, Py_EQ) == 1;
    }
    if (t == &PyFloat_Type) {
        double x = PyFloat_AS_DOUBLE(a), y = PyFloat_AS_DOUBLE(b);
        return memcmp(&x, &y, sizeof x) == 0;
    }
    if (t == &PyList_Type || t == &PyTuple_Type) {
        Py_ssize_t n = PySequence_Fast_GET_SIZE(a);
        if (n != PySequence_Fast_GET_SIZE(b)) {
            return 0;
        }
        PyObject **xa = PySequence_Fast_ITEMS(a), **xb = PySequence_Fast_ITEMS(b);
        for (Py_ssize_t i = 0; i < n; i++) {
            if (!same_json_walk(xa[i], xb[i], depth + 1)) {
                return 0;
            }
        }
        return 1;
    }
    if (t == &PyDict_Type) {
        if (PyDict_GET_SIZE(a) != PyDict_GET_SIZE(b)) {
            return 0;
        }
        Py_ssize_t pa = 0, pb = 0;
        PyObject *ka, *va, *kb, *vb;
        while (PyDict_Next(a, &pa, &ka, &va)) {  /* insertion order, the order JSON is written in */
            if (!PyDict_Next(b, &pb, &kb, &vb) || !same_json_walk(ka, kb, depth + 1) ||
                !same_json_walk(va, vb, depth + 1)) {
                return 0;
            }
        }
        return 1;
    }
    return 0;  /* True, False and None are singletons (equal only when identical, above); any other type: not known */
}

static PyObject *
same_json(PyObject *Py_UNUSED(module), PyObject *args)
{
    PyObject *a, *b;
    if (!PyArg_ParseTuple(args, "OO:same_json", &a, &b)) {
        return NULL;
    }
    return PyBool_FromLong(same_json_walk(a, b, 0));
}

static PyObject *
set_simd(PyObject *Py_UNUSED(module), PyObject *on)
{
    int want = PyObject_IsTrue(on);
    if (want < 0) {
        return NULL;
    }
#ifdef B64_AVX2
    b64_avx2_ok = want && b64_avx2_cpu;
    return PyBool_FromLong(b64_avx2_ok);
#else
    Py_RETURN_FALSE;
#endif
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
    {"crc32", crc32, METH_VARARGS,
     "crc32(data, value=0) -> int: zlib.crc32(data, value), folded with carry-less multiplication where the CPU "
     "has it (CRC32_SIMD)."},
    {"_set_simd", set_simd, METH_O,
     "_set_simd(on) -> bool: base64 with AVX2 from now on if `on` and the CPU has it (tests run both paths); returns "
     "whether it is on."},
    {"same_json", same_json, METH_VARARGS,
     "same_json(a, b) -> bool: `a` and `b` serialise to the same JSON: the same types all the way down (1, 1.0 and "
     "True differ), floats the same bits, dicts the same keys in the same order."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module_def = {
    PyModuleDef_HEAD_INIT,
    .m_name = "_arrays",
    .m_doc = "One-pass checks and compact base64 encodings of token-id and logprob lists (see types.py), and a "
             "faster zlib.crc32 (proxy/payloads.py).",
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
    for (uint32_t n = 0; n < 256; n++) {
        uint32_t c = n;
        for (int k = 0; k < 8; k++) {
            c = c & 1 ? 0xEDB88320u ^ (c >> 1) : c >> 1;
        }
        crc_table[n] = c;
    }
#ifdef CRC32_FOLD
    __builtin_cpu_init();
    crc_fold_ok = __builtin_cpu_supports("pclmul") && __builtin_cpu_supports("sse4.1");
#endif
#ifdef B64_AVX2
    b64_avx2_cpu = b64_avx2_ok = __builtin_cpu_supports("avx2");
#endif
    PyObject *mod = PyModule_Create(&module_def);
    if (mod && PyModule_AddObjectRef(mod, "CRC32_SIMD", crc_fold_ok ? Py_True : Py_False) < 0) {
        Py_DECREF(mod);
        return NULL;
    }
    return mod;
}
