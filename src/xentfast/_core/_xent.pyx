# Softmax-family CPU kernels: cross-entropy (forward, backward, fused), log_softmax, softmax, logsumexp.
#
# Design
# (a) Python validates, this module computes.  Every argument arrives checked by xentfast.api (shapes,
#     dtypes, label range): with boundscheck off an unchecked label is an out-of-bounds read, so nothing
#     here re-validates and nothing here raises.
# (b) The arithmetic lives in C: xentfast/numerics.h (shared with the CUDA twin) and the block kernels of
#     softmax_rows.h.  This file only decides which thread runs which row or block.
# (c) Determinism: a row's result depends only on the row, computed block by block with block results
#     merged in block order (softmax_rows.h (a)).  Rows are independent, so `prange` over rows gives the
#     same bits for any thread count.  When there are fewer rows than threads and rows span several
#     blocks, the blocks of all rows become the parallel tasks ("phased" path); the merges still run in
#     block order, so the phased and row paths give the same bits too (tests/test_threads.py).
#     Every work-sharing loop is schedule="guided": a task writes its own slot whichever thread runs
#     it, so the schedule changes no bit, and a thread that starts late (a busy or just-woken core)
#     leaves its unclaimed tasks to the others instead of holding the call up by a fixed half.
#     Measured with back-to-back calls on 2 vCPUs, fused 4096x1000 float32: 1t/2t 1.34-1.82 with
#     "static", 1.82-1.89 with "guided"; BCE with logits 1.38-1.82 against 1.84-1.88.
# (d) Per-row losses are written in double, whatever the data type, and reduced by dd_sum (double-double,
#     fixed shape, xentfast/ddsum.h): `mean` equals the mean of `none` for any thread count, and a float32 batch
#     mean is not built from float32-rounded row losses.
# (e) Subnormals are never flushed, whatever the caller set (torch.set_flush_denormal, XLA's threads):
#     each OpenMP thread clears flush-to-zero inside every parallel region and restores it on the way
#     out (fp_ieee.h); the public functions do the same on the calling thread (xentfast.api).  Each
#     region's saved state (`fp_thread`) starts at 0: Cython copies it into every thread (firstprivate),
#     and gcc warned of an uninitialized copy.
# (f) Left out on purpose: OpenMP reductions (their order follows the thread count), per-element
#     Python-level dispatch, and any N x C temporary besides the caller-visible outputs.

from cython.parallel cimport parallel, prange, threadid
from libc.stdint cimport int64_t, uint32_t, uint64_t
from libc.stdlib cimport malloc, free
from libc.string cimport memcpy, memset
from cpython.pycapsule cimport PyCapsule_New
from libc.math cimport INFINITY as _INF

from ._openmp cimport omp_get_max_threads
from ._tiles cimport transpose_tile

import numpy as np

cdef extern from "fp_ieee.h" nogil:
    ctypedef unsigned long long xf_fp_state
    xf_fp_state xf_fp_ieee_enter()
    void xf_fp_ieee_leave(xf_fp_state saved)

cdef extern from "xent_kernels.h" nogil:
    enum: XF_BLOCK
    enum: XF_GROUP_ROWS
    enum: XF_GROUP_MAX_C
    enum: XF_ROW_OK
    ctypedef struct xf_rowmax:
        double m
        long long argmax
        long long n_nan
        long long n_finite
        double min_finite
    ctypedef struct xf_rowjob:
        int status
        int has_nan
        int needs_terms
        int targets_nonneg
        int prob
        int stored
        long long y
        long long argmax
        double m
        double S
        int exp_normal
        double log_s
        double lse
        int log_s_unused
        double w_min_pos
    void xf_rowmax_init(xf_rowmax *st)
    void xf_rowmax_merge(xf_rowmax *st, const xf_rowmax *blk)
    void xf_rowjob_init(xf_rowjob *job, long long y, double w_y, double eps, double z, double scale,
                        double loss_scale, int prob)
    void xf_rowjob_set_max(xf_rowjob *job, const xf_rowmax *st)
    void xf_rowjob_set_exp_form(xf_rowjob *job, long long C)
    void xf_rowjob_set_sum(xf_rowjob *job, double s_hi, double s_lo)
    void xf_rowjob_rescue_tiny_sum(xf_rowjob *job, const double *x, long long C)
    void xf_rowjob_tiny_loss_row(const xf_rowjob *job, const double *x, const double *t, const double *w,
                                 long long C, double *terms)
    double xf_rowjob_finish(xf_rowjob *job, const double *terms)
    double xf_rowjob_div_S(const xf_rowjob *job, double a)
    void xf_rowjob_plan(xf_rowjob *job, double x_y, int has_grad)
    double xf_rowjob_exact_lse_f64(const xf_rowjob *job, const double *x, long long C)
    double xf_rowjob_exact_lse_f32(const xf_rowjob *job, const float *x, long long C)
    void xf_dd_add(double *hi, double *lo, double b_hi, double b_lo)
    void xf_terms_merge(double *acc, const double *blk)

    ctypedef struct xf_row_scratch:
        pass
    xf_row_scratch *xf_row_scratch_new(long long n_classes)
    void xf_row_scratch_read_ahead(xf_row_scratch *s, const void *x_end)
    void xf_row_scratch_new_output(xf_row_scratch *s)
    bint xf_memory_touched(const void *p, size_t n)
    void xf_row_scratch_finish(xf_row_scratch *s)
    void xf_row_scratch_release(xf_row_scratch *s)
    ctypedef struct xf_softmax_table_f32:
        void (*max_block)(const float *, long long, long long, xf_rowmax *) noexcept nogil
        void (*sumexp_block)(const float *, long long, double, long long, int, double *, double *,
                             float *) noexcept nogil
        void (*terms_block)(const float *, long long, long long, const xf_rowjob *, const float *,
                            const double *, double *) noexcept nogil
        void (*grad_block)(const float *, float *, long long, long long, const xf_rowjob *, const float *,
                           const double *, const double *) noexcept nogil
        void (*row_max)(const float *, long long, xf_rowjob *) noexcept nogil
        void (*row_sum)(const float *, long long, xf_rowjob *) noexcept nogil
        double (*xent_row)(const float *, float *, long long, xf_rowjob *, const float *,
                           const double *, xf_row_scratch *) noexcept nogil
        void (*row_z_lse)(const float *, long long, xf_rowjob *, const float *, const double *,
                          double *) noexcept nogil
        void (*log_softmax_block)(const float *, float *, long long, double, double, int) noexcept nogil
        unsigned (*short_rows)(const float *, const float *, float *, long long, long long, const int64_t *,
                               long long, const double *, double, double, const double *, double *, double,
                               double, double) noexcept nogil
        unsigned (*short_rows_family)(const float *, float *, double *, long long, long long, int) noexcept nogil
        void (*xent_rows_forward)(const float *, const float *, long long, const long long *, int, xf_rowjob *,
                                  const double *, double *) noexcept nogil
        void (*rows_max_sum)(const float *, long long, const long long *, int, xf_rowjob *) noexcept nogil
    ctypedef struct xf_softmax_table_f64:
        void (*max_block)(const double *, long long, long long, xf_rowmax *) noexcept nogil
        void (*sumexp_block)(const double *, long long, double, long long, int, double *, double *,
                             double *) noexcept nogil
        void (*terms_block)(const double *, long long, long long, const xf_rowjob *, const double *,
                            const double *, double *) noexcept nogil
        void (*grad_block)(const double *, double *, long long, long long, const xf_rowjob *, const double *,
                           const double *, const double *) noexcept nogil
        void (*row_max)(const double *, long long, xf_rowjob *) noexcept nogil
        void (*row_sum)(const double *, long long, xf_rowjob *) noexcept nogil
        double (*xent_row)(const double *, double *, long long, xf_rowjob *, const double *,
                           const double *, xf_row_scratch *) noexcept nogil
        void (*row_z_lse)(const double *, long long, xf_rowjob *, const double *, const double *,
                          double *) noexcept nogil
        void (*log_softmax_block)(const double *, double *, long long, double, double, int) noexcept nogil
        unsigned (*short_rows)(const double *, const double *, double *, long long, long long,
                               const int64_t *, long long, const double *, double, double, const double *,
                               double *, double, double, double) noexcept nogil
        unsigned (*short_rows_family)(const double *, double *, double *, long long, long long, int) noexcept nogil
        void (*xent_rows_forward)(const double *, const double *, long long, const long long *, int, xf_rowjob *,
                                  const double *, double *) noexcept nogil
        void (*rows_max_sum)(const double *, long long, const long long *, int, xf_rowjob *) noexcept nogil
    enum: XF_PATH_BASELINE
    enum: XF_PATH_AVX2
    enum: XF_PATH_AVX512
    int xf_cpu_supports_path(int path)
    int xf_path_fma_native(int path)
    const xf_softmax_table_f32 *xf_softmax_table_for_f32(int path)
    const xf_softmax_table_f64 *xf_softmax_table_for_f64(int path)
    bint xf_xent_wants_scratch(bint has_grad, bint general, bint storage_is_float, bint grad_is_logits,
                               long long n_classes)
    bint xf_forward_in_batches(long long n_rows, long long n_classes, int n_threads)
    long long XF_STREAM_MIN_CLASSES_FOR(bint storage_is_float, int path)
    long long XF_SCRATCH_MAX_CLASSES
    ctypedef struct xf_softmax_exports:
        const int *current_path
        const xf_softmax_table_f32 *(*f32)(int path) noexcept nogil
        const xf_softmax_table_f64 *(*f64)(int path) noexcept nogil

ctypedef fused floating:
    float
    double

cdef double NAN = float("nan")

# The CPU code path: every kernel call goes through these tables (see xent_kernels.h).  The paths give
# the same bits; the choice is made once at import and can be overridden for tests.
cdef const xf_softmax_table_f32 *K32 = xf_softmax_table_for_f32(XF_PATH_BASELINE)
cdef const xf_softmax_table_f64 *K64 = xf_softmax_table_for_f64(XF_PATH_BASELINE)
_PATHS = {"baseline": XF_PATH_BASELINE, "avx2": XF_PATH_AVX2, "avx512": XF_PATH_AVX512}
_PATH_NAMES = tuple(sorted(_PATHS, key=_PATHS.get))  # by code
cdef int _current_code = XF_PATH_BASELINE

# The XLA FFI handlers (_xla_ffi.cc) call these kernels through this capsule rather than compiling their
# own copy, and follow set_cpu_path through _current_code (xent_kernels.h, xf_softmax_exports).
cdef xf_softmax_exports _exports
_exports.current_path = &_current_code
_exports.f32 = xf_softmax_table_for_f32
_exports.f64 = xf_softmax_table_for_f64
_kernel_exports = PyCapsule_New(<void *>&_exports, "xentfast._core._xent._kernel_exports", NULL)


def available_cpu_paths():
    """Code paths this build has and this CPU can run, baseline first."""
    return [name for name, code in _PATHS.items() if xf_cpu_supports_path(code)]


def fma_instruction(name):
    """Whether code path `name` computes xf_fma with the fma instruction (True) or its exact emulation."""
    if name not in _PATHS:
        raise ValueError(f"unknown code path {name!r}; choose from {', '.join(_PATHS)}")
    return bool(xf_path_fma_native(_PATHS[name]))


def set_cpu_path(name):
    """Select the code path ("baseline", "avx2", "avx512", or "auto" for the best this CPU runs)."""
    global K32, K64, _current_code
    if name == "auto":
        paths = available_cpu_paths()
        name = paths[len(paths) - 1]  # (wraparound is off in this build: no [-1])
    if name not in _PATHS:
        raise ValueError(f"XENTFAST_CPU: unknown code path {name!r}; choose from auto, {', '.join(_PATHS)}")
    if not xf_cpu_supports_path(_PATHS[name]):
        raise ValueError(f"XENTFAST_CPU: code path {name!r} is not available on this CPU/build; "
                         f"available: {', '.join(available_cpu_paths())}")
    K32 = xf_softmax_table_for_f32(_PATHS[name])
    K64 = xf_softmax_table_for_f64(_PATHS[name])
    _current_code = _PATHS[name]


def cpu_path():
    """The code path in use."""
    return _PATH_NAMES[_current_code]


cdef struct XentArgs:
    # everything a row needs besides its own data; pointers are NULL when the option is absent
    const int64_t *y            # index targets (NULL for probability targets)
    const double *w             # class weights
    const double *row_scale     # per-row upstream gradient (reduction="none")
    long long ignore_index
    long long C
    double eps
    double z
    double scale                # scalar upstream factor (grad_output / denominator)
    double loss_scale           # power of two applied to row losses (see xent_kernels.h)
    int prob
    double w_min_pos            # least positive class weight (1 without weights, inf without one): xf_rowjob


cdef inline bint _row_ignored(const XentArgs *a, Py_ssize_t i) noexcept nogil:
    return a.y != NULL and a.y[i] == a.ignore_index


cdef inline void _row_job_init(const XentArgs *a, Py_ssize_t i, xf_rowjob *job) noexcept nogil:
    cdef long long y = -1
    cdef double w_y = 1.0
    cdef double s = a.scale
    if a.y != NULL:
        y = a.y[i]
        if a.w != NULL:
            w_y = a.w[y]
    if a.row_scale != NULL:
        s = s * a.row_scale[i]
    xf_rowjob_init(job, y, w_y, a.eps, a.z, s, a.loss_scale, a.prob)
    job.w_min_pos = a.w_min_pos


cdef double _least_positive(const double[::1] w) noexcept:
    # XentArgs.w_min_pos: +inf where no weight is positive
    cdef double lo = _INF
    cdef Py_ssize_t j
    for j in range(w.shape[0]):
        if w[j] > 0.0 and w[j] < lo:
            lo = w[j]
    return lo


cdef inline void _fill(floating *out, Py_ssize_t n, double v) noexcept nogil:
    cdef Py_ssize_t j
    for j in range(n):
        out[j] = <floating>v


cdef double _xent_one_row(const floating *x, floating *grad, const floating *t, const XentArgs *a,
                          Py_ssize_t i, xf_row_scratch *scratch) noexcept nogil:
    cdef xf_rowjob job
    cdef Py_ssize_t C = a.C
    if _row_ignored(a, i):
        if grad != NULL:
            _fill(grad + i * C, C, 0.0)
        return 0.0
    _row_job_init(a, i, &job)
    if floating is float:
        return K32.xent_row(x + i * C, grad + i * C if grad != NULL else NULL, C, &job,
                               t + i * C if t != NULL else NULL, a.w, scratch)
    else:
        return K64.xent_row(x + i * C, grad + i * C if grad != NULL else NULL, C, &job,
                               t + i * C if t != NULL else NULL, a.w, scratch)


cdef void _xent_row_group(const floating *x, floating *grad, const floating *t, const XentArgs *a,
                          Py_ssize_t N, Py_ssize_t g, double *loss, xf_row_scratch *scratch) noexcept nogil:
    # Rows [g R, g R + R) of a call: side by side where they qualify (xf_short_rows, softmax_rows.h;
    # index targets, label smoothing, probability targets t or NULL, the z-loss), the others and a last
    # partial group one by one through the row kernel, whose bits the group reproduces
    cdef Py_ssize_t i0 = g * XF_GROUP_ROWS
    cdef Py_ssize_t r
    cdef unsigned done = 0
    cdef floating *group_grad = grad + i0 * a.C if grad != NULL else NULL
    cdef const floating *group_t = t + i0 * a.C if t != NULL else NULL
    cdef const int64_t *group_y = a.y + i0 if a.y != NULL else NULL
    cdef const double *group_scale = a.row_scale + i0 if a.row_scale != NULL else NULL
    if i0 + XF_GROUP_ROWS <= N:
        if floating is float:
            done = K32.short_rows(x + i0 * a.C, group_t, group_grad, a.C, 0, group_y, a.ignore_index, a.w,
                                  a.loss_scale, a.scale, group_scale, loss + i0, a.eps, a.z, a.w_min_pos)
        else:
            done = K64.short_rows(x + i0 * a.C, group_t, group_grad, a.C, 0, group_y, a.ignore_index, a.w,
                                  a.loss_scale, a.scale, group_scale, loss + i0, a.eps, a.z, a.w_min_pos)
    if done == (1u << XF_GROUP_ROWS) - 1:
        return
    if grad == NULL:
        # the rows the group hands back, their logarithms side by side
        _xent_rows_forward(x, t, a, i0, min(<Py_ssize_t>XF_GROUP_ROWS, N - i0), done, loss)
        return
    for r in range(min(<Py_ssize_t>XF_GROUP_ROWS, N - i0)):
        if not ((done >> r) & 1):
            loss[i0 + r] = _xent_one_row(x, grad, t, a, i0 + r, scratch)


cdef void _xent_row_groups(const floating *x, floating *grad, const floating *t, const XentArgs *a,
                           Py_ssize_t N, double *loss, int n_threads) noexcept nogil:
    # every group of a call (softmax_xent, the plain-call lane): on the calling thread for one thread (no
    # team to start: the lane's small calls take ~3 us in all), else on a team of n_threads.  The rows left
    # to the row kernel get the thread's scratch row as the main driver's do (float32 keeps its
    # exponentials there; without it they are evaluated twice, 32x300 float32 14 -> 28 us)
    cdef Py_ssize_t g
    cdef xf_fp_state fp_thread = 0
    cdef xf_row_scratch *scratch = NULL
    cdef bint want_scratch = xf_xent_wants_scratch(grad != NULL, a.eps != 0.0 or a.z != 0.0 or t != NULL,
                                                   floating is float, <const floating *>grad == x, a.C)
    if n_threads == 1:
        fp_thread = xf_fp_ieee_enter()
        scratch = xf_row_scratch_new(a.C) if want_scratch else NULL
        for g in range((N + XF_GROUP_ROWS - 1) // XF_GROUP_ROWS):
            _xent_row_group(x, grad, t, a, N, g, loss, scratch)
        xf_row_scratch_release(scratch)
        xf_fp_ieee_leave(fp_thread)
        return
    with parallel(num_threads=n_threads):
        fp_thread = xf_fp_ieee_enter()
        scratch = xf_row_scratch_new(a.C) if want_scratch else NULL
        for g in prange((N + XF_GROUP_ROWS - 1) // XF_GROUP_ROWS, schedule="guided"):
            _xent_row_group(x, grad, t, a, N, g, loss, scratch)
        xf_row_scratch_release(scratch)
        xf_fp_ieee_leave(fp_thread)


cdef void _xent_rows_forward(const floating *x, const floating *t, const XentArgs *a, Py_ssize_t i0,
                             Py_ssize_t n_rows, unsigned done, double *loss) noexcept nogil:
    # the losses of rows [i0, i0 + n_rows), n_rows <= XF_GROUP_ROWS, without a gradient, but those whose
    # bit r is set in done: the row kernel's passes with the rows' logarithms side by side
    # (xf_xent_rows_forward, softmax_rows.h), the same bits
    cdef xf_rowjob jobs[XF_GROUP_ROWS]
    cdef long long rows[XF_GROUP_ROWS]
    cdef double row_loss[XF_GROUP_ROWS]
    cdef int n = 0
    cdef int r
    cdef Py_ssize_t i
    for i in range(i0, i0 + n_rows):
        if (done >> (i - i0)) & 1:
            continue
        if _row_ignored(a, i):
            loss[i] = 0.0
        else:
            _row_job_init(a, i, &jobs[n])
            rows[n] = i
            n += 1
    if n == 0:
        return
    if floating is float:
        K32.xent_rows_forward(x, t, a.C, rows, n, jobs, a.w, row_loss)
    else:
        K64.xent_rows_forward(x, t, a.C, rows, n, jobs, a.w, row_loss)
    for r in range(n):
        loss[rows[r]] = row_loss[r]


cdef void _xent_rows(const floating *x, floating *grad, const floating *t, const XentArgs *a, Py_ssize_t N,
                     double *loss, int n_threads, bint want_scratch) noexcept nogil:
    # every row of a call through the row kernel, on a team of n_threads but at most one thread per row
    # (softmax_xent's rows beyond the groups, the plain-call lane's larger calls of more than
    # XF_GROUP_MAX_C classes)
    cdef Py_ssize_t i
    cdef Py_ssize_t C = a.C
    cdef xf_fp_state fp_thread = 0
    cdef xf_row_scratch *scratch = NULL
    cdef bint streaming = True
    cdef Py_ssize_t n_batches = (N + XF_GROUP_ROWS - 1) // XF_GROUP_ROWS
    if grad == NULL and xf_forward_in_batches(N, C, n_threads):
        # the losses alone, XF_GROUP_ROWS rows a task
        with parallel(num_threads=n_threads):
            fp_thread = xf_fp_ieee_enter()
            for i in prange(n_batches, schedule="guided"):
                _xent_rows_forward(x, t, a, i * XF_GROUP_ROWS,
                                   min(<Py_ssize_t>XF_GROUP_ROWS, N - i * XF_GROUP_ROWS), 0, loss)
            xf_fp_ieee_leave(fp_thread)
        return
    if want_scratch and grad != NULL and <const floating *>grad != x:
        streaming = _streaming_stores(grad, N, C, sizeof(floating), floating is float)
    with parallel(num_threads=<int>min(<Py_ssize_t>n_threads, N)):
        fp_thread = xf_fp_ieee_enter()
        # exponentials kept between passes (xf_xent_row: the general gradient's, every float32 row's, long
        # float64 stored rows'); without the memory the rows evaluate them again, or store them in the
        # gradient, to the same bits.  Releasing it writes the last long row's pending gradient
        # (xf_row_scratch).
        scratch = _row_scratch(want_scratch, C, streaming)
        if grad != NULL and <const floating *>grad != x:
            # the next row's max pass inside each row's sum pass (rows with a gradient: the forward pass
            # alone measured no gain); the logits are only read
            xf_row_scratch_read_ahead(scratch, x + N * C)
        for i in prange(N, schedule="guided"):
            loss[i] = _xent_one_row(x, grad, t, a, i, scratch)
        xf_row_scratch_release(scratch)
        xf_fp_ieee_leave(fp_thread)


cdef enum:
    # the positions of torch's layout one task of _xent_channels takes: about CHANNEL_TILE_ITEMS logits,
    # in whole groups, at most CHANNEL_TILE_MAX positions (21 classes: 256 positions, 21 KB of float32).
    # Fused, two threads, ms, tiles of 64 -> 128 -> 256 -> 1024 positions: 8 x 21 x 128 x 128 float32
    # 2.4-2.5 -> 2.1-2.4 -> 2.1-2.2 -> 3.0, 4 x 150 x 64 x 64 1.4-1.8 -> 1.2-1.3 -> 1.2-1.3 -> 1.2
    # (benchmarks/README.md, 2026-12-07, eighth round)
    CHANNEL_TILE_ITEMS = 32768
    CHANNEL_TILE_MAX = 256


cdef inline Py_ssize_t _channel_tile(Py_ssize_t C) noexcept nogil:
    cdef Py_ssize_t p = (CHANNEL_TILE_ITEMS // C) // XF_GROUP_ROWS * XF_GROUP_ROWS
    return max(<Py_ssize_t>XF_GROUP_ROWS, min(p, <Py_ssize_t>CHANNEL_TILE_MAX))


cdef inline void _gather_rows(const floating *x, Py_ssize_t C, Py_ssize_t D, floating *rows, Py_ssize_t r0,
                              Py_ssize_t n) noexcept nogil:
    # the rows of positions r0 .. r0 + n - 1 of a (C, D) matrix of torch's layout (x: its position 0's
    # class 0) into rows + r0 C, row r at rows + r C
    if floating is float:
        transpose_tile(<const uint32_t *>(x + r0), D, <uint32_t *>(rows + r0 * C), C, C, n)
    else:
        transpose_tile(<const uint64_t *>(x + r0), D, <uint64_t *>(rows + r0 * C), C, C, n)


cdef inline void _scatter_rows(const floating *rows, Py_ssize_t C, Py_ssize_t D, floating *out, Py_ssize_t r0,
                               Py_ssize_t n) noexcept nogil:
    # _gather_rows' way back
    if floating is float:
        transpose_tile(<const uint32_t *>(rows + r0 * C), C, <uint32_t *>(out + r0), D, n, C)
    else:
        transpose_tile(<const uint64_t *>(rows + r0 * C), C, <uint64_t *>(out + r0), D, n, C)


cdef inline void _copy_positions(const floating *src, Py_ssize_t src_stride, floating *dst,
                                 Py_ssize_t dst_stride, Py_ssize_t C, Py_ssize_t n) noexcept nogil:
    # n consecutive positions of each of C classes, class j's at src + j src_stride to dst + j dst_stride
    cdef Py_ssize_t j
    for j in range(C):
        memcpy(dst + j * dst_stride, src + j * src_stride, n * sizeof(floating))


cdef inline void _zero_positions(floating *block, Py_ssize_t P, Py_ssize_t C, Py_ssize_t p0,
                                 Py_ssize_t p1) noexcept nogil:
    # positions p0 .. p1 - 1 of every class of a (C, P) block set to 0: a last partial group's padding,
    # rows of zeros (finite, one spread) whose results no one reads
    cdef Py_ssize_t j
    for j in range(C):
        memset(block + j * P + p0, 0, (p1 - p0) * sizeof(floating))


cdef void _xent_channel_tile(const floating *x, floating *grad, const floating *t, const XentArgs *a,
                             Py_ssize_t D, Py_ssize_t i0, Py_ssize_t n, Py_ssize_t P, bint groups,
                             floating *work, double *loss, xf_row_scratch *scratch) noexcept nogil:
    # n <= P consecutive positions of one (C, D) matrix of torch's layout (x, grad and probability targets
    # t: the first one's class 0), rows i0 .. i0 + n - 1 of the call, with the bits the rows driver gives
    # them; work: the thread's _channel_work(C, P, t) items.  Where the groups apply: the
    # tile copied as it lies into a (C, P) block (t's into a block of its own), its groups of
    # XF_GROUP_ROWS positions run side by side there (xf_short_rows, D = P: class j's entries of a group
    # are adjacent, so neither the input, the targets nor the gradient needs a transposition), the
    # gradient written into a second block and copied back (a last partial group padded to a whole
    # one); the rows a group hands back go through the row kernel one by one (gathered into rows of
    # their own, t's too).
    # The block keeps the groups' reads off the input's own stride, often a power of two of bytes (D =
    # 64 * 64 float32: 16 KB), whose C lines share a few cache sets in L1 and L2 alike: read in place,
    # each line was fetched again for the next group (4 x 150 x 64 x 64 float32 fused 2.9 ms, against
    # 1.4 ms from the block).  Other calls' rows (a z-loss) are transposed into the first block as rows
    # (t's into t_rows), run as the rows driver runs them and their gradient rows scattered back from
    # the second.
    cdef XentArgs local = a[0]
    cdef XentArgs one
    cdef Py_ssize_t C = a.C
    cdef Py_ssize_t g, r, r0, n_rows
    cdef unsigned done
    # a last partial group runs padded to a whole one (its labels, upstream factors and losses here)
    cdef int64_t pad_y[XF_GROUP_ROWS]
    cdef double pad_scale[XF_GROUP_ROWS]
    cdef double pad_loss[XF_GROUP_ROWS]
    cdef const int64_t *group_y
    cdef const double *group_scale
    cdef double *group_loss
    cdef floating *block = work
    cdef floating *grad_block = work + P * C
    cdef floating *row = grad_block + P * C
    cdef floating *grad_row = row + C
    # the targets' block as they lie, and their rows (those handed back, or all of a z-loss's tile)
    cdef floating *t_block = grad_row + C
    cdef floating *t_rows = t_block + P * C
    cdef const floating *rows_t = t_rows if t != NULL else NULL
    cdef floating *rows_grad = grad_block if grad != NULL else NULL
    if a.y != NULL:
        local.y = a.y + i0
    if a.row_scale != NULL:
        local.row_scale = a.row_scale + i0
    if groups:
        _copy_positions(x, D, block, P, C, n)
        if t != NULL:
            _copy_positions(t, D, t_block, P, C, n)
        for g in range((n + XF_GROUP_ROWS - 1) // XF_GROUP_ROWS):
            r0 = g * XF_GROUP_ROWS
            n_rows = min(<Py_ssize_t>XF_GROUP_ROWS, n - r0)
            group_y = local.y + r0 if a.y != NULL else NULL
            group_scale = local.row_scale + r0 if a.row_scale != NULL else NULL
            group_loss = loss + i0 + r0
            if n_rows < XF_GROUP_ROWS:
                # the block's positions beyond the tile as rows of zeros (P is a whole number of
                # groups), label 0 and factor 1: the group's rows are independent, so the real ones
                # keep their bits, and one by one they cost ~3x a grouped row (8 x 21 x 12 float32
                # positions fused 3.9 ms, 2.2 with the axis moved)
                _zero_positions(block, P, C, n, r0 + XF_GROUP_ROWS)
                if t != NULL:
                    _zero_positions(t_block, P, C, n, r0 + XF_GROUP_ROWS)
                for r in range(XF_GROUP_ROWS):
                    pad_y[r] = group_y[r] if (group_y != NULL and r < n_rows) else 0
                    pad_scale[r] = group_scale[r] if (group_scale != NULL and r < n_rows) else 1.0
                group_y = pad_y if a.y != NULL else NULL
                group_scale = pad_scale if a.row_scale != NULL else NULL
                group_loss = pad_loss
            if floating is float:
                done = K32.short_rows(block + r0, t_block + r0 if t != NULL else NULL,
                                      rows_grad + r0 if grad != NULL else NULL, C, P, group_y, a.ignore_index,
                                      a.w, a.loss_scale, a.scale, group_scale, group_loss, a.eps, a.z,
                                      a.w_min_pos)
            else:
                done = K64.short_rows(block + r0, t_block + r0 if t != NULL else NULL,
                                      rows_grad + r0 if grad != NULL else NULL, C, P, group_y, a.ignore_index,
                                      a.w, a.loss_scale, a.scale, group_scale, group_loss, a.eps, a.z,
                                      a.w_min_pos)
            if n_rows < XF_GROUP_ROWS:
                # the real rows' losses; the padding's results are dropped
                done &= (1u << n_rows) - 1
                for r in range(n_rows):
                    if (done >> r) & 1:
                        loss[i0 + r0 + r] = pad_loss[r]
            if done == (1u << XF_GROUP_ROWS) - 1:
                continue
            if t != NULL:
                for r in range(n_rows):
                    if not ((done >> r) & 1):
                        _gather_rows(t_block, C, P, t_rows, r0 + r, 1)
            if grad == NULL:
                # the rows handed back as rows of the second block, their logarithms side by side
                for r in range(n_rows):
                    if not ((done >> r) & 1):
                        _gather_rows(block, C, P, grad_block, r0 + r, 1)
                _xent_rows_forward(grad_block, rows_t, &local, r0, n_rows, done, loss + i0)
                continue
            for r in range(n_rows):
                if not ((done >> r) & 1):
                    one = local
                    if a.y != NULL:
                        one.y = local.y + r0 + r
                    if a.row_scale != NULL:
                        one.row_scale = local.row_scale + r0 + r
                    _gather_rows(block + r0 + r, C, P, row, 0, 1)
                    loss[i0 + r0 + r] = _xent_one_row(row, grad_row, rows_t + (r0 + r) * C if t != NULL else NULL,
                                                      &one, 0, scratch)
                    # a row the kernel left pending (xf_row_scratch) completes before it is read
                    xf_row_scratch_finish(scratch)
                    _scatter_rows(grad_row, C, P, grad_block + r0 + r, 0, 1)
        if grad != NULL:
            _copy_positions(grad_block, P, grad, D, C, n)
        return
    _gather_rows(x, C, D, block, 0, n)
    if t != NULL:
        _gather_rows(t, C, D, t_rows, 0, n)
    if grad == NULL:
        for g in range((n + XF_GROUP_ROWS - 1) // XF_GROUP_ROWS):
            _xent_rows_forward(block, rows_t, &local, g * XF_GROUP_ROWS,
                               min(<Py_ssize_t>XF_GROUP_ROWS, n - g * XF_GROUP_ROWS), 0, loss + i0)
        return
    for r in range(n):
        loss[i0 + r] = _xent_one_row(block, rows_grad, rows_t, &local, r, scratch)
    xf_row_scratch_finish(scratch)
    _scatter_rows(grad_block, C, D, grad, 0, n)


cdef inline Py_ssize_t _channel_work(Py_ssize_t C, Py_ssize_t P, bint has_t) noexcept nogil:
    # a thread's items for _xent_channel_tile: the input's and the gradient's blocks, a row and its
    # gradient row, and with probability targets their block and rows
    return 2 * P * C + 2 * C + (2 * P * C if has_t else 0)


cdef void _xent_channels(const floating *x, floating *grad, const floating *t, const XentArgs *a,
                         Py_ssize_t B, Py_ssize_t D, double *loss, floating *work, Py_ssize_t P, bint groups,
                         int n_threads) noexcept nogil:
    # every row of a call in torch's layout, B matrices (C, D) whose columns are the rows (t's likewise),
    # P positions a task (_channel_tile), each thread's blocks in its _channel_work items of work
    cdef Py_ssize_t C = a.C
    cdef Py_ssize_t per_matrix = (D + P - 1) // P
    cdef Py_ssize_t task, b, p0
    cdef floating *mine = NULL
    cdef xf_fp_state fp_thread = 0
    cdef xf_row_scratch *scratch = NULL
    cdef bint want_scratch = xf_xent_wants_scratch(grad != NULL, a.eps != 0.0 or a.z != 0.0 or t != NULL,
                                                   floating is float, False, C)
    with parallel(num_threads=n_threads):
        fp_thread = xf_fp_ieee_enter()
        # pending rows go out by ordinary stores: the tile's block is read right after
        scratch = _row_scratch(want_scratch, C, False)
        mine = work + threadid() * _channel_work(C, P, t != NULL)
        for task in prange(B * per_matrix, schedule="guided"):
            b = task // per_matrix
            p0 = (task % per_matrix) * P
            _xent_channel_tile(x + b * C * D + p0, grad + b * C * D + p0 if grad != NULL else NULL,
                               t + b * C * D + p0 if t != NULL else NULL, a, D, b * D + p0, min(P, D - p0), P,
                               groups, mine, loss, scratch)
        xf_row_scratch_release(scratch)
        xf_fp_ieee_leave(fp_thread)


cdef void _phased_block_maxima(const floating *x, Py_ssize_t N, Py_ssize_t C, xf_rowmax *bmax,
                               int n_threads) noexcept nogil:
    # the splits' first pass: each (row, block) task's maximum statistics into bmax[row * nb + block]
    cdef Py_ssize_t nb = (C + XF_BLOCK - 1) // XF_BLOCK
    cdef Py_ssize_t task, i, b0, blen
    cdef xf_fp_state fp_thread = 0
    with parallel(num_threads=n_threads):
        fp_thread = xf_fp_ieee_enter()
        for task in prange(N * nb, schedule="guided"):
            i = task // nb
            b0 = (task % nb) * XF_BLOCK
            blen = min(C - b0, <Py_ssize_t>XF_BLOCK)
            if floating is float:
                K32.max_block(x + i * C + b0, blen, b0, &bmax[task])
            else:
                K64.max_block(x + i * C + b0, blen, b0, &bmax[task])
        xf_fp_ieee_leave(fp_thread)


cdef void _phased_row_max(const xf_rowmax *bmax, Py_ssize_t i, Py_ssize_t C, xf_rowjob *job) noexcept nogil:
    # row i's block maxima merged in block order into its job, as xf_row_max merges them (without the
    # masked form, whose bits equal the general form's)
    cdef Py_ssize_t nb = (C + XF_BLOCK - 1) // XF_BLOCK
    cdef Py_ssize_t b
    cdef xf_rowmax st
    xf_rowmax_init(&st)
    for b in range(nb):
        xf_rowmax_merge(&st, &bmax[i * nb + b])
    xf_rowjob_set_max(job, &st)
    xf_rowjob_set_exp_form(job, C)


cdef void _phased_block_sums(const floating *x, Py_ssize_t N, Py_ssize_t C, const xf_rowjob *jobs,
                             const XentArgs *a, floating *keep, double *bsum, int n_threads) noexcept nogil:
    # the splits' sum pass: each task's double-double sum of exponentials into bsum[2 task], [2 task + 1],
    # for rows that are OK and not ignored (a: the losses' arguments, or NULL).  keep (or NULL): the
    # gradient-shaped output where float64 stored rows keep their exponentials, exact there; a float32
    # buffer would round them, so float32 rows evaluate them again in the gradient pass (softmax_rows.h
    # xf_stored_entry: the same bits as keeping the doubles)
    cdef Py_ssize_t nb = (C + XF_BLOCK - 1) // XF_BLOCK
    cdef Py_ssize_t task, i, b0, blen, skip
    cdef floating *store
    cdef xf_fp_state fp_thread = 0
    with parallel(num_threads=n_threads):
        fp_thread = xf_fp_ieee_enter()
        for task in prange(N * nb, schedule="guided"):
            i = task // nb
            if (a != NULL and _row_ignored(a, i)) or jobs[i].status != XF_ROW_OK:
                continue
            b0 = (task % nb) * XF_BLOCK
            blen = min(C - b0, <Py_ssize_t>XF_BLOCK)
            skip = jobs[i].argmax - b0 if b0 <= jobs[i].argmax < b0 + blen else -1
            store = keep + i * C + b0 if keep != NULL and jobs[i].stored and floating is double else NULL
            if floating is float:
                K32.sumexp_block(x + i * C + b0, blen, jobs[i].m, skip, jobs[i].exp_normal, &bsum[2 * task],
                                 &bsum[2 * task + 1], store)
            else:
                K64.sumexp_block(x + i * C + b0, blen, jobs[i].m, skip, jobs[i].exp_normal, &bsum[2 * task],
                                 &bsum[2 * task + 1], store)
        xf_fp_ieee_leave(fp_thread)


cdef void _phased_row_sum(const floating *x, const double *bsum, Py_ssize_t i, Py_ssize_t C,
                          xf_rowjob *job) noexcept nogil:
    # row i's block sums merged in block order into its job (adding the first to (0, 0) returns it
    # unchanged, as xf_row_sum_writing's first block), and float64's rescue of a sum of subnormal terms
    cdef Py_ssize_t nb = (C + XF_BLOCK - 1) // XF_BLOCK
    cdef Py_ssize_t b
    cdef double hi = 0.0, lo = 0.0
    for b in range(nb):
        xf_dd_add(&hi, &lo, bsum[2 * (i * nb + b)], bsum[2 * (i * nb + b) + 1])
    xf_rowjob_set_sum(job, hi, lo)
    if floating is double:
        xf_rowjob_rescue_tiny_sum(job, x + i * C, C)


cdef bint _targets_nonneg(const float *t, Py_ssize_t C) noexcept nogil:
    # softmax_rows.h xf_targets_scan: every target probability >= 0 (a NaN is not)
    cdef Py_ssize_t j
    for j in range(C):
        if not t[j] >= 0:
            return False
    return True


cdef bint _xent_phased(const floating *x, floating *grad, const floating *t, const XentArgs *a,
                       Py_ssize_t N, double *loss, int n_threads) noexcept nogil:
    # Few rows, long rows: the (row, block) pairs are the parallel tasks of each pass; per-row merges
    # run in block order between the passes (see (c)).  False: no memory for the per-task state.
    cdef Py_ssize_t C = a.C
    cdef Py_ssize_t nb = (C + XF_BLOCK - 1) // XF_BLOCK
    cdef Py_ssize_t ntask = N * nb
    cdef Py_ssize_t task, i, b, b0, blen
    cdef xf_rowjob *jobs = <xf_rowjob *> malloc(N * sizeof(xf_rowjob))
    cdef xf_rowmax *bmax = <xf_rowmax *> malloc(ntask * sizeof(xf_rowmax))
    cdef double *bsum = <double *> malloc(4 * ntask * sizeof(double))
    cdef double acc[4]
    cdef double x_y
    cdef xf_fp_state fp_thread = 0
    cdef bint any_terms = False
    if jobs == NULL or bmax == NULL or bsum == NULL:
        free(jobs)
        free(bmax)
        free(bsum)
        return False
    # pass 1: block maxima
    _phased_block_maxima(x, N, C, bmax, n_threads)
    for i in range(N):
        # an ignored row's label is the ignore value, which nothing range-checks (a weight or a logit read
        # at it would lie anywhere): no job; every later pass tests _row_ignored before reading one
        if _row_ignored(a, i):
            continue
        _row_job_init(a, i, &jobs[i])
        _phased_row_max(bmax, i, C, &jobs[i])
        x_y = <double>x[i * C + jobs[i].y] if jobs[i].y >= 0 else 0.0
        xf_rowjob_plan(&jobs[i], x_y, grad != NULL)
    # pass 2: block sums of exponentials
    _phased_block_sums(x, N, C, jobs, a, grad, bsum, n_threads)
    for i in range(N):
        if not _row_ignored(a, i) and jobs[i].status == XF_ROW_OK:
            _phased_row_sum(x, bsum, i, C, &jobs[i])
    # pass 3: loss terms (probability targets, smoothing), where a row needs them (no team otherwise)
    for i in range(N):
        any_terms = any_terms or (not _row_ignored(a, i) and jobs[i].status == XF_ROW_OK and jobs[i].needs_terms)
        if (floating is float and not _row_ignored(a, i) and jobs[i].status == XF_ROW_OK and jobs[i].prob
                and jobs[i].needs_terms):
            # the row's, before its blocks: xf_xent_row's test (xf_terms_plain)
            jobs[i].targets_nonneg = _targets_nonneg(t + i * C, C)
    if any_terms:
        with parallel(num_threads=n_threads):
            fp_thread = xf_fp_ieee_enter()
            for task in prange(ntask, schedule="guided"):
                i = task // nb
                if _row_ignored(a, i) or jobs[i].status != XF_ROW_OK or not jobs[i].needs_terms:
                    continue
                b0 = (task % nb) * XF_BLOCK
                blen = min(C - b0, <Py_ssize_t>XF_BLOCK)
                if floating is float:
                    K32.terms_block(x + i * C + b0, blen, b0, &jobs[i],
                                            t + i * C + b0 if t != NULL else NULL,
                                            a.w + b0 if a.w != NULL else NULL, &bsum[4 * task])
                else:
                    K64.terms_block(x + i * C + b0, blen, b0, &jobs[i],
                                            t + i * C + b0 if t != NULL else NULL,
                                            a.w + b0 if a.w != NULL else NULL, &bsum[4 * task])
            xf_fp_ieee_leave(fp_thread)
    for i in range(N):
        if _row_ignored(a, i):
            loss[i] = 0.0
            continue
        acc[0] = 0.0
        acc[1] = 0.0
        acc[2] = 0.0
        acc[3] = 0.0
        if jobs[i].status == XF_ROW_OK and jobs[i].needs_terms:
            for b in range(nb):
                xf_terms_merge(acc, &bsum[4 * (i * nb + b)])
        if floating is float:
            K32.row_z_lse(x + i * C, C, &jobs[i], t + i * C if t != NULL else NULL, a.w, acc)
        else:
            xf_rowjob_tiny_loss_row(&jobs[i], x + i * C, t + i * C if t != NULL else NULL, a.w, C, acc)
            K64.row_z_lse(x + i * C, C, &jobs[i], t + i * C if t != NULL else NULL, a.w, acc)
        loss[i] = xf_rowjob_finish(&jobs[i], acc)
    # pass 4: gradient
    if grad != NULL:
        with parallel(num_threads=n_threads):
            fp_thread = xf_fp_ieee_enter()
            for task in prange(ntask, schedule="guided"):
                i = task // nb
                b0 = (task % nb) * XF_BLOCK
                blen = min(C - b0, <Py_ssize_t>XF_BLOCK)
                if _row_ignored(a, i):
                    _fill(grad + i * C + b0, blen, 0.0)
                elif jobs[i].status != XF_ROW_OK:
                    _fill(grad + i * C + b0, blen, NAN)
                elif floating is float:
                    K32.grad_block(x + i * C + b0, grad + i * C + b0, blen, b0, &jobs[i],
                                           t + i * C + b0 if t != NULL else NULL,
                                           a.w + b0 if a.w != NULL else NULL, NULL)
                else:
                    K64.grad_block(x + i * C + b0, grad + i * C + b0, blen, b0, &jobs[i],
                                           t + i * C + b0 if t != NULL else NULL,
                                           a.w + b0 if a.w != NULL else NULL, NULL)
            xf_fp_ieee_leave(fp_thread)
    free(jobs)
    free(bmax)
    free(bsum)
    return True


cdef inline bint _use_phased(Py_ssize_t n_rows, Py_ssize_t n_classes, int n_threads,
                             Py_ssize_t per_thread) noexcept nogil:
    # the (row, block) split: fewer rows than threads, rows longer than a block, and at least per_thread
    # entries per thread to pay for its passes (a team per pass, their barriers, the per-task state, and
    # no scratch row: a gradient evaluates its exponentials twice); else one thread per row
    return (n_threads > 1 and n_rows < n_threads and n_classes > XF_BLOCK
            and n_rows * n_classes >= n_threads * per_thread)


cdef inline Py_ssize_t _xent_phased_min(bint storage_is_float, bint has_grad) noexcept nogil:
    # softmax_xent's: one row, the kernel split on two threads against the row on one, us
    # (benchmarks/README.md, 2026-12-05, sixth round): forward float32 16384 classes 10 / 9, 32768 12 /
    # 16; fused float32 32768 28 / 27, 65536 55 / 62, 131072 96 / 129; float64 16384 forward 16 / 23, fused
    # 21 / 32.  16384 per thread is what xentfast._threads gives a thread anyway: only a float32 call with
    # a gradient (fused or backward) has a minimum of its own
    return (32768 if has_grad else 16384) if storage_is_float else 16384


cdef inline Py_ssize_t _family_phased_min(bint storage_is_float, int mode) noexcept nogil:
    # logsumexp / log_softmax / softmax's (_softmax_family_phased): one row, the kernel split on two
    # threads against the row on one, us (benchmarks/README.md, 2026-12-05, sixth round): float32
    # logsumexp / log_softmax 16384 classes 9 / 9, 13 / 12, 32768 11 / 14, 17 / 19; softmax 65536 58 /
    # 61, 98304 79 / 94, 131072 102 / 99 (a tie), 196608 132 / 175; float64 16384 13 / 20, 18 / 21, 17 /
    # 31.  16384 per thread is what xentfast._threads gives a thread anyway: only softmax's minimum gates
    return (49152 if mode == 2 else 16384) if storage_is_float else 16384


def use_phased(Py_ssize_t n_rows, Py_ssize_t n_classes, int n_threads, bint storage_is_float, bint has_grad):
    """Whether softmax_xent splits a call into (row, block) tasks (_use_phased)."""
    return _use_phased(n_rows, n_classes, n_threads, _xent_phased_min(storage_is_float, has_grad))


BLOCK = XF_BLOCK
GROUP_ROWS = XF_GROUP_ROWS
GROUP_MAX_C = XF_GROUP_MAX_C
# rows of more classes run without a scratch row (xent_kernels.h, xf_xent_wants_scratch)
SCRATCH_MAX_CLASSES = XF_SCRATCH_MAX_CLASSES


cdef void _set_xent_args(XentArgs *a, Py_ssize_t C, const int64_t[::1] y, const double[::1] w,
                         long long ignore_index, double eps, double z, const double[::1] row_scale, double scale,
                         bint has_y, bint has_w, bint has_row_scale, double loss_scale):
    a.y = &y[0] if has_y else NULL
    a.w = &w[0] if has_w else NULL
    a.w_min_pos = _least_positive(w) if has_w else 1.0
    a.row_scale = &row_scale[0] if has_row_scale else NULL
    a.ignore_index = ignore_index
    a.C = C
    a.eps = eps
    a.z = z
    a.scale = scale
    a.loss_scale = loss_scale
    a.prob = 0 if has_y else 1


def softmax_xent(const floating[:, ::1] x, const int64_t[::1] y, const floating[:, ::1] t,
                 const double[::1] w, long long ignore_index, double eps, double z,
                 const double[::1] row_scale, double scale, double[::1] loss,
                 floating[:, ::1] grad, int n_threads, bint has_y, bint has_t, bint has_w,
                 bint has_row_scale, bint has_grad, bint force_phased=False, double loss_scale=1.0,
                 bint row_groups=True):
    """Row losses into `loss` (double) and, when has_grad, the gradient into `grad` (may alias x).

    Arrays flagged absent may be empty placeholders.  All checks happened in xentfast.api.
    row_groups=False: short rows one by one even where groups apply (the tests compare the two).
    """
    cdef Py_ssize_t N = x.shape[0]
    cdef Py_ssize_t C = x.shape[1]
    cdef XentArgs a
    cdef const floating *xp
    cdef const floating *tp = NULL
    cdef floating *gp = NULL
    cdef bint want_scratch
    cdef bint groups
    cdef bint ok = True
    if N == 0 or C == 0:
        return
    xp = &x[0, 0]
    _set_xent_args(&a, C, y, w, ignore_index, eps, z, row_scale, scale, has_y, has_w, has_row_scale, loss_scale)
    if has_t:
        tp = &t[0, 0]
    if has_grad:
        gp = &grad[0, 0]
    groups = row_groups and C <= XF_GROUP_MAX_C
    want_scratch = xf_xent_wants_scratch(has_grad, has_t or eps != 0.0 or z != 0.0, floating is float,
                                         <const floating *>gp == xp, C)
    with nogil:
        if force_phased or _use_phased(N, C, n_threads, _xent_phased_min(floating is float, has_grad)):
            ok = _xent_phased(xp, gp, tp, &a, N, &loss[0], n_threads)
        elif groups:
            _xent_row_groups(xp, gp, tp, &a, N, &loss[0], n_threads)
        else:
            _xent_rows(xp, gp, tp, &a, N, &loss[0], n_threads, want_scratch)
    if not ok:
        raise MemoryError("cross-entropy: no memory for the per-block state of the row passes")


# the most classes softmax_xent_channels takes (the short-row groups' limit; beyond it the class axis is
# moved first, xentfast.api._rows)
CHANNELS_MAX_CLASSES = XF_GROUP_MAX_C


def softmax_xent_channels(const floating[:, :, ::1] x, const int64_t[::1] y, const floating[:, :, ::1] t,
                          const double[::1] w, long long ignore_index, double eps, double z,
                          const double[::1] row_scale, double scale, double[::1] loss,
                          floating[:, :, ::1] grad, int n_threads, bint has_y, bint has_t, bint has_w,
                          bint has_row_scale, bint has_grad, double loss_scale=1.0, bint row_groups=True):
    """softmax_xent of torch's layout: x (B, C, D), the classes of a row D apart (D = d1 * ..., the rows
    are the columns of B matrices (C, D)), rows numbered b D + p; the gradient (may alias x) and
    probability targets t in x's layout; y, row_scale and loss by row.  At most CHANNELS_MAX_CLASSES
    classes.  Each task takes a tile of positions into a thread's block (_xent_channel_tile) and runs its
    rows as softmax_xent would: the same bits, without moving the whole input's class axis first and the
    gradient's back after."""
    cdef Py_ssize_t B = x.shape[0]
    cdef Py_ssize_t C = x.shape[1]
    cdef Py_ssize_t D = x.shape[2]
    cdef Py_ssize_t P
    cdef XentArgs a
    cdef const floating *tp = NULL
    cdef floating *gp = NULL
    cdef floating[:, ::1] work
    if B == 0 or C == 0 or D == 0:
        return
    if C > XF_GROUP_MAX_C:
        raise ValueError(f"softmax_xent_channels: at most {XF_GROUP_MAX_C} classes, got {C}")
    _set_xent_args(&a, C, y, w, ignore_index, eps, z, row_scale, scale, has_y, has_w, has_row_scale, loss_scale)
    if has_t:
        tp = &t[0, 0, 0]
    if has_grad:
        gp = &grad[0, 0, 0]
    P = _channel_tile(C)
    n_threads = <int>max(1, min(<Py_ssize_t>n_threads, B * ((D + P - 1) // P)))
    work = np.empty((n_threads, _channel_work(C, P, has_t)), dtype=np.float32 if floating is float else np.float64)
    with nogil:
        _xent_channels(&x[0, 0, 0], gp, tp, &a, B, D, &loss[0], &work[0, 0], P, row_groups, n_threads)


cdef void _softmax_family_row(const floating *x, floating *out, double *lse, Py_ssize_t C, int mode,
                              Py_ssize_t i, xf_row_scratch *scratch) noexcept nogil:
    cdef xf_rowjob job
    if mode == 2:
        # softmax is the cross-entropy gradient of a row without a target under an upstream factor of 1:
        # p_j = e_j * (1 / S), each entry rounded once, with that kernel's passes (the exponentials kept
        # in the scratch row or the output, long rows written during the next row's sum pass).  NaN rows
        # come back NaN throughout; the row loss it returns has no meaning here, and without a logsumexp
        # output nothing reads log S either (log_s_unused: the sum pass skips it).
        xf_rowjob_init(&job, -1, 1.0, 0.0, 0.0, 1.0, 1.0, 0)
        job.log_s_unused = lse == NULL
        if floating is float:
            K32.xent_row(x + i * C, out + i * C, C, &job, NULL, NULL, scratch)
        else:
            K64.xent_row(x + i * C, out + i * C, C, &job, NULL, NULL, scratch)
    else:
        xf_rowjob_init(&job, -1, 1.0, 0.0, 0.0, 1.0, 1.0, 1)
        if floating is float:
            K32.row_max(x + i * C, C, &job)
            K32.row_sum(x + i * C, C, &job)
        else:
            K64.row_max(x + i * C, C, &job)
            K64.row_sum(x + i * C, C, &job)
    _softmax_family_finish(x, out, lse, C, mode, i, &job)


cdef void _softmax_family_finish(const floating *x, floating *out, double *lse, Py_ssize_t C, int mode,
                                 Py_ssize_t i, const xf_rowjob *job) noexcept nogil:
    # a row of the family after its sum pass: logsumexp's value, log_softmax's entries
    cdef Py_ssize_t b, b0, blen
    cdef Py_ssize_t block = XF_BLOCK
    if lse != NULL:
        # rows where max x and log S cancel are redone to the result's own precision (softmax_row.h)
        if floating is float:
            lse[i] = xf_rowjob_exact_lse_f32(job, x + i * C, C) if job.status == XF_ROW_OK else _row_logsumexp(job)
        else:
            lse[i] = xf_rowjob_exact_lse_f64(job, x + i * C, C) if job.status == XF_ROW_OK else _row_logsumexp(job)
    if mode != 1:
        return
    if job.status != XF_ROW_OK:
        _fill(out + i * C, C, NAN)
        return
    for b in range((C + block - 1) // block):
        b0 = b * block
        blen = min(C - b0, block)
        if floating is float:
            K32.log_softmax_block(x + i * C + b0, out + i * C + b0, blen, job.m, job.log_s, job.exp_normal == 1)
        else:
            K64.log_softmax_block(x + i * C + b0, out + i * C + b0, blen, job.m, job.log_s, job.exp_normal == 1)


cdef void _softmax_family_rows_batch(const floating *x, floating *out, double *lse, Py_ssize_t C, int mode,
                                    Py_ssize_t i0, Py_ssize_t n_rows, unsigned done) noexcept nogil:
    # logsumexp (mode 0; log_softmax, mode 1, would do too, but measured slower) of rows [i0, i0 + n_rows),
    # n_rows <= XF_GROUP_ROWS, but those whose bit r is set in done: the rows' max and sum passes with
    # their logarithms side by side (xf_rows_max_sum, softmax_rows.h), then each row as
    # _softmax_family_row finishes it, the same bits
    cdef xf_rowjob jobs[XF_GROUP_ROWS]
    cdef long long rows[XF_GROUP_ROWS]
    cdef int n = 0
    cdef int r
    cdef Py_ssize_t i
    for i in range(i0, i0 + n_rows):
        if (done >> (i - i0)) & 1:
            continue
        xf_rowjob_init(&jobs[n], -1, 1.0, 0.0, 0.0, 1.0, 1.0, 1)
        rows[n] = i
        n += 1
    if n == 0:
        return
    if floating is float:
        K32.rows_max_sum(x, C, rows, n, jobs)
    else:
        K64.rows_max_sum(x, C, rows, n, jobs)
    for r in range(n):
        _softmax_family_finish(x, out, lse, C, mode, rows[r], &jobs[r])


cdef inline double _row_logsumexp(const xf_rowjob *job) noexcept nogil:
    # the limits: an all -inf row sums to 0 (lse -inf), a +inf logit makes lse +inf, NaN stays NaN
    if job.status == XF_ROW_OK:
        return job.lse
    return NAN if job.has_nan else job.m


cdef void _softmax_family_group(const floating *x, floating *out, double *lse, Py_ssize_t C, int mode,
                                Py_ssize_t N, Py_ssize_t g, xf_row_scratch *scratch) noexcept nogil:
    # rows [g R, g R + R) of logsumexp (mode 0, into lse) / log_softmax / softmax (into out): side by side
    # where they qualify (xf_short_rows_family, softmax_rows.h), the others and a last partial group
    # through _softmax_family_row, whose bits the group reproduces
    cdef Py_ssize_t i0 = g * XF_GROUP_ROWS
    cdef Py_ssize_t r
    cdef unsigned done = 0
    cdef floating *group_out = NULL if mode == 0 else out + i0 * C
    if i0 + XF_GROUP_ROWS <= N:
        if floating is float:
            done = K32.short_rows_family(x + i0 * C, group_out, lse + i0 if mode == 0 else NULL, C, 0, mode)
        else:
            done = K64.short_rows_family(x + i0 * C, group_out, lse + i0 if mode == 0 else NULL, C, 0, mode)
    if done == (1u << XF_GROUP_ROWS) - 1:
        return
    if mode == 0:
        # the rows the group hands back, their logarithms side by side (_softmax_family_rows)
        _softmax_family_rows_batch(x, out, lse, C, mode, i0, min(<Py_ssize_t>XF_GROUP_ROWS, N - i0), done)
        return
    for r in range(min(<Py_ssize_t>XF_GROUP_ROWS, N - i0)):
        if not ((done >> r) & 1):
            _softmax_family_row(x, out, lse, C, mode, i0 + r, scratch)


# set_output_stores: -1 as measured, 1 streaming, 0 ordinary.  Process-wide and unsynchronised: read once
# per call before any team starts, and a hint only (no result depends on it)
cdef int _stores_forced = -1


cdef inline bint _may_stream(Py_ssize_t C, bint storage_is_float) noexcept nogil:
    # whether a call's rows may write by streaming stores: long enough for the path that runs them
    # (XF_STREAM_MIN_CLASSES_FOR), on a path that has them (not the baseline); only those calls look at
    # their output's pages
    return (C >= XF_STREAM_MIN_CLASSES_FOR(storage_is_float, _current_code)
            and _current_code != XF_PATH_BASELINE)


cdef inline bint _streaming_stores(const void *out, Py_ssize_t N, Py_ssize_t C, size_t itemsize,
                                   bint storage_is_float) noexcept nogil:
    # whether the long rows' pending output goes into `out` by streaming stores: unless they may stream and
    # the output is a new array whose pages are not mapped in yet (xf_memory_touched)
    if not _may_stream(C, storage_is_float):
        return True
    return xf_memory_touched(out, N * C * itemsize) if _stores_forced < 0 else _stores_forced == 1


cdef inline xf_row_scratch *_row_scratch(bint wanted, Py_ssize_t C, bint streaming) noexcept nogil:
    # a row driver thread's scratch row (xf_row_scratch_new), or NULL; its pending rows go out by ordinary
    # stores unless `streaming` (xf_row_scratch_new_output)
    cdef xf_row_scratch *s = xf_row_scratch_new(C) if wanted else NULL
    if not streaming:
        xf_row_scratch_new_output(s)
    return s


def set_output_stores(kind):
    """For the tests: how long rows write their pending output, "auto" (streaming stores where the
    output's pages are mapped in, ordinary ones into a new array's), "streaming" or "ordinary".  The same
    bits every way."""
    global _stores_forced
    kinds = {"auto": -1, "streaming": 1, "ordinary": 0}
    if kind not in kinds:
        raise ValueError(f"kind: one of {sorted(kinds)}")
    _stores_forced = kinds[kind]


def memory_touched(const unsigned char[::1] buf):
    """xf_memory_touched of a buffer's bytes (for the tests)."""
    return bool(xf_memory_touched(&buf[0], buf.shape[0])) if buf.shape[0] else True


cdef bint _softmax_family_phased(const floating *x, floating *out, double *lse, Py_ssize_t N, Py_ssize_t C,
                                 int mode, int n_threads) noexcept nogil:
    # Few long rows of the family: _xent_phased's (row, block) tasks with the statistics of
    # _softmax_family_row (logsumexp and log_softmax: no target, no plan; softmax: the gradient of a row
    # without a target, planned and finished as xf_xent_row does), then the output block by block:
    # log_softmax's xf_log_softmax_block, softmax's gradient block (its exponentials evaluated again, or for
    # float64 stored rows kept in the output by the sum pass).  The bits of the row path; False: no memory
    # for the per-task state (the caller runs the rows).
    cdef Py_ssize_t nb = (C + XF_BLOCK - 1) // XF_BLOCK
    cdef Py_ssize_t ntask = N * nb
    cdef Py_ssize_t task, i, b0, blen
    cdef xf_rowjob *jobs = <xf_rowjob *> malloc(N * sizeof(xf_rowjob))
    cdef xf_rowmax *bmax = <xf_rowmax *> malloc(ntask * sizeof(xf_rowmax))
    cdef double *bsum = <double *> malloc(2 * ntask * sizeof(double))
    cdef double terms[4]
    cdef xf_fp_state fp_thread = 0
    if jobs == NULL or bmax == NULL or bsum == NULL:
        free(jobs)
        free(bmax)
        free(bsum)
        return False
    _phased_block_maxima(x, N, C, bmax, n_threads)
    fp_thread = xf_fp_ieee_enter()
    for i in range(N):
        xf_rowjob_init(&jobs[i], -1, 1.0, 0.0, 0.0, 1.0, 1.0, 0 if mode == 2 else 1)
        _phased_row_max(bmax, i, C, &jobs[i])
        if mode == 2:
            xf_rowjob_plan(&jobs[i], 0.0, True)
    xf_fp_ieee_leave(fp_thread)
    _phased_block_sums(x, N, C, jobs, NULL, out if mode == 2 else NULL, bsum, n_threads)
    fp_thread = xf_fp_ieee_enter()
    for i in range(N):
        if jobs[i].status == XF_ROW_OK:
            _phased_row_sum(x, bsum, i, C, &jobs[i])
        if lse != NULL:
            if floating is float:
                lse[i] = xf_rowjob_exact_lse_f32(&jobs[i], x + i * C, C) if jobs[i].status == XF_ROW_OK else _row_logsumexp(&jobs[i])
            else:
                lse[i] = xf_rowjob_exact_lse_f64(&jobs[i], x + i * C, C) if jobs[i].status == XF_ROW_OK else _row_logsumexp(&jobs[i])
        if mode == 2:
            terms[0] = 0.0
            terms[1] = 0.0
            terms[2] = 0.0
            terms[3] = 0.0
            xf_rowjob_finish(&jobs[i], terms)
    xf_fp_ieee_leave(fp_thread)
    if mode != 0:
        with parallel(num_threads=n_threads):
            fp_thread = xf_fp_ieee_enter()
            for task in prange(ntask, schedule="guided"):
                i = task // nb
                b0 = (task % nb) * XF_BLOCK
                blen = min(C - b0, <Py_ssize_t>XF_BLOCK)
                if jobs[i].status != XF_ROW_OK:
                    _fill(out + i * C + b0, blen, NAN)
                elif mode == 1:
                    if floating is float:
                        K32.log_softmax_block(x + i * C + b0, out + i * C + b0, blen, jobs[i].m, jobs[i].log_s,
                                              jobs[i].exp_normal == 1)
                    else:
                        K64.log_softmax_block(x + i * C + b0, out + i * C + b0, blen, jobs[i].m, jobs[i].log_s,
                                              jobs[i].exp_normal == 1)
                elif floating is float:
                    K32.grad_block(x + i * C + b0, out + i * C + b0, blen, b0, &jobs[i], NULL, NULL, NULL)
                else:
                    K64.grad_block(x + i * C + b0, out + i * C + b0, blen, b0, &jobs[i], NULL, NULL, NULL)
            xf_fp_ieee_leave(fp_thread)
    free(jobs)
    free(bmax)
    free(bsum)
    return True


cdef void _softmax_family_rows(const floating *x, floating *out, double *lse, Py_ssize_t N, Py_ssize_t C,
                               int mode, int n_threads, bint row_groups, bint force_phased=False) noexcept nogil:
    # every row of a call (softmax_family, the plain-call lane): short rows side by side unless
    # row_groups is off; on the calling thread for one thread (no team to start, as _xent_row_groups),
    # else on a team of n_threads.  lse: logsumexp's output (mode 0) and only then.  softmax's rows get
    # the scratch rows of the gradient they are (_softmax_family_row), and read the next row's max ahead
    # as the main driver's rows with a gradient do (the output is never the input)
    cdef Py_ssize_t i
    cdef xf_fp_state fp_thread = 0
    cdef bint groups = row_groups and (mode == 0) == (lse != NULL) and C <= XF_GROUP_MAX_C
    # logsumexp's longer rows XF_GROUP_ROWS a task, as the losses' (_xent_rows): 4096x1000 one thread
    # float32 1.45 -> 1.35 ms, float64 3.18 -> 3.12.  Not log_softmax's: its entries written after the
    # batch's sum passes, not each row's right after its own, measured 6-7 % slower (float32 1.92 -> 2.06,
    # float64 4.55 -> 4.81; benchmarks/README.md, 2026-12-07, third round)
    cdef bint batches = not groups and mode == 0 and xf_forward_in_batches(N, C, n_threads)
    cdef Py_ssize_t n_tasks = (N + XF_GROUP_ROWS - 1) // XF_GROUP_ROWS if groups or batches else N
    cdef bint is_float = floating is float
    cdef bint want_scratch = mode == 2 and xf_xent_wants_scratch(True, False, is_float, False, C)
    cdef xf_row_scratch *scratch = NULL
    # the output is made for the call: where its pages are new, ordinary stores (xf_pending_stream)
    cdef bint streaming = True
    if force_phased or _use_phased(N, C, n_threads, _family_phased_min(is_float, mode)):
        if _softmax_family_phased(x, out, lse, N, C, mode, n_threads):
            return
    # one thread per row at most
    n_threads = <int>min(<Py_ssize_t>n_threads, max(n_tasks, 1))
    streaming = not want_scratch or _streaming_stores(out, N, C, sizeof(floating), is_float)
    if n_threads == 1:
        fp_thread = xf_fp_ieee_enter()
        scratch = _row_scratch(want_scratch, C, streaming)
        xf_row_scratch_read_ahead(scratch, x + N * C)
        for i in range(n_tasks):
            if groups:
                _softmax_family_group(x, out, lse, C, mode, N, i, scratch)
            elif batches:
                _softmax_family_rows_batch(x, out, lse, C, mode, i * XF_GROUP_ROWS,
                                           min(<Py_ssize_t>XF_GROUP_ROWS, N - i * XF_GROUP_ROWS), 0)
            else:
                _softmax_family_row(x, out, lse, C, mode, i, scratch)
        xf_row_scratch_release(scratch)
        xf_fp_ieee_leave(fp_thread)
        return
    with parallel(num_threads=n_threads):
        fp_thread = xf_fp_ieee_enter()
        scratch = _row_scratch(want_scratch, C, streaming)
        xf_row_scratch_read_ahead(scratch, x + N * C)
        for i in prange(n_tasks, schedule="guided"):
            if groups:
                _softmax_family_group(x, out, lse, C, mode, N, i, scratch)
            elif batches:
                _softmax_family_rows_batch(x, out, lse, C, mode, i * XF_GROUP_ROWS,
                                           min(<Py_ssize_t>XF_GROUP_ROWS, N - i * XF_GROUP_ROWS), 0)
            else:
                _softmax_family_row(x, out, lse, C, mode, i, scratch)
        xf_row_scratch_release(scratch)
        xf_fp_ieee_leave(fp_thread)


def group_rows_taken(const floating[:, ::1] x, floating[:, ::1] out, int kind):
    """The rows of x's first GROUP_ROWS that the current path's short-row groups take, as a bit mask (0: no
    group applies); out (x's shape) takes what they write.  kind 0, 1, 2: logsumexp, log_softmax, softmax;
    3: cross-entropy with index targets 0, forward; 4: the same with its gradient; 5, 6: 3 and 4 with label
    smoothing 0.1; 7, 8: 3 and 4 with uniform probability targets instead; 9, 10: 3 and 4 with a z-loss of
    1e-3.  For the tests: comparing groups with rows bit for bit shows nothing where no row was grouped."""
    cdef Py_ssize_t C = x.shape[1]
    cdef int64_t y[XF_GROUP_ROWS]
    cdef double loss[XF_GROUP_ROWS]     # cross-entropy's row losses, or logsumexp's values
    cdef unsigned done = 0
    cdef xf_fp_state fp_thread = 0
    cdef floating *op = NULL
    cdef int r
    cdef double eps = 0.1 if 5 <= kind <= 6 else 0.0
    cdef double z = 1e-3 if kind >= 9 else 0.0
    cdef const floating[:, ::1] t_rows = x
    cdef const floating *tp = NULL
    if x.shape[0] < XF_GROUP_ROWS or C == 0 or out.shape[0] != x.shape[0] or out.shape[1] != C:
        raise ValueError(f"x needs {XF_GROUP_ROWS} rows and a class, out x's shape")
    if 7 <= kind <= 8:
        import numpy
        t_rows = numpy.full((x.shape[0], C), 1.0 / C, dtype=numpy.asarray(x).dtype)
        tp = &t_rows[0, 0]
    if not 0 <= kind <= 10:
        raise ValueError("kind: 0-10")
    for r in range(XF_GROUP_ROWS):
        y[r] = 0
    if kind in (1, 2, 4, 6, 8, 10):
        op = &out[0, 0]
    fp_thread = xf_fp_ieee_enter()
    if kind <= 2:
        if floating is float:
            done = K32.short_rows_family(&x[0, 0], op, &loss[0] if kind == 0 else NULL, C, 0, kind)
        else:
            done = K64.short_rows_family(&x[0, 0], op, &loss[0] if kind == 0 else NULL, C, 0, kind)
    else:
        if floating is float:
            done = K32.short_rows(&x[0, 0], tp, op, C, 0, y, -100, NULL, 1.0, 1.0, NULL, loss, eps, z, 1.0)
        else:
            done = K64.short_rows(&x[0, 0], tp, op, C, 0, y, -100, NULL, 1.0, 1.0, NULL, loss, eps, z, 1.0)
    xf_fp_ieee_leave(fp_thread)
    return done


def softmax_family(const floating[:, ::1] x, floating[:, ::1] out, double[::1] lse, int mode,
                   int n_threads, bint has_lse, bint row_groups=True, bint force_phased=False):
    """mode 0: logsumexp only (into lse); 1: log_softmax into out; 2: softmax into out.

    row_groups=False: short rows one by one even where groups apply; force_phased: the (row, block) split
    even where it does not pay (the tests compare each with the row path)."""
    cdef Py_ssize_t N = x.shape[0]
    cdef Py_ssize_t C = x.shape[1]
    cdef floating *op = NULL
    cdef double *lp = NULL
    if N == 0 or C == 0:
        return
    if mode != 0:
        op = &out[0, 0]
    if has_lse:
        lp = &lse[0]
    with nogil:
        _softmax_family_rows(&x[0, 0], op, lp, N, C, mode, n_threads, row_groups, force_phased)


cdef void _family_channel_tile(const floating *x, floating *out, double *lse, Py_ssize_t C, int mode,
                               Py_ssize_t D, Py_ssize_t i0, Py_ssize_t n, Py_ssize_t P, floating *work,
                               xf_row_scratch *scratch) noexcept nogil:
    # _xent_channel_tile's way for the softmax family (mode 0 logsumexp into lse, by row; 1 log_softmax
    # and 2 softmax into out, x's layout): the tile's n <= P positions copied as they lie into a (C, P)
    # block, its groups run there (xf_short_rows_family, D = P; a last partial group padded) into a
    # second block copied back; the rows a group hands back through _softmax_family_row on a row
    # gathered from the block, their output rows scattered into the second block.  work: 2 P C + 2 C
    # items.
    cdef floating *block = work
    cdef floating *out_block = work + P * C
    cdef floating *row = out_block + P * C
    cdef floating *out_row = row + C
    cdef Py_ssize_t g, r, r0, n_rows
    cdef unsigned done
    # a last partial group runs padded to a whole one (_xent_channel_tile), its lse here
    cdef double pad_lse[XF_GROUP_ROWS]
    cdef double *group_lse
    _copy_positions(x, D, block, P, C, n)
    for g in range((n + XF_GROUP_ROWS - 1) // XF_GROUP_ROWS):
        r0 = g * XF_GROUP_ROWS
        n_rows = min(<Py_ssize_t>XF_GROUP_ROWS, n - r0)
        group_lse = lse + i0 + r0 if mode == 0 else NULL
        if n_rows < XF_GROUP_ROWS:
            _zero_positions(block, P, C, n, r0 + XF_GROUP_ROWS)
            group_lse = pad_lse if mode == 0 else NULL
        if floating is float:
            done = K32.short_rows_family(block + r0, out_block + r0 if mode != 0 else NULL, group_lse, C, P, mode)
        else:
            done = K64.short_rows_family(block + r0, out_block + r0 if mode != 0 else NULL, group_lse, C, P, mode)
        if n_rows < XF_GROUP_ROWS:
            done &= (1u << n_rows) - 1
            for r in range(n_rows):
                if mode == 0 and (done >> r) & 1:
                    lse[i0 + r0 + r] = pad_lse[r]
        if done == (1u << XF_GROUP_ROWS) - 1:
            continue
        for r in range(n_rows):
            if not ((done >> r) & 1):
                _gather_rows(block + r0 + r, C, P, row, 0, 1)
                _softmax_family_row(row, out_row, lse + i0 + r0 + r if mode == 0 else NULL, C, mode, 0, scratch)
                if mode != 0:
                    # a row the kernel left pending (xf_row_scratch) completes before it is read
                    xf_row_scratch_finish(scratch)
                    _scatter_rows(out_row, C, P, out_block + r0 + r, 0, 1)
    if mode != 0:
        _copy_positions(out_block, P, out, D, C, n)


cdef void _family_channels(const floating *x, floating *out, double *lse, Py_ssize_t C, int mode, Py_ssize_t B,
                           Py_ssize_t D, floating *work, Py_ssize_t P, int n_threads) noexcept nogil:
    # every row of a softmax family call in torch's layout (_xent_channels' tasks and blocks)
    cdef Py_ssize_t per_matrix = (D + P - 1) // P
    cdef Py_ssize_t task, b, p0
    cdef floating *mine = NULL
    cdef xf_fp_state fp_thread = 0
    cdef xf_row_scratch *scratch = NULL
    cdef bint want_scratch = mode == 2 and xf_xent_wants_scratch(True, False, floating is float, False, C)
    with parallel(num_threads=n_threads):
        fp_thread = xf_fp_ieee_enter()
        # pending rows go out by ordinary stores: the block is read right after
        scratch = _row_scratch(want_scratch, C, False)
        mine = work + threadid() * (2 * P * C + 2 * C)
        for task in prange(B * per_matrix, schedule="guided"):
            b = task // per_matrix
            p0 = (task % per_matrix) * P
            _family_channel_tile(x + b * C * D + p0, out + b * C * D + p0 if out != NULL else NULL, lse, C, mode,
                                 D, b * D + p0, min(P, D - p0), P, mine, scratch)
        xf_row_scratch_release(scratch)
        xf_fp_ieee_leave(fp_thread)


cdef bint _family_groups_take(Py_ssize_t C, int mode, floating *work) noexcept nogil:
    # whether the current path's groups take rows of C classes in torch's layout: one group of zeros (C,
    # XF_GROUP_ROWS) in work, its output after it; a path or width without groups does none
    cdef double lse[XF_GROUP_ROWS]
    cdef unsigned done
    cdef xf_fp_state fp = xf_fp_ieee_enter()
    memset(work, 0, C * XF_GROUP_ROWS * sizeof(floating))
    if floating is float:
        done = K32.short_rows_family(work, work + C * XF_GROUP_ROWS, lse, C, XF_GROUP_ROWS, mode)
    else:
        done = K64.short_rows_family(work, work + C * XF_GROUP_ROWS, lse, C, XF_GROUP_ROWS, mode)
    xf_fp_ieee_leave(fp)
    return done == (1u << XF_GROUP_ROWS) - 1


def softmax_family_channels(const floating[:, :, ::1] x, floating[:, :, ::1] out, double[::1] lse, int mode,
                            int n_threads):
    """softmax_family of torch's layout: x (B, C, D) as softmax_xent_channels reads it, log_softmax's or
    softmax's out (mode 1, 2) in x's layout, logsumexp's lse (mode 0) by row, b D + p.  The same bits
    as softmax_family on the moved rows.  Returns False, having written nothing, where the current path's
    short-row groups do not take C classes (no gain over moving the class axis first)."""
    cdef Py_ssize_t B = x.shape[0]
    cdef Py_ssize_t C = x.shape[1]
    cdef Py_ssize_t D = x.shape[2]
    cdef Py_ssize_t P
    cdef floating *op = NULL
    cdef floating[:, ::1] work
    cdef bint taken
    if not 0 <= mode <= 2:
        raise ValueError(f"mode: 0, 1 or 2, got {mode}")
    if B == 0 or C == 0 or D == 0:
        return True
    if C > XF_GROUP_MAX_C:
        return False
    if mode != 0:
        op = &out[0, 0, 0]
    P = _channel_tile(C)
    n_threads = <int>max(1, min(<Py_ssize_t>n_threads, B * ((D + P - 1) // P)))
    work = np.empty((n_threads, 2 * P * C + 2 * C), dtype=np.float32 if floating is float else np.float64)
    with nogil:
        taken = _family_groups_take(C, mode, &work[0, 0])
        if taken:
            _family_channels(&x[0, 0, 0], op, &lse[0] if mode == 0 else NULL, C, mode, B, D, &work[0, 0], P,
                             n_threads)
    return taken


cdef extern from "xentfast/ddsum.h" nogil:
    enum: XF_DDSUM_BLOCK
    long long xf_ddsum_nblocks(long long n)
    void xf_ddsum_block(const double *v, long long n, long long b, double *part)
    void xf_ddsum_tree(double *part, long long nb)


cdef bint _dd_sum_into(const double *v, long long n, int n_threads, double *hi, double *lo) noexcept nogil:
    """dd_sum's value into (hi, lo), for C callers too (the plain-call lane passes n_threads=1); False
    when it cannot allocate the partials."""
    cdef long long nb = xf_ddsum_nblocks(n)
    cdef long long b
    cdef double one[2]
    cdef double *part
    cdef int nt
    cdef xf_fp_state fp_thread = 0
    if nb <= 1:
        # one block: no partials array, no thread
        one[0] = 0.0
        one[1] = 0.0
        if nb == 1:
            xf_ddsum_block(v, n, 0, one)
        hi[0] = one[0]
        lo[0] = one[1]
        return True
    nt = n_threads if n_threads > 0 else omp_get_max_threads()
    nt = <int>max(1, min(<long long>nt, nb // 16))
    part = <double *>malloc(2 * nb * sizeof(double))
    if part == NULL:
        return False
    if nt == 1:
        fp_thread = xf_fp_ieee_enter()
        for b in range(nb):
            xf_ddsum_block(v, n, b, part)
        xf_fp_ieee_leave(fp_thread)
    else:
        with parallel(num_threads=nt):
            fp_thread = xf_fp_ieee_enter()
            for b in prange(nb, schedule="guided"):
                xf_ddsum_block(v, n, b, part)
            xf_fp_ieee_leave(fp_thread)
    xf_ddsum_tree(part, nb)
    hi[0] = part[0]
    lo[0] = part[1]
    free(part)
    return True


def dd_sum(const double[::1] v, int n_threads=-1):
    """Double-double sum of v: (hi, lo).  The fixed shape of xentfast/ddsum.h (blocks of XF_DDSUM_BLOCK
    consecutive elements summed in fixed interleaved lanes, then a fixed pairwise tree of the partials), so the bits
    depend on v alone: not on `n_threads` (-1: OpenMP's default, capped so that each thread gets at
    least 16 blocks) and not on the device (xentfast._cuda.dd_sum runs the same header)."""
    cdef double hi, lo
    cdef bint ok
    with nogil:
        ok = _dd_sum_into(&v[0] if v.shape[0] > 0 else NULL, v.shape[0], n_threads, &hi, &lo)
    if not ok:
        raise MemoryError()
    return hi, lo


def block_max(const floating[::1] x):
    """The max pass of one block of at most BLOCK entries on the selected CPU path (for the tests):
    (max, first index of the max, NaN count, count above -inf, least entry above -inf), NaN-blind: a
    block of NaNs alone gives the max -inf, index 0 and the least entry +inf."""
    cdef xf_rowmax st
    cdef Py_ssize_t n = x.shape[0]
    if n < 1 or n > XF_BLOCK:
        raise ValueError(f"x: a block holds 1 to {XF_BLOCK} entries, got {n}")
    with nogil:
        if floating is float:
            K32.max_block(&x[0], n, 0, &st)
        else:
            K64.max_block(&x[0], n, 0, &st)
    return st.m, st.argmax, st.n_nan, st.n_finite, st.min_finite


def target_weight_sum(const int64_t[::1] y, const double[::1] w, long long ignore_index, bint has_w,
                      long long C):
    """Sum of w[y_i] over non-ignored rows (torch's `mean` denominator), double-double, rounded.

    Labels outside [0, C) are skipped, never read through: the GPU twin computes this alongside the
    label check, before the caller has seen whether the labels are valid (xentfast._backend (b))."""
    cdef double hi = 0.0, lo = 0.0
    cdef Py_ssize_t i
    cdef long long count = 0
    cdef int64_t v
    with nogil:
        if not has_w:
            # a sum of ones is the count, and the double-double sum rounds to the double nearest it: the
            # same number without a dependent double-double addition per row (~6 ns each, 8 % of a
            # forward (16384, 10) call on one thread)
            for i in range(y.shape[0]):
                v = y[i]
                count += (v != ignore_index) & (0 <= v) & (v < C)
        else:
            for i in range(y.shape[0]):
                if y[i] != ignore_index and 0 <= y[i] < C:
                    xf_dd_add(&hi, &lo, w[y[i]], 0.0)
    return hi + lo if has_w else <double>count


def fp_ieee_enter():
    """Clear flush-to-zero / denormals-are-zero on the calling thread; returns the state to restore."""
    return xf_fp_ieee_enter()


def fp_ieee_leave(unsigned long long saved):
    """Restore the state fp_ieee_enter returned."""
    xf_fp_ieee_leave(saved)


def _init_cpu_path():
    import os
    set_cpu_path(os.environ.get("XENTFAST_CPU", "auto") or "auto")


_init_cpu_path()


# ---- the plain-call lane ------------------------------------------------------------------------------
# A small problem's time is mostly Python: argument checks, dispatch, the reduction (an (8, 100) call
# spends ~12 us there against ~3 us of kernel).  The lane below takes the most common call, decided by
# C-level type and flag tests, and runs what xentfast.api would run for it with the same row function,
# the same dd_sum shape and the same arithmetic of the reduction, on the calling thread (the single
# thread xentfast._threads picks for fewer than 2 * MIN_ELEMENTS_PER_THREAD elements).  Larger calls take
# it too, on the threads xentfast._threads would start, short rows side by side and longer ones through
# softmax_xent's row driver (_xent_rows), but not those softmax_xent splits into (row, block) tasks (few
# rows of more than a block, large enough for several threads: _use_phased): there the Python around the
# kernel was still a quarter of the call (forward 4096x10 float32: ~40 of ~110 us on two threads;
# 16384x10 fused: ~100 of ~420 us), and 40-120 us of a fused call on rows of 1000 classes (64x1000
# float32, two threads: 64 -> 30 us; 4096x1000: 1.72-1.81 -> 1.63-1.69 ms; benchmarks/README.md,
# 2026-12-05, sixth round).  Anything else,
# and anything unusual it meets on the way (a label out of range, nothing to average, a sum small enough
# for the tiny-terms rerun), returns NotImplemented, and the caller takes the general path, which also
# raises the errors; nothing here raises.  tests/test_plain_lane.py holds the two paths to the same bits.

cimport numpy as cnp
from libc.math cimport frexp, ldexp, fabs, fmax

from ._plain cimport (PLAIN_MAX_ELEMENTS, PLAIN_MIN_ELEMENTS_PER_THREAD, plain_float_array, plain_n_threads,
                      plain_options, plain_out, plain_reduction, plain_scalar, plain_threads, plain_zero)

cnp.import_array()

# A sum of n losses at most n 2^-968 may hold losses below 2^-969, which the tiny-terms rerun recomputes
# scaled (xentfast.api._sum_and_tiny); above it, none can be.  One constant for every caller of that test.
TINY_SUM_PER_TERM = 2.0 ** -968
# xentfast._threads.MIN_ELEMENTS_PER_THREAD as the lane knows it (tests/test_plain_lane.py compares them)
LANE_MIN_ELEMENTS_PER_THREAD = PLAIN_MIN_ELEMENTS_PER_THREAD
cdef double _TINY_SUM = TINY_SUM_PER_TERM
# Every reduced term below 2^-969 (and one not 0): their sum is taken again from the losses 2^600 larger
# (xentfast.api._tiny_terms, _Problem.reduce; the lane's _tiny_terms below).  The general paths read both here.
TINY_TERM = 2.0 ** -969
cdef enum:
    _TINY_RERUN_EXP = 600
TINY_RERUN_EXP = _TINY_RERUN_EXP
cdef double _TINY_TERM = TINY_TERM


cdef bint _tiny_terms(const double *v, Py_ssize_t n) noexcept nogil:
    """xentfast.api._tiny_terms(max |v|): every |v_i| below TINY_TERM and one not 0 (a NaN is neither)."""
    cdef Py_ssize_t i
    cdef double biggest = 0.0
    for i in range(n):
        if not fabs(v[i]) < _TINY_TERM:
            return False
        biggest = fmax(biggest, fabs(v[i]))
    return biggest > 0.0


cdef void _plain_rows(const void *xp, void *gp, const XentArgs *a, Py_ssize_t N, double *loss, int n_team,
                      bint f32, bint rows_alone) noexcept nogil:
    # the general path's rows: short ones side by side (_xent_row_group), the same bits; a small call's
    # longer rows one by one on the calling thread (_xent_row_groups: no team to start).  gp: the gradient
    # buffer, or NULL for the losses alone
    if f32 and rows_alone:
        _xent_rows(<const float *>xp, <float *>gp, NULL, a, N, loss, n_team,
                   xf_xent_wants_scratch(gp != NULL, False, True, False, a.C))
    elif rows_alone:
        _xent_rows(<const double *>xp, <double *>gp, NULL, a, N, loss, n_team,
                   xf_xent_wants_scratch(gp != NULL, False, False, False, a.C))
    elif f32:
        _xent_row_groups(<const float *>xp, <float *>gp, NULL, a, N, loss, n_team)
    else:
        _xent_row_groups(<const double *>xp, <double *>gp, NULL, a, N, loss, n_team)


def lane_threads(n_threads, Py_ssize_t n_elements):
    """The lane's thread count (plain_threads; tests/test_plain_lane.py holds it to
    xentfast._threads.threads_for)."""
    return plain_threads(n_threads, n_elements)


cdef object _plain_xent(object input, object target, object ignore_index, int red, object out,
                        bint with_grad, object n_threads):
    cdef cnp.ndarray x, y, g, loss_o
    cdef Py_ssize_t N, C, i
    cdef long long ign, yi
    cdef const int64_t *yp
    cdef Py_ssize_t kept = 0
    cdef XentArgs a
    cdef double *loss
    cdef double den = 0.0, hi = 0.0, lo = 0.0, total = 0.0
    cdef float total32 = 0.0
    cdef int k = 0
    cdef bint f32, ok
    cdef xf_fp_state fp_saved
    cdef int n_team = 1
    cdef bint rows_alone = False
    cdef const void *xp
    cdef void *gp = NULL
    cdef int tiny_exp, den_e = 0
    cdef double den_m
    if not plain_float_array(input) or type(target) is not cnp.ndarray:
        return NotImplemented
    x = <cnp.ndarray>input
    y = <cnp.ndarray>target
    if (cnp.PyArray_NDIM(x) != 2 or cnp.PyArray_NDIM(y) != 1 or cnp.PyArray_TYPE(y) != cnp.NPY_INT64
            or not cnp.PyArray_IS_C_CONTIGUOUS(y) or not cnp.PyArray_ISALIGNED(y)
            or not cnp.PyArray_ISNOTSWAPPED(y)):
        return NotImplemented
    N = cnp.PyArray_DIMS(x)[0]
    C = cnp.PyArray_DIMS(x)[1]
    if N == 0 or C == 0 or cnp.PyArray_DIMS(y)[0] != N:
        return NotImplemented
    if N * C >= PLAIN_MAX_ELEMENTS:
        n_team = plain_threads(n_threads, N * C)
        if n_team < 1 or _use_phased(N, C, n_team, _xent_phased_min(cnp.PyArray_TYPE(x) == cnp.NPY_FLOAT32,
                                                                    with_grad)):
            return NotImplemented
        # rows beyond the groups: softmax_xent's row driver (its scratch rows, stores and read-ahead)
        rows_alone = C > XF_GROUP_MAX_C
    if type(ignore_index) is not int:
        return NotImplemented
    try:
        ign = ignore_index
    except OverflowError:                  # beyond int64: the general path's
        return NotImplemented
    if with_grad and out is not None and not plain_out(out, x, y):
        return NotImplemented
    # the label check of xentfast.api._index_targets, which counts the kept rows (the mean's denominator)
    yp = <const int64_t *>cnp.PyArray_DATA(y)
    for i in range(N):
        yi = yp[i]
        if yi != ign:
            if yi < 0 or yi >= C:
                return NotImplemented
            kept += 1
    if red == 1:
        if kept == 0:
            return NotImplemented          # empty_mean's constant: the general path
        den = <double>kept
        frexp(den, &k)                     # _Problem.loss_scale(): 2^-k >= 1 / den, exact
        k = min(max(k, -1000), 1000)
    f32 = cnp.PyArray_TYPE(x) == cnp.NPY_FLOAT32
    if with_grad:
        g = out if out is not None else cnp.PyArray_EMPTY(2, cnp.PyArray_DIMS(x), cnp.PyArray_TYPE(x), 0)
        gp = cnp.PyArray_DATA(g)
    xp = cnp.PyArray_DATA(x)
    if red == 0:
        loss_o = cnp.PyArray_EMPTY(1, cnp.PyArray_DIMS(y), cnp.PyArray_TYPE(x), 0)
    loss = <double *>malloc(N * sizeof(double))
    if loss == NULL:
        return NotImplemented
    a.y = yp
    a.w = NULL
    a.w_min_pos = 1.0
    a.row_scale = NULL
    a.ignore_index = ign
    a.C = C
    a.eps = 0.0
    a.z = 0.0
    a.scale = (1.0 / den) if red == 1 else 1.0    # _Problem.upstream(None)
    a.loss_scale = ldexp(1.0, -k)
    a.prob = 0
    ok = True
    # every rounding below happens inside the subnormal guard, the float32 ones included (a caller's
    # flush-to-zero would otherwise flush a subnormal result)
    with nogil:
        fp_saved = xf_fp_ieee_enter()
        _plain_rows(xp, gp, &a, N, loss, n_team, f32, rows_alone)
        if red == 0:
            for i in range(N):
                if f32:
                    (<float *>cnp.PyArray_DATA(loss_o))[i] = <float>loss[i]
                else:
                    (<double *>cnp.PyArray_DATA(loss_o))[i] = loss[i]
        else:
            ok = _dd_sum_into(loss, N, n_team, &hi, &lo)
            # _sum_and_tiny's test (a sum this small may hold losses below 2^-969), then _tiny_terms:
            # every loss below 2^-969 and one not 0.  The general path then takes the losses again,
            # 2^600 larger (_Problem.reduce); so does the lane, with the same launch and the same sum.
            # Handing such calls to the general path had run the kernel three times in all: here, there,
            # and there again scaled (float64 rows whose other logits lie 620-745 below the target's;
            # benchmarks/README.md, fifteenth round).  A sum of zeros is taken as it is, as there.
            if ok and fabs(hi) <= N * _TINY_SUM and _tiny_terms(loss, N):
                tiny_exp = min(_TINY_RERUN_EXP - k, 1023)
                a.scale = 1.0                                   # no gradient: the launch's factor
                a.loss_scale = ldexp(1.0, tiny_exp)
                _plain_rows(xp, NULL, &a, N, loss, n_team, f32, rows_alone)
                ok = _dd_sum_into(loss, N, n_team, &hi, &lo)
                k = -tiny_exp
            if red == 2:
                total = (hi + lo) * ldexp(1.0, k)
            else:
                # den = m 2^e: the general path's division by m and one scaling by 2^(k - e) (k = e but
                # after the rerun, where it is the one rounding onto the subnormal grid)
                den_m = frexp(den, &den_e)
                total = ldexp(hi / den_m + lo / den_m, k - den_e)
            if f32:
                total32 = <float>total
        xf_fp_ieee_leave(fp_saved)
    free(loss)
    if red == 0:
        result = loss_o
    else:
        if not ok:
            return NotImplemented
        result = plain_scalar(total, total32, f32)
    return (result, g) if with_grad else result


def plain_cross_entropy(input, target, weight=None, ignore_index=-100, reduction="mean", label_smoothing=0.0, *,
                        axis=-1, z_loss=0.0, empty_mean="nan", nan_policy="propagate", n_threads=None):
    """xentfast.cross_entropy for the plain call (the lane above), else NotImplemented."""
    cdef int red = plain_reduction(reduction)
    if (red < 0 or weight is not None or not plain_zero(label_smoothing) or not plain_zero(z_loss)
            or type(axis) is not int or not (axis == -1 or axis == 1)
            or not plain_options(empty_mean, nan_policy, n_threads)):
        return NotImplemented
    return _plain_xent(input, target, ignore_index, red, None, False, n_threads)


def plain_cross_entropy_with_grad(input, target, weight=None, ignore_index=-100, reduction="mean",
                                  label_smoothing=0.0, *, axis=-1, z_loss=0.0, empty_mean="nan",
                                  nan_policy="propagate", grad_output=None, out=None, inplace=False,
                                  n_threads=None):
    """xentfast.cross_entropy_with_grad for the plain call (the lane above), else NotImplemented."""
    cdef int red = plain_reduction(reduction)
    if (red < 0 or weight is not None or not plain_zero(label_smoothing) or not plain_zero(z_loss)
            or type(axis) is not int or not (axis == -1 or axis == 1) or grad_output is not None
            or inplace is not False or not plain_options(empty_mean, nan_policy, n_threads)):
        return NotImplemented
    return _plain_xent(input, target, ignore_index, red, out, True, n_threads)


cdef object _plain_family(object input, object axis, object n_threads, int mode):
    # xentfast.log_softmax (mode 1), softmax (2) or logsumexp (0) of a float32/float64 NumPy array
    # along its last axis: the rows and output of xentfast.api._softmax_family, which for these dtypes
    # rounds nothing after the kernel (its output, and logsumexp's cast of the double row values, are
    # the arrays returned here)
    cdef cnp.ndarray x, res
    cdef double *lse = NULL
    cdef Py_ssize_t N, C, i
    cdef int nd, n_team
    cdef bint f32
    cdef xf_fp_state fp_saved
    if not plain_float_array(input):
        return NotImplemented
    x = <cnp.ndarray>input
    nd = cnp.PyArray_NDIM(x)
    if nd < 1 or type(axis) is not int or not (axis == -1 or axis == nd - 1):
        return NotImplemented
    if not plain_n_threads(n_threads):
        return NotImplemented
    C = cnp.PyArray_DIMS(x)[nd - 1]
    N = cnp.PyArray_SIZE(x) // C if C else 0
    if N == 0 or C == 0:
        return NotImplemented
    n_team = plain_threads(n_threads, N * C)
    if n_team < 1:
        return NotImplemented
    f32 = cnp.PyArray_TYPE(x) == cnp.NPY_FLOAT32
    if mode == 0:
        res = cnp.PyArray_EMPTY(nd - 1, cnp.PyArray_DIMS(x), cnp.PyArray_TYPE(x), 0)
        lse = <double *>malloc(N * sizeof(double))
        if lse == NULL:
            return NotImplemented
    else:
        res = cnp.PyArray_EMPTY(nd, cnp.PyArray_DIMS(x), cnp.PyArray_TYPE(x), 0)
    with nogil:
        # logsumexp's float32 rounding inside the subnormal guard, as the kernels' own (a caller's
        # flush-to-zero would otherwise flush a subnormal result)
        fp_saved = xf_fp_ieee_enter()
        if f32:
            _softmax_family_rows(<const float *>cnp.PyArray_DATA(x),
                                 NULL if mode == 0 else <float *>cnp.PyArray_DATA(res), lse, N, C, mode, n_team,
                                 True)
            for i in range(N if mode == 0 else 0):
                (<float *>cnp.PyArray_DATA(res))[i] = <float>lse[i]
        else:
            _softmax_family_rows(<const double *>cnp.PyArray_DATA(x),
                                 NULL if mode == 0 else <double *>cnp.PyArray_DATA(res), lse, N, C, mode,
                                 n_team, True)
            for i in range(N if mode == 0 else 0):
                (<double *>cnp.PyArray_DATA(res))[i] = lse[i]
        xf_fp_ieee_leave(fp_saved)
    free(lse)
    return res


def plain_log_softmax(input, axis=-1, *, n_threads=None):
    """xentfast.log_softmax for the plain call (the lane above), else NotImplemented."""
    return _plain_family(input, axis, n_threads, 1)


def plain_softmax(input, axis=-1, *, n_threads=None):
    """xentfast.softmax for the plain call (the lane above), else NotImplemented."""
    return _plain_family(input, axis, n_threads, 2)


def plain_logsumexp(input, axis=-1, *, n_threads=None):
    """xentfast.logsumexp for the plain call (the lane above), else NotImplemented."""
    return _plain_family(input, axis, n_threads, 0)
