# Binary-family CPU kernels: BCE with logits, sigmoid focal loss, BCE from probabilities (elementwise),
# and cross-entropy from class probabilities (per row).
#
# Design
# (a) Python validates, this module computes (xentfast.api_binary checks shapes, dtypes, target and
#     probability ranges, weights): nothing here re-validates and nothing here raises.
# (b) The arithmetic is xentfast/binary.h (shared with the CUDA twin); the loops are binary_blocks.h.
#     This file only hands blocks of elements (rows for CE from probabilities) to threads.
# (c) Determinism: an element's loss and gradient depend on that element alone, so `prange` over blocks
#     with any thread count gives the same bits.  Losses that are reduced are kept in double and summed
#     by the fixed-shape double-double sum of xentfast/ddsum.h: either stored and summed by
#     xentfast._core._xent.dd_sum, or (`part`) summed block by block inside the kernel into the same
#     partials, then merged by the same tree.  `mean` is the mean of `none` for every thread count, and
#     float32 sums are not built from float32-rounded terms.  The loops are schedule="guided", for
#     the reason in _xent.pyx (c): which thread runs a block never changes its bits.
# (d) Outputs are written once per element: the loss in the storage type for reduction="none" (no
#     double temporary of the input's size), in double otherwise; the gradient in the storage type,
#     possibly over the input (inplace).
# (e) Left out on purpose: OpenMP reductions (their order follows the thread count) and any per-element
#     Python dispatch.

from cython.parallel cimport parallel, prange
from libc.stdint cimport int64_t
from cpython.pycapsule cimport PyCapsule_New

from xentfast._core import _xent

cdef extern from "fp_ieee.h" nogil:
    ctypedef unsigned long long xf_fp_state
    xf_fp_state xf_fp_ieee_enter()
    void xf_fp_ieee_leave(xf_fp_state saved)

cdef extern from "xentfast/ddsum.h" nogil:
    void xf_ddsum_tree(double *part, long long nb)

cdef extern from "binary_kernels.h" nogil:
    enum: XF_BIN_BLOCK
    int xf_bin_all_unit_f32(const float *t, long long n)
    int xf_bin_all_unit_f64(const double *t, long long n)
    ctypedef struct xf_bin_prob_mode:
        int clip
    ctypedef struct xf_bin_args:
        const double *w
        long long w_div
        long long w_mod
        int w_full
        const double *pw
        long long pw_div
        long long pw_mod
        int pw_full
        const double *g
        const float *g_f32
        double scale
        int has_ignore
        double ignore
        double alpha
        double gamma
        xf_bin_prob_mode mode
        double loss_k
        double *part
        unsigned char *unit_fail
    void xf_bin_prob_mode_init(xf_bin_prob_mode *m, int clip, double eps, int clamp, double c, double clamp_lo,
                               double clamp_hi)
    ctypedef struct xf_binary_table_f32:
        void (*bce_logits_block)(const float *, const float *, long long, long long, const xf_bin_args *,
                                 double *, float *, float *) noexcept nogil
        void (*focal_block)(const float *, const float *, long long, long long, const xf_bin_args *,
                            double *, float *, float *) noexcept nogil
        void (*bce_prob_block)(const float *, const float *, long long, long long, const xf_bin_args *,
                               double *, float *, float *) noexcept nogil
        double (*ce_probs_row)(const float *, long long, long long, double, const float *, const double *,
                               double, const xf_bin_prob_mode *, double, float *) noexcept nogil
    ctypedef struct xf_binary_table_f64:
        void (*bce_logits_block)(const double *, const double *, long long, long long, const xf_bin_args *,
                                 double *, double *, double *) noexcept nogil
        void (*focal_block)(const double *, const double *, long long, long long, const xf_bin_args *,
                            double *, double *, double *) noexcept nogil
        void (*bce_prob_block)(const double *, const double *, long long, long long, const xf_bin_args *,
                               double *, double *, double *) noexcept nogil
        double (*ce_probs_row)(const double *, long long, long long, double, const double *,
                               const double *, double, const xf_bin_prob_mode *, double, double *) noexcept nogil
    const xf_binary_table_f32 *xf_binary_table_for_f32(int path)
    const xf_binary_table_f64 *xf_binary_table_for_f64(int path)
    ctypedef struct xf_binary_exports:
        const xf_binary_table_f32 *(*f32)(int path) noexcept nogil
        const xf_binary_table_f64 *(*f64)(int path) noexcept nogil

ctypedef fused floating:
    float
    double

OP_BCE_LOGITS = 0
OP_FOCAL = 1
OP_BCE_PROB = 2
BLOCK = XF_BIN_BLOCK


# The CPU code path is the softmax family's (one selection for the package: XENTFAST_CPU at import,
# _xent.set_cpu_path in tests); every call looks it up, so a change there applies here too.  All paths
# give the same bits (binary_kernels.h).  The path codes are _xent's too (xent_kernels.h's enum).
cdef const xf_binary_table_f32 *B32 = xf_binary_table_for_f32(0)
cdef const xf_binary_table_f64 *B64 = xf_binary_table_for_f64(0)
_current_path = "baseline"

# for the XLA FFI handlers, as _xent._kernel_exports (binary_kernels.h, xf_binary_exports)
cdef xf_binary_exports _exports
_exports.f32 = xf_binary_table_for_f32
_exports.f64 = xf_binary_table_for_f64
_kernel_exports = PyCapsule_New(<void *>&_exports, "xentfast._core._binary._kernel_exports", NULL)


cdef _follow_cpu_path():
    global B32, B64, _current_path
    name = _xent.cpu_path()
    if name != _current_path:
        B32 = xf_binary_table_for_f32(_xent._PATHS[name])
        B64 = xf_binary_table_for_f64(_xent._PATHS[name])
        _current_path = name


def cpu_path():
    """The code path the binary kernels run (always the softmax family's, xentfast._core._xent.cpu_path())."""
    _follow_cpu_path()
    return _current_path


cdef void _block(int op, const floating *x, const floating *t, Py_ssize_t off, Py_ssize_t n,
                 const xf_bin_args *a, double *loss_d, floating *loss_o, floating *grad) noexcept nogil:
    if floating is float:
        if op == 0:
            B32.bce_logits_block(x, t, off, n, a, loss_d, loss_o, grad)
        elif op == 1:
            B32.focal_block(x, t, off, n, a, loss_d, loss_o, grad)
        else:
            B32.bce_prob_block(x, t, off, n, a, loss_d, loss_o, grad)
    else:
        if op == 0:
            B64.bce_logits_block(x, t, off, n, a, loss_d, loss_o, grad)
        elif op == 1:
            B64.focal_block(x, t, off, n, a, loss_d, loss_o, grad)
        else:
            B64.bce_prob_block(x, t, off, n, a, loss_d, loss_o, grad)


def elementwise(int op, const floating[::1] x, const floating[::1] t,
                const double[::1] w, long long w_div, long long w_mod,
                const double[::1] pw, long long pw_div, long long pw_mod,
                const double[::1] g, double scale, bint has_ignore, double ignore,
                double alpha, double gamma, bint clip, double eps, bint clamp, double log_clamp,
                double[::1] loss_d, floating[::1] loss_o, floating[::1] grad, int n_threads,
                bint has_w, bint has_pw, bint has_g, bint has_loss_d, bint has_loss_o, bint has_grad,
                double loss_k=0.0, double[::1] part=None, const float[::1] g32=None, double clamp_lo=0.0,
                double clamp_hi=1.0):
    """One pass of an elementwise binary loss (op: OP_BCE_LOGITS, OP_FOCAL, OP_BCE_PROB).

    Arrays flagged absent may be empty placeholders; weights are addressed as w[(i // div) % mod].
    `grad` may be `x` itself; losses are written times 2**loss_k.  All checks happened in
    xentfast.api_binary.

    `g32`: the per-element upstream factors held as float32 (has_g False): each block widens its own,
    exactly, so the caller need not make a float64 copy of the whole array first.

    `part` (2 * ceil(n / BLOCK) doubles; with has_loss_d, instead of loss_d): the losses are not stored,
    each block sums its own into its dd_sum partial, and the call returns the double-double sum (hi, lo),
    the bits _xent.dd_sum gives over the stored losses (binary_blocks.h xf_bin_block_partial).
    """
    cdef Py_ssize_t n = x.shape[0]
    cdef Py_ssize_t nb = (n + XF_BIN_BLOCK - 1) // XF_BIN_BLOCK
    cdef Py_ssize_t b, off, blen
    cdef xf_fp_state fp_thread = 0
    cdef xf_bin_args a
    cdef double *ld = NULL
    cdef floating *lo = NULL
    cdef floating *gp = NULL
    if n == 0:
        return (0.0, 0.0) if part is not None else None
    if part is not None and part.shape[0] != 2 * nb:
        raise ValueError(f"part: expected {2 * nb} entries for {n} elements, got {part.shape[0]}")
    _follow_cpu_path()
    a.w = &w[0] if has_w else NULL
    a.w_div = w_div
    a.w_mod = w_mod
    a.w_full = has_w and w_div == 1 and w_mod == n
    a.pw = &pw[0] if has_pw else NULL
    a.pw_div = pw_div
    a.pw_mod = pw_mod
    a.pw_full = has_pw and pw_div == 1 and pw_mod == n
    a.g = &g[0] if has_g else NULL
    if g32 is not None and g32.shape[0] != n:
        raise ValueError(f"g32: expected {n} entries, got {g32.shape[0]}")
    a.g_f32 = &g32[0] if g32 is not None else NULL
    a.scale = scale
    a.has_ignore = has_ignore
    a.ignore = ignore
    a.alpha = alpha
    a.gamma = gamma
    a.loss_k = loss_k
    if part is not None:
        a.part = &part[0]
    else:
        a.part = NULL
    a.unit_fail = NULL
    if clamp and not (0.0 < clamp_lo <= 1.0 and 0.0 <= clamp_hi < 1.0):
        raise ValueError(f"clamp_lo, clamp_hi: the thresholds of log_clamp={log_clamp!r} are needed "
                         f"(xentfast.api_binary._clamp_thresholds); got {clamp_lo!r}, {clamp_hi!r}")
    xf_bin_prob_mode_init(&a.mode, clip, eps, clamp, log_clamp, clamp_lo, clamp_hi)
    if has_loss_d and part is None:
        ld = &loss_d[0]
    if has_loss_o:
        lo = &loss_o[0]
    if has_grad:
        gp = &grad[0]
    with nogil:
        with parallel(num_threads=n_threads):
            fp_thread = xf_fp_ieee_enter()
            for b in prange(nb, schedule="guided"):
                off = b * XF_BIN_BLOCK
                blen = min(n - off, <Py_ssize_t>XF_BIN_BLOCK)
                _block(op, &x[0], &t[0], off, blen, &a, ld, lo, gp)
            xf_fp_ieee_leave(fp_thread)
        if a.part != NULL:
            xf_ddsum_tree(a.part, nb)
    if part is not None:
        return part[0], part[1]


cdef double _ce_probs_one_row(const floating *p, Py_ssize_t C, Py_ssize_t i, const int64_t *y,
                              long long ignore_index, const floating *t, const double *w,
                              const double *row_scale, double scale, const xf_bin_prob_mode *m,
                              double loss_k, floating *grad) noexcept nogil:
    cdef long long yi = -1
    cdef double w_y = 1.0
    cdef double s = scale
    cdef Py_ssize_t j
    cdef floating *gr = grad + i * C if grad != NULL else NULL
    if y != NULL:
        yi = y[i]
        if yi == ignore_index:
            if gr != NULL:
                for j in range(C):
                    gr[j] = 0.0
            return 0.0
        if w != NULL:
            w_y = w[yi]
    if row_scale != NULL:
        s = s * row_scale[i]
    if floating is float:
        return B32.ce_probs_row(p + i * C, C, yi, w_y, t + i * C if t != NULL else NULL, w, s, m, loss_k, gr)
    else:
        return B64.ce_probs_row(p + i * C, C, yi, w_y, t + i * C if t != NULL else NULL, w, s, m, loss_k, gr)


def ce_probs(const floating[:, ::1] p, const int64_t[::1] y, const floating[:, ::1] t, const double[::1] w,
             long long ignore_index, const double[::1] row_scale, double scale, bint clip, double eps,
             double[::1] loss, floating[:, ::1] grad, int n_threads, bint has_y, bint has_t, bint has_w,
             bint has_row_scale, bint has_grad, double loss_k=0.0):
    """Row losses (double, times 2**loss_k) of cross-entropy from class probabilities and, when has_grad,
    the gradient."""
    cdef Py_ssize_t N = p.shape[0]
    cdef Py_ssize_t C = p.shape[1]
    cdef Py_ssize_t i
    cdef xf_fp_state fp_thread = 0
    cdef xf_bin_prob_mode m
    cdef const int64_t *yp = &y[0] if has_y else NULL
    cdef const floating *tp = NULL
    cdef const double *wp = &w[0] if has_w else NULL
    cdef const double *rs = &row_scale[0] if has_row_scale else NULL
    cdef floating *gp = NULL
    if N == 0 or C == 0:
        return
    if has_t:
        tp = &t[0, 0]
    if has_grad:
        gp = &grad[0, 0]
    xf_bin_prob_mode_init(&m, clip, eps, 0, 0.0, 0.0, 1.0)
    _follow_cpu_path()
    with nogil:
        with parallel(num_threads=n_threads):
            fp_thread = xf_fp_ieee_enter()
            for i in prange(N, schedule="guided"):
                loss[i] = _ce_probs_one_row(&p[0, 0], C, i, yp, ignore_index, tp, wp, rs, scale, &m, loss_k, gp)
            xf_fp_ieee_leave(fp_thread)


# ---- the plain-call lane of BCE with logits -------------------------------------------------------------
# As _xent.pyx's lane: the most common small call (NumPy float32/float64 logits and targets of one dtype
# and shape, no weights, no ignore value, the default NaN policy), recognised by C-level tests and run
# with the block function and the in-kernel sum the general path would use for it, on the calling thread,
# or for a larger call on the threads xentfast._threads would start (saves the ~30 us of Python around
# the kernel: ~15 % of a 256x256 float32 call on two threads).  Anything else, and a target outside
# [0, 1], nothing to average, a sum small enough for the tiny-terms rerun or a mean beyond DBL_MAX,
# returns NotImplemented: the general path then decides (and raises).

cimport numpy as cnp
from libc.math cimport fabs
from libc.stdlib cimport calloc, malloc, free
from libc.string cimport memchr

from ._plain cimport (PLAIN_MAX_ELEMENTS, plain_float_array, plain_options, plain_out, plain_reduction,
                      plain_same_layout, plain_scalar, plain_threads)

cnp.import_array()

cdef double _TINY_SUM = _xent.TINY_SUM_PER_TERM
cdef double INF = float("inf")


cdef bint _plain_unit_targets(const floating *t, Py_ssize_t n) noexcept nogil:
    """Every target in [0, 1] (a NaN fails), as xentfast.api_binary._unit_targets."""
    if floating is float:
        return xf_bin_all_unit_f32(t, n)
    else:
        return xf_bin_all_unit_f64(t, n)


cdef bint _unit_targets_on(const floating *t, Py_ssize_t n, int n_threads) noexcept nogil:
    """_plain_unit_targets in blocks on n_threads threads."""
    cdef Py_ssize_t block = 65536
    cdef Py_ssize_t nb = (n + block - 1) // block
    cdef Py_ssize_t b
    cdef int bad = 0
    for b in prange(nb, schedule="guided", num_threads=n_threads):
        bad += not _plain_unit_targets(t + b * block, min(block, n - b * block))
    return bad == 0


def unit_targets(const floating[::1] t, int n_threads):
    """Whether every value lies in [0, 1] (a NaN does not): the common case of the target check of
    xentfast.api_binary._unit_targets and of its probability check in one parallel pass, where NumPy's
    operations made several serial ones (~9 % of a two-thread BCE call at 4096x1000; a fifth of a float32
    BCE from probabilities)."""
    cdef bint ok
    with nogil:
        ok = _unit_targets_on(&t[0], t.shape[0], n_threads) if t.shape[0] > 0 else True
    return ok


cdef inline void _bce_block(const void *xp, const void *tp, const xf_bin_args *a, Py_ssize_t n, Py_ssize_t b,
                            void *lp, void *gp, bint f32) noexcept nogil:
    # block b of the lane's call: the general path's block, whichever thread runs it
    cdef Py_ssize_t off = b * XF_BIN_BLOCK
    cdef Py_ssize_t blen = min(n - off, <Py_ssize_t>XF_BIN_BLOCK)
    if f32:
        B32.bce_logits_block(<const float *>xp, <const float *>tp, off, blen, a, NULL, <float *>lp, <float *>gp)
    else:
        B64.bce_logits_block(<const double *>xp, <const double *>tp, off, blen, a, NULL, <double *>lp,
                             <double *>gp)


cdef void _bce_blocks(const void *xp, const void *tp, const xf_bin_args *a, Py_ssize_t n, void *lp,
                      void *gp, bint f32, int n_threads) noexcept nogil:
    # the lane's blocks: on the calling thread, or on a team of n_threads
    cdef Py_ssize_t nb = (n + XF_BIN_BLOCK - 1) // XF_BIN_BLOCK
    cdef Py_ssize_t b
    cdef xf_fp_state fp_thread = 0
    if n_threads == 1:
        for b in range(nb):
            _bce_block(xp, tp, a, n, b, lp, gp, f32)
        return
    with parallel(num_threads=n_threads):
        fp_thread = xf_fp_ieee_enter()
        for b in prange(nb, schedule="guided"):
            _bce_block(xp, tp, a, n, b, lp, gp, f32)
        xf_fp_ieee_leave(fp_thread)


cdef object _plain_bce_logits(object input, object target, int red, object out, bint with_grad,
                              object n_threads):
    cdef cnp.ndarray x, t, g, loss_o
    cdef Py_ssize_t n, nb
    cdef xf_bin_args a
    cdef double *part = NULL
    cdef double hi = 0.0, lo = 0.0, total = 0.0
    cdef float total32 = 0.0
    cdef bint f32, ok
    cdef xf_fp_state fp_saved
    cdef void *xp
    cdef void *tp
    cdef void *gp = NULL
    cdef void *lp = NULL
    cdef int n_team = 1
    cdef unsigned char *unit_fail = NULL
    cdef bint targets_ok
    if not plain_float_array(input) or not plain_float_array(target):
        return NotImplemented
    x = <cnp.ndarray>input
    t = <cnp.ndarray>target
    n = cnp.PyArray_SIZE(x)
    if cnp.PyArray_NDIM(x) == 0 or n == 0 or not plain_same_layout(x, t):
        return NotImplemented
    if n >= PLAIN_MAX_ELEMENTS:
        # a larger call: on the threads xentfast._threads would start, as the general path runs it
        n_team = plain_threads(n_threads, n)
        if n_team < 1:
            return NotImplemented
    if with_grad and out is not None and not plain_out(out, x, t):
        return NotImplemented
    f32 = cnp.PyArray_TYPE(x) == cnp.NPY_FLOAT32
    xp = cnp.PyArray_DATA(x)
    tp = cnp.PyArray_DATA(t)
    nb = (n + XF_BIN_BLOCK - 1) // XF_BIN_BLOCK
    if not f32:
        # the float32 kernel checks the targets itself (binary_blocks.h, xf_bce_logits_block, unit_fail
        # below): a target outside [0, 1] is found after the outputs were written, out= included (README,
        # "Binary, focal and from-probability losses")
        with nogil:
            ok = (_unit_targets_on(<const double *>tp, n, n_team) if n_team > 1
                  else _plain_unit_targets(<const double *>tp, n))
        if not ok:
            return NotImplemented
    _follow_cpu_path()
    # the arguments _Elementwise.run passes for this call (xentfast.api_binary)
    a.w = NULL
    a.w_div = 1
    a.w_mod = 1
    a.w_full = False
    a.pw = NULL
    a.pw_div = 1
    a.pw_mod = 1
    a.pw_full = False
    a.g = NULL
    a.g_f32 = NULL
    a.scale = (1.0 / n) if red == 1 else 1.0
    a.has_ignore = False
    a.ignore = 0.0
    a.alpha = 0.25
    a.gamma = 2.0
    a.loss_k = 0.0
    a.part = NULL
    a.unit_fail = NULL
    xf_bin_prob_mode_init(&a.mode, False, 0.0, False, 0.0, 0.0, 1.0)
    if with_grad:
        g = out if out is not None else cnp.PyArray_EMPTY(cnp.PyArray_NDIM(x), cnp.PyArray_DIMS(x),
                                                          cnp.PyArray_TYPE(x), 0)
        gp = cnp.PyArray_DATA(g)
    if red == 0:
        loss_o = cnp.PyArray_EMPTY(cnp.PyArray_NDIM(x), cnp.PyArray_DIMS(x), cnp.PyArray_TYPE(x), 0)
        lp = cnp.PyArray_DATA(loss_o)
    else:
        part = <double *>malloc(2 * nb * sizeof(double))
        if part == NULL:
            return NotImplemented
        a.part = part
    if f32:
        # allocated last: nothing between here and its free can raise
        unit_fail = <unsigned char *>calloc(nb, 1)
        if unit_fail == NULL:
            free(part)
            return NotImplemented
        a.unit_fail = unit_fail
    with nogil:
        fp_saved = xf_fp_ieee_enter()
        _bce_blocks(xp, tp, &a, n, lp, gp, f32, n_team)
        targets_ok = unit_fail == NULL or memchr(unit_fail, 1, nb) == NULL
        if red != 0 and targets_ok:
            xf_ddsum_tree(part, nb)
            hi = part[0]
            lo = part[1]
            # _Elementwise.reduce's cases for the general path: the tiny-terms rerun, the mean beyond
            # DBL_MAX.  But a sum of exactly 0 is the lane's: without weights every loss is a sum of two
            # non-negative terms (binary.h), so each loss is 0, and the general path sums those zeros as
            # they are after taking them again one by one (two kernel runs; elements with |x| > ~745 on
            # their target's side, benchmarks/README.md, fifteenth round)
            ok = (hi == 0.0 or not (fabs(hi) <= n * _TINY_SUM)) and not (red == 1 and hi == INF)
            total = (hi + lo) if red == 2 else (hi / n + lo / n)
            if f32:
                total32 = <float>total     # rounded inside the subnormal guard
        xf_fp_ieee_leave(fp_saved)
    free(unit_fail)
    if red != 0:
        free(part)
    if not targets_ok:
        return NotImplemented
    if red == 0:
        result = loss_o
    else:
        if not ok:
            return NotImplemented
        result = plain_scalar(total, total32, f32)
    return (result, g) if with_grad else result


def plain_binary_cross_entropy_with_logits(input, target, weight=None, pos_weight=None, reduction="mean", *,
                                           ignore_index=None, empty_mean="nan", nan_policy="propagate",
                                           n_threads=None):
    """xentfast.binary_cross_entropy_with_logits for the plain call (the lane above), else NotImplemented."""
    cdef int red = plain_reduction(reduction)
    if (red < 0 or weight is not None or pos_weight is not None or ignore_index is not None
            or not plain_options(empty_mean, nan_policy, n_threads)):
        return NotImplemented
    return _plain_bce_logits(input, target, red, None, False, n_threads)


def plain_binary_cross_entropy_with_logits_with_grad(input, target, weight=None, pos_weight=None,
                                                     reduction="mean", *, ignore_index=None, empty_mean="nan",
                                                     nan_policy="propagate", grad_output=None, out=None,
                                                     inplace=False, n_threads=None):
    """xentfast.binary_cross_entropy_with_logits_with_grad for the plain call (the lane above), else
    NotImplemented."""
    cdef int red = plain_reduction(reduction)
    if (red < 0 or weight is not None or pos_weight is not None or ignore_index is not None
            or grad_output is not None or inplace is not False or not plain_options(empty_mean, nan_policy, n_threads)):
        return NotImplemented
    return _plain_bce_logits(input, target, red, out, True, n_threads)
