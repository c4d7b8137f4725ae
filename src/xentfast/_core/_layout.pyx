# cython: language_level=3, boundscheck=False, wraparound=False, cdivision=True, initializedcheck=False
"""Moving the class axis of a C-contiguous array to the end (the rows the kernels read) and back (the
gradient or the probabilities in the input's layout), in parallel.

torch's layout (N, C, d1, ...) puts the classes of one position D = d1 * ... apart, so the rows are the
columns of N matrices (C, D).  NumPy's ascontiguousarray(moveaxis(...)) makes that copy on one thread
and, for few classes, one item at a time along the long axis: a (8, 21, 128, 128) float32 array took it
~3-8 ms, against ~1.8 ms for the loss itself (benchmarks/README.md, "class axis").  Here each matrix is
transposed in tiles of TILE_ROWS x TILE_COLS items, small enough for L1 on both sides, the tiles
shared among the threads.  The items move as 4- or 8-byte words, so every value (NaN payloads and signed
zeros included) arrives with its bits, whatever the thread count.
"""
import numpy as np

from cython.parallel cimport prange
from libc.stdint cimport uint32_t, uint64_t

from ._tiles cimport transpose_tile, word

cdef enum:
    # a tile reads TILE_ROWS runs of TILE_COLS consecutive items and writes TILE_COLS runs of TILE_ROWS:
    # 8 KB of float32 (16 KB of float64) on either side
    TILE_ROWS = 32
    TILE_COLS = 64


cdef void _transpose(const word *src, word *dst, Py_ssize_t n_mats, Py_ssize_t rows, Py_ssize_t cols,
                     int n_threads) noexcept nogil:
    cdef Py_ssize_t tiles_r = (rows + TILE_ROWS - 1) // TILE_ROWS
    cdef Py_ssize_t tiles_c = (cols + TILE_COLS - 1) // TILE_COLS
    cdef Py_ssize_t per_mat = tiles_r * tiles_c
    cdef Py_ssize_t size = rows * cols
    cdef Py_ssize_t t, a, tr, tc, r0, c0
    for t in prange(n_mats * per_mat, num_threads=n_threads, schedule="static"):
        a = t // per_mat
        tr = (t % per_mat) // tiles_c
        tc = t % tiles_c
        r0 = tr * TILE_ROWS
        c0 = tc * TILE_COLS
        transpose_tile(src + a * size + r0 * cols + c0, cols, dst + a * size + c0 * rows + r0, rows,
                       min(TILE_ROWS, rows - r0), min(TILE_COLS, cols - c0))


def transpose_batched(src, dst, Py_ssize_t n_mats, Py_ssize_t rows, Py_ssize_t cols, int n_threads):
    """dst[a, j, i] = src[a, i, j] for C-contiguous NumPy arrays of n_mats * rows * cols items of one
    size, 4 or 8 bytes; dst must not overlap src."""
    if not (src.flags.c_contiguous and dst.flags.c_contiguous and dst.flags.writeable):
        raise ValueError("transpose_batched: src and dst must be C-contiguous, dst writeable")
    if src.itemsize != dst.itemsize or src.size != n_mats * rows * cols or dst.size != src.size:
        raise ValueError("transpose_batched: src and dst must hold n_mats * rows * cols items of one size")
    if src.size == 0:
        return dst
    cdef const uint32_t[::1] s32
    cdef uint32_t[::1] d32
    cdef const uint64_t[::1] s64
    cdef uint64_t[::1] d64
    if src.itemsize == 4:
        s32 = src.reshape(-1).view(np.uint32)
        d32 = dst.reshape(-1).view(np.uint32)
        with nogil:
            _transpose(&s32[0], &d32[0], n_mats, rows, cols, n_threads)
    elif src.itemsize == 8:
        s64 = src.reshape(-1).view(np.uint64)
        d64 = dst.reshape(-1).view(np.uint64)
        with nogil:
            _transpose(&s64[0], &d64[0], n_mats, rows, cols, n_threads)
    else:
        raise ValueError(f"transpose_batched: items of 4 or 8 bytes, got {src.itemsize}")
    return dst
