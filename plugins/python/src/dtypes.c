/* dtypes and shapes: the buffer-protocol format and array-interface typestr
 * of each gser dtype, and the checks of extents and strides that the
 * encoder, the decoder and the __cuda_array_interface__ reader share.
 *
 * A leaf: plain functions of their arguments.
 */
#include "pygser.h" /* first: Python.h sets the feature macros */

#include <stdlib.h>
#include <string.h>

static const char *const dtype_formats[GSER_DTYPE_COUNT] = {
    [GSER_DTYPE_BYTES] = "B",      [GSER_DTYPE_BOOL] = "?",      [GSER_DTYPE_INT8] = "b",
    [GSER_DTYPE_INT16] = "h",      [GSER_DTYPE_INT32] = "i",     [GSER_DTYPE_INT64] = "q",
    [GSER_DTYPE_UINT8] = "B",      [GSER_DTYPE_UINT16] = "H",    [GSER_DTYPE_UINT32] = "I",
    [GSER_DTYPE_UINT64] = "Q",     [GSER_DTYPE_FLOAT16] = "e",   [GSER_DTYPE_BFLOAT16] = NULL,
    [GSER_DTYPE_FLOAT32] = "f",    [GSER_DTYPE_FLOAT64] = "d",   [GSER_DTYPE_COMPLEX64] = "Zf",
    [GSER_DTYPE_COMPLEX128] = "Zd",
};

const char *pg_dtype_format(gser_dtype_t dtype)
{
    if ((unsigned)dtype >= GSER_DTYPE_COUNT)
        return NULL;
    /* numpy calls a C long "int64" where long has 64 bits: use its letter. */
    if (sizeof(long) == 8 && dtype == GSER_DTYPE_INT64)
        return "l";
    if (sizeof(long) == 8 && dtype == GSER_DTYPE_UINT64)
        return "L";
    return dtype_formats[dtype];
}

gser_dtype_t pg_int_dtype(Py_ssize_t size, bool is_signed)
{
    switch (size) {
    case 1: return is_signed ? GSER_DTYPE_INT8 : GSER_DTYPE_UINT8;
    case 2: return is_signed ? GSER_DTYPE_INT16 : GSER_DTYPE_UINT16;
    case 4: return is_signed ? GSER_DTYPE_INT32 : GSER_DTYPE_UINT32;
    case 8: return is_signed ? GSER_DTYPE_INT64 : GSER_DTYPE_UINT64;
    default: return GSER_DTYPE_COUNT;
    }
}

/* "<f4", "|u1", "|b1", ... -> a dtype; GSER_DTYPE_COUNT if none fits. */
gser_dtype_t pg_typestr_dtype(const char *ts, bool *big)
{
    *big = false;
    if (!ts || !strchr("<>|=", ts[0]) || !ts[0] || !ts[1])
        return GSER_DTYPE_COUNT;
    char kind = ts[1];
    char *end;
    long size = strtol(ts + 2, &end, 10);
    if (end == ts + 2 || *end != '\0' || size <= 0 || size > 16)
        return GSER_DTYPE_COUNT;
    *big = ts[0] == '>' && size > 1;
    switch (kind) {
    case 'b': return size == 1 ? GSER_DTYPE_BOOL : GSER_DTYPE_COUNT;
    case 'i': return pg_int_dtype(size, true);
    case 'u': return pg_int_dtype(size, false);
    case 'f':
        return size == 2 ? GSER_DTYPE_FLOAT16 : size == 4 ? GSER_DTYPE_FLOAT32 : size == 8 ? GSER_DTYPE_FLOAT64
                                                                                        : GSER_DTYPE_COUNT;
    case 'c': return size == 8 ? GSER_DTYPE_COMPLEX64 : size == 16 ? GSER_DTYPE_COMPLEX128 : GSER_DTYPE_COUNT;
    default: return GSER_DTYPE_COUNT;
    }
}

int pg_extents_total(const int64_t *shape, int nd, size_t elem_size, uint64_t *total, const char **why)
{
    /* numpy (and any strided consumer) multiplies the extents it is given
     * even when one is 0: (0, 2**63-1) holds no bytes, and still no array
     * can have that shape. So the product of the non-zero extents must fit too. */
    uint64_t n = elem_size, fit = elem_size;
    for (int d = 0; d < nd; d++) {
        if (shape[d] < 0) {
            *why = "a bad extent in the shape";
            return -1;
        }
        uint64_t x = (uint64_t)shape[d];
        if (x && fit > UINT64_MAX / x) {
            *why = "too large for Python (the product of the extents overflows)";
            return -1;
        }
        n *= x;
        fit *= x ? x : 1;
    }
    if (fit > (uint64_t)PY_SSIZE_T_MAX) {
        *why = "too large for Python";
        return -1;
    }
    *total = n;
    return 0;
}

bool pg_c_contiguous(const int64_t *shape, const int64_t *strides, int nd, int64_t unit)
{
    int64_t expect = unit;
    for (int d = nd; d-- > 0;) {
        if (shape[d] > 1 && strides[d] != expect)
            return false; /* extents of 1 (and arrays of no elements) may have any stride */
        expect *= shape[d] ? shape[d] : 1;
    }
    return true;
}

static const char *const dtype_typestrs[GSER_DTYPE_COUNT] = {
    [GSER_DTYPE_BYTES] = "|u1",    [GSER_DTYPE_BOOL] = "|b1",     [GSER_DTYPE_INT8] = "|i1",
    [GSER_DTYPE_INT16] = "<i2",    [GSER_DTYPE_INT32] = "<i4",    [GSER_DTYPE_INT64] = "<i8",
    [GSER_DTYPE_UINT8] = "|u1",    [GSER_DTYPE_UINT16] = "<u2",   [GSER_DTYPE_UINT32] = "<u4",
    [GSER_DTYPE_UINT64] = "<u8",   [GSER_DTYPE_FLOAT16] = "<f2",  [GSER_DTYPE_BFLOAT16] = "|V2",
    [GSER_DTYPE_FLOAT32] = "<f4",  [GSER_DTYPE_FLOAT64] = "<f8",  [GSER_DTYPE_COMPLEX64] = "<c8",
    [GSER_DTYPE_COMPLEX128] = "<c16",
};

const char *pg_dtype_typestr(gser_dtype_t dtype)
{
    return (unsigned)dtype < GSER_DTYPE_COUNT ? dtype_typestrs[dtype] : "|u1";
}
