# One tile of a matrix transposition, the items moved as 4- or 8-byte words, so every value (NaN payloads
# and signed zeros included) arrives with its bits.  _layout.pyx moves whole arrays' class axes with it,
# _xent.pyx the rows of torch's (N, C, d1, ...) layout into a thread's buffer and the gradient back.

from libc.stdint cimport uint32_t, uint64_t

ctypedef fused word:
    uint32_t
    uint64_t


cdef inline void transpose_tile(const word *src, Py_ssize_t src_stride, word *dst, Py_ssize_t dst_stride,
                                Py_ssize_t n_r, Py_ssize_t n_c) noexcept nogil:
    # dst[c * dst_stride + r] = src[r * src_stride + c] for r < n_r, c < n_c.  The inner loop steps
    # through consecutive items on the side whose rows lie further apart: the other side's lie near each
    # other (a tile's worth in a few lines), while those far apart are often a power of two of bytes
    # (D = 128 * 128) apart, the same L1 set for every row of the tile, and stepping across them item by
    # item thrashed that set (0.9 ns per float32 item, 7x a plain copy).
    cdef Py_ssize_t r, c
    if dst_stride <= src_stride:
        for r in range(n_r):
            for c in range(n_c):
                dst[c * dst_stride + r] = src[r * src_stride + c]
    else:
        for c in range(n_c):
            for r in range(n_r):
                dst[c * dst_stride + r] = src[r * src_stride + c]
