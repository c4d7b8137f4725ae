/* Element loops of the binary family for one storage type and one CPU code path; included by
 * binary_kernels.h with XF_T (storage type), XF_SFX (name suffix) and XF_KERNEL (linkage; a path is a
 * translation unit, binary_kernels.h) defined.  All arithmetic is double and comes from xentfast/binary.h.
 *
 * Every block function takes the outputs it should produce as pointers, NULL for the ones not wanted:
 * loss_d (double, for reductions), loss_o (storage type, reduction="none") and grad (storage type, may
 * alias x).  With a->part set, the double losses are not stored: the block sums them into its partial of
 * the reduction (xf_bin_block_partial) and loss_d is ignored.  The forward, the backward and the fused
 * call run the same per-element expressions, so they give the same bits.
 *
 * Vectorization: the per-element loop is a `#pragma omp simd` loop in an always-inlined body that takes
 * the wanted outputs as compile-time flags; the block function calls it once per combination, so each
 * instance is a straight loop without output tests (unswitched by hand: gcc would not vectorize the
 * loop with the pointer tests inside).  A missing per-element upstream factor is a block of ones
 * (scale * 1 = scale exactly), so no instance tests a pointer per element; without weight and
 * pos_weight an "unweighted" instance passes the constant 1.0 (the value the block of ones held), which
 * lets the compiler drop their exponent splits and zero tests; BCE's float32 "plain" instances
 * (XF_BIN_PLAIN: no upstream array and no ignore value either) use the scale itself and no ignore test
 * (BCE float32 fused mean (32, 300): 52.7 -> 49.0 us).  Loss_d and loss_o together (no caller
 * asks for both) run the loss_d instance and convert: (XF_T)v of the same v.
 * What does not vectorize: the probability-target loop of CE from class probabilities (its compensated
 * sum runs in class order; lanes would change the bits).
 */

#define XF_BIN_CAT_(a, b) a##_##b
#define XF_BIN_CAT(a, b) XF_BIN_CAT_(a, b)
#define XF_BIN_FN(name) XF_BIN_CAT(name, XF_SFX)

/* `unweighted` value of the BCE instances that also have no per-element upstream factor (the factor is
 * the scale alone) and no ignore value: they read nothing but x and t, and gather no block of ones */
#define XF_BIN_PLAIN 2

/* the five output combinations, as (want loss_d, want loss_o, want grad) */
#define XF_BIN_OUTPUTS(body, ...)                                                                         \
    do {                                                                                                  \
        if (grad) {                                                                                       \
            if (loss_d) {                                                                                 \
                body(__VA_ARGS__, 1, 0, 1);                                                               \
            } else if (loss_o) {                                                                          \
                body(__VA_ARGS__, 0, 1, 1);                                                               \
            } else {                                                                                      \
                body(__VA_ARGS__, 0, 0, 1);                                                               \
            }                                                                                             \
        } else if (loss_d) {                                                                              \
            body(__VA_ARGS__, 1, 0, 0);                                                                   \
        } else if (loss_o) {                                                                              \
            body(__VA_ARGS__, 0, 1, 0);                                                                   \
        }                                                                                                 \
    } while (0)

/* loss_d and loss_o together: the loss_d instance ran, loss_o is its conversion over the block */
#define XF_BIN_CONVERT_LOSS()                                                                             \
    do {                                                                                                  \
        if (b.ld && b.lo) {                                                                               \
            long long j_;                                                                                 \
            for (j_ = 0; j_ < n; j_++) {                                                                  \
                b.lo[j_] = (XF_T)b.ld[j_];                                                                \
            }                                                                                             \
        }                                                                                                 \
    } while (0)

/* The fast-form decision per chunk of a block (b, n, a, loss_d, loss_o, grad in scope), then one call of
 * `run` per run of chunks that decided alike (as xf_bce_logits_chunks does for BCE with logits):
 * decide(b, c0, len, a, <extra> grad != 0) and run(blk, len, a, <extra> fast, loss_d, loss_o, grad), the
 * extra arguments (with their trailing comma) in the variadic part, possibly empty. */
#define XF_BIN_CHUNK_RUNS(decide, run, ...)                                                               \
    do {                                                                                                  \
        long long start_ = 0, c0_;                                                                        \
        int run_fast_ = 0;                                                                                \
        for (c0_ = 0; c0_ < n; c0_ += XF_BIN_FAST_CHUNK) {                                                \
            const long long len_ = (n - c0_ < XF_BIN_FAST_CHUNK) ? n - c0_ : XF_BIN_FAST_CHUNK;           \
            const int fast_ = decide(b, c0_, len_, a, __VA_ARGS__ grad != 0);                             \
            if (c0_ > 0 && fast_ != run_fast_) {                                                          \
                run(XF_BIN_FN(xf_bin_blk_from)(b, start_), c0_ - start_, a, __VA_ARGS__ run_fast_, loss_d, \
                    loss_o, grad);                                                                        \
                start_ = c0_;                                                                             \
            }                                                                                             \
            run_fast_ = fast_;                                                                            \
        }                                                                                                 \
        if (n > 0) {                                                                                      \
            run(XF_BIN_FN(xf_bin_blk_from)(b, start_), n - start_, a, __VA_ARGS__ run_fast_, loss_d, loss_o, \
                grad);                                                                                    \
        }                                                                                                 \
    } while (0)

#define XF_BIN_UNSWITCH(body, ...)                                                                        \
    do {                                                                                                  \
        XF_BIN_OUTPUTS(body, __VA_ARGS__);                                                                \
        XF_BIN_CONVERT_LOSS();                                                                            \
    } while (0)

/* The per-block inputs of one body call: data and outputs offset to the block, weights and upstream
 * factors gathered (stride 1). */
typedef struct {
    const XF_T *x, *t;
    const double *w, *q, *g;
    const float *g32; /* the upstream factors as the caller holds them when float32 (a->g_f32), else 0 */
    double *ld;
    XF_T *lo, *gr;
} XF_BIN_FN(xf_bin_blk);

XF_HD XF_BIN_FN(xf_bin_blk) XF_BIN_FN(xf_bin_blk_make)(const XF_T *x, const XF_T *t, long long off,
                                                        const xf_bin_args *a, double *loss_d, XF_T *loss_o,
                                                        XF_T *grad, double *sum_scratch)
{
    XF_BIN_FN(xf_bin_blk) b;
    b.x = x + off;
    b.t = t + off;
    b.w = b.q = b.g = 0;
    b.g32 = a->g_f32 ? a->g_f32 + off : 0;
    /* in-kernel reduction (a->part): the block's double losses go to the caller's scratch */
    b.ld = a->part ? sum_scratch : (loss_d ? loss_d + off : 0);
    b.lo = loss_o ? loss_o + off : 0;
    b.gr = grad ? grad + off : 0;
    return b;
}

/* The block's partial of xentfast/ddsum.h from the losses in its scratch: the partial dd_sum would take
 * over the whole loss vector (the blocks coincide, binary_kernels.h), so the sum has the same bits
 * without the float64 array of the input's size being written and read back. */
XF_HD void XF_BIN_FN(xf_bin_block_partial)(const xf_bin_args *a, long long off, long long n,
                                            const double *sum_scratch)
{
    if (a->part) {
        xf_ddsum_block(sum_scratch, n, 0, a->part + 2 * (off / XF_BIN_BLOCK));
    }
}

/* The block's per-element upstream factors in double: a->g itself, a float32 array widened into buf (the
 * same values a float64 copy would hold), or 0 where there are none. */
XF_HD const double *XF_BIN_FN(xf_bin_upstream_block)(const xf_bin_args *a, long long off, long long n,
                                                      double *buf)
{
    long long j;
    if (a->g_f32) {
        const float *g = a->g_f32 + off;
#pragma omp simd
        for (j = 0; j < n; j++) {
            buf[j] = (double)g[j];
        }
        return buf;
    }
    return xf_bin_gather(a->g, 1, 0, 1, off, n, buf);
}

/* The block's inputs and outputs from element c0 on. */
XF_HD XF_BIN_FN(xf_bin_blk) XF_BIN_FN(xf_bin_blk_from)(XF_BIN_FN(xf_bin_blk) b, long long c0)
{
    b.x += c0;
    b.t += c0;
    b.w += c0;
    b.q += c0;
    b.g = b.g ? b.g + c0 : 0;
    b.g32 = b.g32 ? b.g32 + c0 : 0;
    b.ld = b.ld ? b.ld + c0 : 0;
    b.lo = b.lo ? b.lo + c0 : 0;
    b.gr = b.gr ? b.gr + c0 : 0;
    return b;
}

/* the losses, as _binary.pyx's OP_* (the per-element functions below that serve several take one) */
#define XF_BIN_OP_BCE_LOGITS 0
#define XF_BIN_OP_FOCAL 1
#define XF_BIN_OP_BCE_PROB 2

/* ---- elements under an infinite upstream factor (binary.h: xf_bin_bce_logits_grad_inf) ------------------
 * Rare, so kept out of the vector loops: a run of elements asks whether any upstream factor in it is
 * infinite, and the gradients of those elements are evaluated again and stored over the loops' values.
 * Where the loops overwrite x (in place) that happens before them (into a buffer, stored after); else
 * after them, when the factors are in cache: asking first, the block's first read of its factors, cost
 * float32 BCE with an upstream array 17 % (a stall the loops otherwise overlap with arithmetic).  The GPU
 * picks the same elements with the same test (binary.cu), so both give the same bits. */
XF_HD double XF_BIN_FN(xf_bin_upstream_at)(XF_BIN_FN(xf_bin_blk) b, const xf_bin_args *a, long long j)
{
    return b.g ? a->scale * b.g[j] : a->scale;
}

/* Whether the run may hold one: s * 0 is NaN exactly where s is infinite or NaN, and a sum with a NaN
 * term is NaN in any order.  A NaN factor sends its run to the per-element test too, which then finds
 * nothing to do. */
XF_HD int XF_BIN_FN(xf_bin_any_inf_upstream)(XF_BIN_FN(xf_bin_blk) b, long long n, const xf_bin_args *a)
{
    const double scale = a->scale;
    double nan_if_any = scale * 0.0;
    long long j;
    if (b.g) {
#pragma omp simd reduction(+ : nan_if_any)
        for (j = 0; j < n; j++) {
            nan_if_any += scale * b.g[j] * 0.0;
        }
    }
    return nan_if_any != nan_if_any;
}

/* op: XF_BIN_OP_BCE_LOGITS or XF_BIN_OP_BCE_PROB.  Into `rescued` (before the loops), or straight into the
 * gradient when rescued is 0 (after them, x intact). */
XF_HD_COLD void XF_BIN_FN(xf_bin_inf_upstream_grads)(XF_BIN_FN(xf_bin_blk) b, long long n,
                                                     const xf_bin_args *a, int unweighted, int op,
                                                     double *rescued)
{
    long long j;
    for (j = 0; j < n; j++) {
        const double s = XF_BIN_FN(xf_bin_upstream_at)(b, a, j);
        if (xf_bin_upstream_is_inf(s)) {
            const double xv = (double)b.x[j], y = (double)b.t[j];
            const double w = unweighted ? 1.0 : b.w[j];
            const int ign = a->has_ignore & (y == a->ignore);
            double gv;
            if (op == XF_BIN_OP_BCE_LOGITS) {
                gv = xf_bin_bce_logits_grad_inf(xf_bin_logit_pieces(xv), y, w, unweighted ? 1.0 : b.q[j], s);
            } else {
                gv = xf_bin_bce_prob_grad_inf(xv, y, w, s, &a->mode);
            }
            gv = ign ? 0.0 : gv;
            if (rescued) {
                rescued[j] = gv;
            } else {
                b.gr[j] = (XF_T)gv;
            }
        }
    }
}

/* Those gradients where xf_bin_any_inf_upstream finds a candidate; returns whether it did. */
XF_HD int XF_BIN_FN(xf_bin_inf_upstream_scan)(XF_BIN_FN(xf_bin_blk) b, long long n, const xf_bin_args *a,
                                               int unweighted, int op, double *rescued)
{
    if (!XF_BIN_FN(xf_bin_any_inf_upstream)(b, n, a)) {
        return 0;
    }
    XF_BIN_FN(xf_bin_inf_upstream_grads)(b, n, a, unweighted, op, rescued);
    return 1;
}

XF_HD_COLD void XF_BIN_FN(xf_bin_inf_upstream_store)(XF_BIN_FN(xf_bin_blk) b, long long n,
                                                     const xf_bin_args *a, const double *rescued)
{
    long long j;
    for (j = 0; j < n; j++) {
        if (xf_bin_upstream_is_inf(XF_BIN_FN(xf_bin_upstream_at)(b, a, j))) {
            b.gr[j] = (XF_T)rescued[j];
        }
    }
}

/* Before a block's loops when they write over x; returns whether the block must store `rescued` after
 * them (else xf_bin_inf_upstream_after does the work). */
XF_HD int XF_BIN_FN(xf_bin_inf_upstream_before)(XF_BIN_FN(xf_bin_blk) b, long long n, const xf_bin_args *a,
                                                 int unweighted, int op, double *rescued)
{
    const int in_place = b.gr && (const void *)b.gr == (const void *)b.x;
    return in_place && XF_BIN_FN(xf_bin_inf_upstream_scan)(b, n, a, unweighted, op, rescued);
}

XF_HD void XF_BIN_FN(xf_bin_inf_upstream_after)(XF_BIN_FN(xf_bin_blk) b, long long n, const xf_bin_args *a,
                                                 int unweighted, int op, int stored_before,
                                                 const double *rescued)
{
    if (stored_before) {
        XF_BIN_FN(xf_bin_inf_upstream_store)(b, n, a, rescued);
    } else if (b.gr && (const void *)b.gr != (const void *)b.x) {
        XF_BIN_FN(xf_bin_inf_upstream_scan)(b, n, a, unweighted, op, 0);
    }
}

/* elements per exponential loop of the fast form (xf_bce_logits_chunk) */
#ifndef XF_BIN_STAGE
#define XF_BIN_STAGE 64
#endif

/* Whether the fast form's stages make their divisions in a loop of their own (xf_bce_logits_chunk): the
 * avx2 unit only.  Measured on Zen 4 (one thread, float32 BCE with logits fused mean, ms, benchmarks/
 * README.md, 2026-12-05, tenth round): avx2 path 4096x1000 10.42-10.50 -> 9.56-9.63, 65536x256
 * 50.6-50.9 -> 44.5-46.1; the avx512 path, whose vectors hold eight doubles, lost 10 % that way
 * (4096x1000 7.14-7.17 -> 7.87-8.09) and keeps its divisions in the element's loop (its code is
 * unchanged: the element loop's rdbuf and lbuf are literal zeros there). */
#if defined(__AVX2__) && !defined(__AVX512F__)
#define XF_BIN_DIVISIONS_APART 1
#else
#define XF_BIN_DIVISIONS_APART 0
#endif

/* ---- BCE with logits ---------------------------------------------------------------------------------- */

/* The fast form of the storage type (binary.h): XF_BIN_FAST 1 float32's plain-double form, 2 float64's
 * double-double form; each its own predicate, pieces and formulas, the same chunk decision and loops.
 * Every storage type has one (binary_kernels.h), so BCE's block has no general-only variant. */
#undef XF_BIN_FAST_OK
#undef XF_BIN_FAST_LOGIT
#undef XF_BIN_FAST_PIECES
#undef XF_BIN_FAST_LOSS
#undef XF_BIN_FAST_GRAD
#undef XF_BIN_FAST_X_OK
#undef XF_BIN_FAST_RULE
#undef XF_BIN_FAST_Y_OK
#if XF_BIN_FAST == 2
#define XF_BIN_FAST_OK xf_bin_bce_fast64_ok
#define XF_BIN_FAST_LOGIT xf_bin_fast64_logit
#define XF_BIN_FAST_PIECES xf_bin_fast64_pieces
#define XF_BIN_FAST_LOSS xf_bin_bce_fast64_loss
#define XF_BIN_FAST_GRAD xf_bin_bce_fast64_grad
/* |x| <= 500, with far (a literal) also a far logit (binary.h); the rule with that logit test */
#define XF_BIN_FAST_X_OK(xv, far) xf_bin_fast64_x_ok(xv, far)
#define XF_BIN_FAST_RULE xf_bin_bce_fast64_rule
/* a target in [0, 1], also 0 or at least 2^-60 (exact in double) */
#define XF_BIN_FAST_Y_OK(yv) (((yv) == (XF_T)0.0) | ((yv) >= (XF_T)XF_BIN_FAST_LO))
#else
#define XF_BIN_FAST_OK xf_bin_bce_fast_ok
#define XF_BIN_FAST_LOGIT xf_bin_fast_logit
#define XF_BIN_FAST_PIECES xf_bin_fast_pieces
#define XF_BIN_FAST_LOSS xf_bin_bce_fast_loss
#define XF_BIN_FAST_GRAD xf_bin_bce_fast_grad
/* |x| <= XF_BIN_FAST_NEAR_ABS_X, with far (a literal) every finite logit (FLT_MAX and 160 are floats): a
 * chunk with logits beyond 160 runs the loop instance that keeps log1p's powers of tiny t normal
 * (xf_bin_log1p_unit_tails), the far one; the rule with that logit test */
#define XF_BIN_FAST_X_BOUND(far) ((XF_T)((far) ? XF_BIN_FAST_MAX_ABS_X : XF_BIN_FAST_NEAR_ABS_X))
#define XF_BIN_FAST_X_OK(xv, far) (((xv) <= XF_BIN_FAST_X_BOUND(far)) & ((xv) >= -XF_BIN_FAST_X_BOUND(far)))
#define XF_BIN_FAST_RULE(x, y, w, q, loss_k, far) \
    (xf_bin_bce_fast_ok(x, y, w, q, loss_k) & (((far) != 0) | (xf_fabs(x) <= XF_BIN_FAST_NEAR_ABS_X)))
#define XF_BIN_FAST_Y_OK(yv) 1
#endif

/* ---- a chunk's few odd elements, redone one by one ------------------------------------------------------ */

/* Up to this many odd elements a chunk is redone element by element; with more, both forms run on the
 * whole chunk and each element selects.  A redone BCE element costs 150-260 ns (the general form in scalar
 * code), the fast loop over a chunk 115 (float32) to 380 ns (float64), both forms on all 64 with eight
 * lanes a vector 1.1-1.5 us: even at about 6-7 (4096x1000, one thread, benchmarks/README.md, seventeenth
 * round; the focal loss's elements cost more each way, and a logit in 13 at 1000 took 128 ms redone
 * against 172 selected). */
#define XF_BIN_REDO_MAX 6

/* A chunk whose elements the fast form serves but for a few (an infinite or NaN logit, a target outside
 * [0, 1], an extreme weight or upstream factor; float64 BCE also 500 < |x| < 900 or |x| > 2^900, a target
 * below 2^-60) runs the fast loop over all of it, and those elements' outputs are redone in the general
 * form, each by the rule the CUDA twin applies per element.  They are evaluated first, into buffers,
 * because the fast loop may write the gradient over x; then stored over the fast loop's values.  So a
 * chunk of ordinary elements beside one odd element costs the fast loop and one general element, where a
 * per-element select runs both forms on all 64 (benchmarks/README.md, sixteenth and seventeenth rounds).
 * redo[j] says which outputs (1 the loss, 2 the gradient), as the chunk's vectorized count of its odd
 * elements found them.  Cold, hence scalar: vectorized, gcc if-converted the general form over all 64
 * elements and stored under masks (tests/test_build.py). */
XF_HD_COLD void XF_BIN_FN(xf_bin_redo_before)(XF_BIN_FN(xf_bin_blk) b, long long n, const xf_bin_args *a,
                                               const int op, const int unweighted, const int *redo,
                                               double *loss_general, double *grad_general)
{
    const double gamma = a->gamma, alpha = a->alpha, loss_k = a->loss_k;
    long long j;
    for (j = 0; j < n; j++) {
        if (redo[j]) {
            const double xv = (double)b.x[j], y = (double)b.t[j];
            /* BCE from probabilities has no pos_weight (b.q unset) */
            const double w = unweighted ? 1.0 : b.w[j];
            const double q = (unweighted || op == XF_BIN_OP_BCE_PROB) ? 1.0 : b.q[j];
            const double s = (redo[j] & 2) ? XF_BIN_FN(xf_bin_upstream_at)(b, a, j) : 1.0;
            const int ign = a->has_ignore & (y == a->ignore);
            const xf_bin_logit p = xf_bin_logit_pieces(xv);
            double loss, grad;
            if (op == XF_BIN_OP_FOCAL) {
                const xf_bin_focal_parts f = xf_bin_focal_prepare(p, y, alpha, gamma);
                loss = (redo[j] & 1) ? xf_bin_focal_loss(p, f, gamma, loss_k) : 0.0;
                grad = (redo[j] & 2) ? xf_bin_focal_grad(p, f, y, gamma, s) : 0.0;
            } else if (op == XF_BIN_OP_BCE_PROB) {
                /* xv is the probability; an infinite upstream factor's gradient is stored after the
                 * loops (xf_bin_inf_upstream_after), over this one */
                loss = (redo[j] & 1) ? xf_bin_bce_prob_loss(xv, y, w, &a->mode, loss_k) : 0.0;
                grad = (redo[j] & 2) ? xf_bin_bce_prob_grad(xv, y, w, s, &a->mode) : 0.0;
            } else {
                loss = (redo[j] & 1) ? xf_bin_bce_logits_loss(p, y, w, q, loss_k) : 0.0;
                grad = (redo[j] & 2) ? xf_bin_bce_logits_grad(p, y, w, q, s) : 0.0;
            }
            loss_general[j] = ign ? 0.0 : loss;
            grad_general[j] = ign ? 0.0 : grad;
        }
    }
}

XF_HD_COLD void XF_BIN_FN(xf_bin_redo_after)(XF_BIN_FN(xf_bin_blk) b, long long n, const int *redo,
                                              const double *loss_general, const double *grad_general)
{
    long long j;
    for (j = 0; j < n; j++) {
        if (redo[j] & 1) {
            if (b.ld) {
                b.ld[j] = loss_general[j];
            } else {
                b.lo[j] = (XF_T)loss_general[j];
            }
        }
        if (redo[j] & 2) {
            b.gr[j] = (XF_T)grad_general[j];
        }
    }
}

/* fast_mode: 0 the general form only, 2 the fast form of binary.h only (a chunk whose every element
 * qualifies), 3 the same with far logits (float64's beyond 900, xf_bin_fast64_x_ok; float32's beyond
 * XF_BIN_FAST_NEAR_ABS_X, XF_BIN_FAST_X_OK), 4 float64's with the middle ones (500 < |x| < 900) too, 1
 * both forms with a per-element select
 * (a mixed chunk): each element and each output gets the form binary.h's predicates pick for it (the
 * loss's never depends on the upstream factor), as on the GPU. */
XF_HD void XF_BIN_FN(xf_bce_logits_body)(XF_BIN_FN(xf_bin_blk) b, long long n, const xf_bin_args *a,
                                          const int unweighted, const int fast_mode, const double *ebuf,
                                          const double *elbuf, const double *rdbuf, const double *lbuf,
                                          const int want_d,
                                          const int want_o, const int want_g)
{
    const XF_T *x = b.x, *t = b.t;
    const double *w = b.w, *q = b.q, *g = b.g;
    double *ld = b.ld;
    XF_T *lo = b.lo, *gr = b.gr;
    const int has_ignore = a->has_ignore;
    const double ignore = a->ignore, scale = a->scale, loss_k = a->loss_k;
    long long j;
#pragma omp simd
    for (j = 0; j < n; j++) {
        double xv = (double)x[j];
        double y = (double)t[j];
        int ign = (unweighted == XF_BIN_PLAIN) ? 0 : has_ignore & (y == ignore);
        double wj = unweighted ? 1.0 : w[j], qj = unweighted ? 1.0 : q[j];
        double sj = want_g ? ((unweighted == XF_BIN_PLAIN) ? scale : scale * g[j]) : 1.0;
        /* each form's pieces are built only where that form is used (struct values assigned under a
         * condition would stop the vectorizer) */
        double v = 0.0, gv = 0.0;
        if (fast_mode >= 2) {
#if XF_BIN_FAST == 2
            XF_BIN_FAST_LOGIT f =
                ebuf ? xf_bin_fast64_from_exp(xv, ebuf[j], elbuf[j], (fast_mode >= 3) ? fast_mode - 2 : 0)
                     : XF_BIN_FAST_PIECES(xv);
            (void)rdbuf;
            (void)lbuf;
#elif XF_BIN_DIVISIONS_APART
            xf_bin_fast_logit f = rdbuf ? xf_bin_fast_from_parts(xv, ebuf[j], rdbuf[j], lbuf[j])
                                  : ebuf  ? xf_bin_fast_from_exp_tails(xv, ebuf[j], fast_mode >= 3)
                                          : xf_bin_fast_pieces(xv);
            (void)elbuf;
#else
            xf_bin_fast_logit f =
                ebuf ? xf_bin_fast_from_exp_tails(xv, ebuf[j], fast_mode >= 3) : xf_bin_fast_pieces(xv);
            (void)elbuf;
            (void)rdbuf;
            (void)lbuf;
#endif
            v = (want_d | want_o) ? XF_BIN_FAST_LOSS(f, y, wj, qj) : 0.0;
            gv = want_g ? XF_BIN_FAST_GRAD(f, y, wj, qj, sj) : 0.0;
        } else {
            xf_bin_logit p = xf_bin_logit_pieces(xv);
            v = (want_d | want_o) ? xf_bin_bce_logits_loss(p, y, wj, qj, loss_k) : 0.0;
            gv = want_g ? xf_bin_bce_logits_grad(p, y, wj, qj, sj) : 0.0;
            if (fast_mode == 1) {
                int fast = XF_BIN_FAST_OK(xv, y, wj, qj, loss_k);
                int fast_g = xf_bin_bce_fast_grad_ok(fast, sj);
                /* evaluated on every element of the chunk, also outside the form's domain (|x| beyond
                 * the limit, inf, NaN), where its values are garbage and may differ between paths (the
                 * emulated fma's domain ends there too): the selects below discard them, so no output
                 * does */
                XF_BIN_FAST_LOGIT f = XF_BIN_FAST_PIECES(xv);
                v = (fast & (want_d | want_o)) ? XF_BIN_FAST_LOSS(f, y, wj, qj) : v;
                gv = (fast_g & want_g) ? XF_BIN_FAST_GRAD(f, y, wj, qj, sj) : gv;
            }
        }
        if (want_d | want_o) {
            v = ign ? 0.0 : v;
            if (want_d) {
                ld[j] = v;
            }
            if (want_o) {
                lo[j] = (XF_T)v;
            }
        }
        if (want_g) {
            gr[j] = (XF_T)(ign ? 0.0 : gv);
        }
    }
}

/* elements per fast-form decision: small enough that one odd element costs little, large enough for
 * the vector loops */
#define XF_BIN_FAST_CHUNK 64
/* what a chunk decided: the fast loop, the fast loop with far logits, or the mixed path (the
 * few odd elements redone, or a per-element select) */
#define XF_BIN_CHUNK_MIXED 0
#define XF_BIN_CHUNK_FAST 1
#define XF_BIN_CHUNK_FAR 2
#define XF_BIN_CHUNK_MID 3

XF_HD void XF_BIN_FN(xf_bce_logits_chunk)(XF_BIN_FN(xf_bin_blk) b, long long n, const xf_bin_args *a,
                                           const int unweighted, const int fast_mode, double *loss_d,
                                           XF_T *loss_o, XF_T *grad)
{
    /* the block converts loss_d into loss_o once, after all its chunks (XF_BIN_CONVERT_LOSS) */
#if !XF_CUDA
    if (fast_mode >= 2) {
        /* the exponentials of XF_BIN_STAGE elements first, in a loop of their own, then the rest of each
         * element from them: the same operations, but the element's chain (exponential, division,
         * polynomial, loss) is cut in two, and each loop's iterations are short enough for the core to
         * overlap several of them (see benchmarks/README.md, ninth round; float64's double-double form:
         * sixteenth round, 4096x1000 one thread 30.2 -> 26.7 ms avx512, 42.9 -> 36.7 avx2) */
        double ebuf[XF_BIN_STAGE];
#if XF_BIN_FAST == 2
        double elbuf[XF_BIN_STAGE]; /* the low parts of float64's double-double exponentials */
#elif XF_BIN_DIVISIONS_APART
        double rdbuf[XF_BIN_STAGE], lbuf[XF_BIN_STAGE];
#endif
        long long s0, j;
        for (s0 = 0; s0 < n; s0 += XF_BIN_STAGE) {
            const long long len = (n - s0 < XF_BIN_STAGE) ? n - s0 : XF_BIN_STAGE;
            const XF_BIN_FN(xf_bin_blk) c = XF_BIN_FN(xf_bin_blk_from)(b, s0);
            {
                /* the same stage of the next block's logits and targets, fetched while this one's
                 * arithmetic runs: the next block's fast-form decision reads them first and otherwise
                 * waits on memory (a hint: no result depends on it, and a prefetch never faults, even past
                 * the arrays).  BCE 65536x256 float32, one thread: 47.6-51.2 -> 43.8-44.3 ms (avx512
                 * path), 66-67 -> 62-63 ms (avx2; benchmarks/README.md, 2026-12-04, late); float64
                 * 4096x1000: 26.7 -> 24.4 ms (avx512), 36.7 -> 35.1 (avx2; sixteenth round) */
                const char *px = (const char *)(c.x + XF_BIN_BLOCK), *pt = (const char *)(c.t + XF_BIN_BLOCK);
                long long i;
                for (i = 0; i < len * (long long)sizeof(XF_T); i += 64) {
                    __builtin_prefetch(px + i, 0, 3);
                    __builtin_prefetch(pt + i, 0, 3);
                }
            }
#if XF_BIN_FAST == 2
            if (fast_mode == 4) {
#pragma omp simd
                for (j = 0; j < len; j++) {
                    ebuf[j] = xf_bin_fast64_exp((double)c.x[j], 2, &elbuf[j]);
                }
                XF_BIN_OUTPUTS(XF_BIN_FN(xf_bce_logits_body), c, len, a, unweighted, 4, ebuf, elbuf, 0, 0);
            } else if (fast_mode == 3) {
#pragma omp simd
                for (j = 0; j < len; j++) {
                    ebuf[j] = xf_bin_fast64_exp((double)c.x[j], 1, &elbuf[j]);
                }
                XF_BIN_OUTPUTS(XF_BIN_FN(xf_bce_logits_body), c, len, a, unweighted, 3, ebuf, elbuf, 0, 0);
            } else {
#pragma omp simd
                for (j = 0; j < len; j++) {
                    ebuf[j] = xf_bin_fast64_exp((double)c.x[j], 0, &elbuf[j]);
                }
                XF_BIN_OUTPUTS(XF_BIN_FN(xf_bce_logits_body), c, len, a, unweighted, 2, ebuf, elbuf, 0, 0);
            }
#else
            long long j_first = 0;
#if defined(__AVX512F__)
            /* exp(-|x|) <= 1 with |x| clamped to 550 (xf_bin_fast_exp): a normal number, where the
             * exponential's scale is one instruction (xf_exp_lite_normal_pd512), the same bits. */
            for (; j_first + 8 <= len; j_first += 8) {
                const __m512d v = _mm512_cvtps_pd(_mm256_loadu_ps((const float *)c.x + j_first));
                /* -|x|: the sign bit set, as -xf_fabs(x) */
                const __m512d neg_abs = _mm512_castsi512_pd(
                    _mm512_or_si512(_mm512_castpd_si512(v), _mm512_set1_epi64((long long)0x8000000000000000ULL)));
                const __m512d arg = _mm512_max_pd(neg_abs, _mm512_set1_pd(-XF_BIN_FAST_EXP_MAX_ABS_X));
                _mm512_storeu_pd(ebuf + j_first, xf_exp_lite_normal_pd512(arg));
            }
#endif
#pragma omp simd
            for (j = j_first; j < len; j++) {
                ebuf[j] = xf_bin_fast_exp((double)c.x[j]);
            }
#if XF_BIN_DIVISIONS_APART
            /* the two divisions (1 / (1 + e) and the one in log1p) in a loop of their own as well: in
             * the element's loop they sat in the middle of its chain, and with four doubles per vector
             * the core overlapped too few elements to keep its pipes busy */
#pragma omp simd
            for (j = 0; j < len; j++) {
                rdbuf[j] = 1.0 / (1.0 + ebuf[j]);
                lbuf[j] = xf_bin_log1p_unit_tails(ebuf[j], fast_mode >= 3);
            }
            XF_BIN_OUTPUTS(XF_BIN_FN(xf_bce_logits_body), c, len, a, unweighted, 2, ebuf, 0, rdbuf, lbuf);
#else
            if (fast_mode >= 3) {
                XF_BIN_OUTPUTS(XF_BIN_FN(xf_bce_logits_body), c, len, a, unweighted, 3, ebuf, 0, 0, 0);
            } else {
                XF_BIN_OUTPUTS(XF_BIN_FN(xf_bce_logits_body), c, len, a, unweighted, 2, ebuf, 0, 0, 0);
            }
#endif
#endif
        }
        return;
    }
#endif
    XF_BIN_OUTPUTS(XF_BIN_FN(xf_bce_logits_body), b, n, a, unweighted, fast_mode, 0, 0, 0, 0);
}

/* One out-of-line function per form, each with a literal mode: inlined side by side under a data-
 * dependent test, gcc merged the two loops back into one that computes every form (measured: 2-3x
 * slower). */
#if XF_CUDA
#define XF_BIN_OWN_CODE XF_KERNEL
#else
#define XF_BIN_OWN_CODE XF_KERNEL __attribute__((noinline))
#endif
/* the loop instance of a literal fast_mode for the call's weighting, itself a literal in each branch */
#define XF_BCE_LOGITS_CHUNK_OF_WEIGHTING(mode)                                                           \
    do {                                                                                                  \
        if (unweighted == XF_BIN_PLAIN) {                                                                 \
            XF_BIN_FN(xf_bce_logits_chunk)(c, len, a, XF_BIN_PLAIN, (mode), loss_d, loss_o, grad);       \
        } else if (unweighted) {                                                                          \
            XF_BIN_FN(xf_bce_logits_chunk)(c, len, a, 1, (mode), loss_d, loss_o, grad);                  \
        } else {                                                                                          \
            XF_BIN_FN(xf_bce_logits_chunk)(c, len, a, 0, (mode), loss_d, loss_o, grad);                  \
        }                                                                                                 \
    } while (0)
XF_BIN_OWN_CODE void XF_BIN_FN(xf_bce_logits_fast_chunk)(XF_BIN_FN(xf_bin_blk) c, long long len,
                                                         const xf_bin_args *a, int unweighted, int far,
                                                         double *loss_d, XF_T *loss_o, XF_T *grad)
{
    /* far: float64's far logits (2: and the middle ones), float32's beyond XF_BIN_FAST_NEAR_ABS_X
     * (XF_BIN_FAST_X_OK) */
#if XF_BIN_FAST == 2
    if (far == 2) {
        XF_BCE_LOGITS_CHUNK_OF_WEIGHTING(4);
        return;
    }
#endif
    if (far) {
        XF_BCE_LOGITS_CHUNK_OF_WEIGHTING(3);
        return;
    }
    XF_BCE_LOGITS_CHUNK_OF_WEIGHTING(2);
}
#undef XF_BCE_LOGITS_CHUNK_OF_WEIGHTING

XF_BIN_OWN_CODE void XF_BIN_FN(xf_bce_logits_mixed_chunk)(XF_BIN_FN(xf_bin_blk) c, long long len,
                                                          const xf_bin_args *a, int unweighted, double *loss_d,
                                                          XF_T *loss_o, XF_T *grad)
{
    if (unweighted == XF_BIN_PLAIN) {
#if XF_CUDA
        XF_BIN_FN(xf_bce_logits_chunk)(c, len, a, XF_BIN_PLAIN, 1, loss_d, loss_o, grad);
#else
        /* the unweighted instance with an upstream factor of ones (scale * 1 is scale: the same values;
         * a plain call has no ignore value either): gcc left the plain instance's mixed loop scalar, 3x
         * slower (a float32 call with a third of its logits at 90: 97.7 ms, the weighted one 34.8).
         * len <= XF_BIN_BLOCK: a run lies within one block */
        double ones[XF_BIN_BLOCK];
        long long j;
        if (grad) {
            for (j = 0; j < len; j++) {
                ones[j] = 1.0;
            }
            c.g = ones;
        }
        XF_BIN_FN(xf_bce_logits_chunk)(c, len, a, 1, 1, loss_d, loss_o, grad);
#endif
    } else if (unweighted) {
        XF_BIN_FN(xf_bce_logits_chunk)(c, len, a, 1, 1, loss_d, loss_o, grad);
    } else {
        XF_BIN_FN(xf_bce_logits_chunk)(c, len, a, 0, 1, loss_d, loss_o, grad);
    }
}

/* Whether every element of the chunk [c0, c0 + len) takes the fast form for each wanted output (the
 * loss, and the gradient when asked), for a literal `unweighted`; with `far` (a literal) float64's far
 * logits count too. */
XF_HD int XF_BIN_FN(xf_bce_logits_chunk_fast)(XF_BIN_FN(xf_bin_blk) b, long long c0, long long len,
                                               const xf_bin_args *a, const int unweighted, const int grad,
                                               const int far)
{
    const double scale = a->scale, loss_k = a->loss_k;
    const XF_BIN_FN(xf_bin_blk) c = XF_BIN_FN(xf_bin_blk_from)(b, c0);
    /* no weights and no per-element upstream factor (the ones in b.g): the predicates reduce to a
     * finite x and 0 <= y <= 1 per element (float64: |x| <= 500, with far also 900 <= |x| <= 2^900, y = 0
     * or 2^-60 <= y <= 1), and the rest is the same for every element.  Those tests give the same answer
     * in the storage type (FLT_MAX, 0 and 1 are exact floats, and the conversion to double is exact and
     * monotone), where one vector holds 8 floats instead of 4 doubles and no conversion or mask packing
     * is needed (the double form was ~7 % of a float32 call). */
    const XF_T zero = (XF_T)0.0, one = (XF_T)1.0;
    int all_ok = 1;
    long long j;
    if (unweighted && a->g == 0 && a->g_f32 == 0) {
        all_ok = (loss_k == 0.0) && (!grad || xf_bin_bce_fast_grad_ok(1, scale));
#pragma omp simd reduction(& : all_ok)
        for (j = 0; j < len; j++) {
            const XF_T xv = c.x[j], yv = c.t[j];
            all_ok &= XF_BIN_FAST_X_OK(xv, far) & (yv >= zero) & (yv <= one) & XF_BIN_FAST_Y_OK(yv);
        }
    } else if (grad && unweighted && c.g32 && scale == 1.0 && loss_k == 0.0) {
        /* float32 upstream factors under a scale of 1 (reduction="none"): s = g exactly, and 2^-60 and
         * 2^60 are floats, so the whole test stays in float as above (in double it cost a float32 call
         * with grad_output ~15 %) */
        const float g_lo = (float)XF_BIN_FAST_LO, g_hi = (float)XF_BIN_FAST_HI;
#pragma omp simd reduction(& : all_ok)
        for (j = 0; j < len; j++) {
            const XF_T xv = c.x[j], yv = c.t[j];
            const float gv = c.g32[j];
            all_ok &= XF_BIN_FAST_X_OK(xv, far) & (yv >= zero) & (yv <= one) & XF_BIN_FAST_Y_OK(yv) &
                      (((gv >= g_lo) & (gv <= g_hi)) | ((gv <= -g_lo) & (gv >= -g_hi)));
        }
    } else if (grad) {
#pragma omp simd reduction(& : all_ok)
        for (j = 0; j < len; j++) {
            all_ok &= xf_bin_bce_fast_grad_ok(
                XF_BIN_FAST_RULE((double)c.x[j], (double)c.t[j], unweighted ? 1.0 : c.w[j],
                                 unweighted ? 1.0 : c.q[j], loss_k, far),
                scale * c.g[j]);
        }
    } else {
#pragma omp simd reduction(& : all_ok)
        for (j = 0; j < len; j++) {
            all_ok &= XF_BIN_FAST_RULE((double)c.x[j], (double)c.t[j], unweighted ? 1.0 : c.w[j],
                                       unweighted ? 1.0 : c.q[j], loss_k, far);
        }
    }
    return all_ok;
}

/* How many of the chunk's elements the fast form does not serve for a wanted output, for a literal
 * `unweighted` (the PLAIN instance has no upstream array to read) */
XF_HD int XF_BIN_FN(xf_bce_logits_odd)(XF_BIN_FN(xf_bin_blk) c, long long n, const xf_bin_args *a,
                                        const int unweighted, const int want_loss, const int want_grad, int *redo)
{
    const double scale = a->scale, loss_k = a->loss_k;
    int odd = 0;
    long long j;
    /* two loops, so that neither loads the upstream factors under a condition (a masked load) */
    if (want_grad && unweighted != XF_BIN_PLAIN) {
#pragma omp simd reduction(+ : odd)
        for (j = 0; j < n; j++) {
            const int fast = XF_BIN_FAST_OK((double)c.x[j], (double)c.t[j], unweighted ? 1.0 : c.w[j],
                                            unweighted ? 1.0 : c.q[j], loss_k);
            redo[j] = (want_loss & !fast) | (!xf_bin_bce_fast_grad_ok(fast, scale * c.g[j]) << 1);
            odd += (redo[j] != 0);
        }
    } else {
#pragma omp simd reduction(+ : odd)
        for (j = 0; j < n; j++) {
            const int fast = XF_BIN_FAST_OK((double)c.x[j], (double)c.t[j], unweighted ? 1.0 : c.w[j],
                                            unweighted ? 1.0 : c.q[j], loss_k);
            redo[j] = (want_loss & !fast) | ((want_grad & !xf_bin_bce_fast_grad_ok(fast, scale)) << 1);
            odd += (redo[j] != 0);
        }
    }
    return odd;
}

/* A run of chunks that are not all fast: per chunk, its few odd elements redone after the fast loop, or,
 * with more than XF_BIN_REDO_MAX, the per-element select; consecutive chunks of the latter kind in one
 * call (a call per chunk cost the select ~8 %: float32, 4096x1000, a logit in 16 at -inf, one thread). */
XF_BIN_OWN_CODE void XF_BIN_FN(xf_bce_logits_mixed)(XF_BIN_FN(xf_bin_blk) c, long long n, const xf_bin_args *a,
                                                    int unweighted, double *loss_d, XF_T *loss_o, XF_T *grad)
{
    double loss_general[XF_BIN_FAST_CHUNK], grad_general[XF_BIN_FAST_CHUNK];
    int redo[XF_BIN_FAST_CHUNK];
    const int want_loss = (loss_d || loss_o), want_grad = (grad != 0);
    long long k0, select_from = -1;
    for (k0 = 0; k0 < n; k0 += XF_BIN_FAST_CHUNK) {
        const long long m = (n - k0 < XF_BIN_FAST_CHUNK) ? n - k0 : XF_BIN_FAST_CHUNK;
        const XF_BIN_FN(xf_bin_blk) ck = XF_BIN_FN(xf_bin_blk_from)(c, k0);
        const int odd = (unweighted == XF_BIN_PLAIN)
                            ? XF_BIN_FN(xf_bce_logits_odd)(ck, m, a, XF_BIN_PLAIN, want_loss, want_grad, redo)
                        : unweighted ? XF_BIN_FN(xf_bce_logits_odd)(ck, m, a, 1, want_loss, want_grad, redo)
                                     : XF_BIN_FN(xf_bce_logits_odd)(ck, m, a, 0, want_loss, want_grad, redo);
        if (odd > XF_BIN_REDO_MAX) {
            select_from = (select_from < 0) ? k0 : select_from;
            continue;
        }
        if (select_from >= 0) {
            XF_BIN_FN(xf_bce_logits_mixed_chunk)(XF_BIN_FN(xf_bin_blk_from)(c, select_from), k0 - select_from, a,
                                                 unweighted, loss_d, loss_o, grad);
            select_from = -1;
        }
        XF_BIN_FN(xf_bin_redo_before)(ck, m, a, XF_BIN_OP_BCE_LOGITS, unweighted, redo, loss_general,
                                      grad_general);
        /* the fast loop with far (and float64's middle) logits: the chunk's ordinary elements may include
         * them */
        XF_BIN_FN(xf_bce_logits_fast_chunk)(ck, m, a, unweighted, (XF_BIN_FAST == 2) ? 2 : 1, loss_d, loss_o,
                                            grad);
        XF_BIN_FN(xf_bin_redo_after)(ck, m, redo, loss_general, grad_general);
    }
    if (select_from >= 0) {
        XF_BIN_FN(xf_bce_logits_mixed_chunk)(XF_BIN_FN(xf_bin_blk_from)(c, select_from), n - select_from, a,
                                             unweighted, loss_d, loss_o, grad);
    }
}

/* Elements [c0, c1) in the form their chunks decided (XF_BIN_CHUNK_*). */
XF_HD void XF_BIN_FN(xf_bce_logits_run)(XF_BIN_FN(xf_bin_blk) b, long long c0, long long c1, int kind,
                                         const xf_bin_args *a, const int unweighted, double *loss_d,
                                         XF_T *loss_o, XF_T *grad)
{
    const XF_BIN_FN(xf_bin_blk) c = XF_BIN_FN(xf_bin_blk_from)(b, c0);
    if (kind != XF_BIN_CHUNK_MIXED) {
        XF_BIN_FN(xf_bce_logits_fast_chunk)(c, c1 - c0, a, unweighted,
                                            (kind == XF_BIN_CHUNK_MID) ? 2 : (kind == XF_BIN_CHUNK_FAR), loss_d,
                                            loss_o, grad);
    } else {
        /* an infinite upstream factor is never fast, and the chunk decision has just read these factors */
        double rescued[XF_BIN_BLOCK];
        const int inf_upstream =
            grad && XF_BIN_FN(xf_bin_inf_upstream_scan)(c, c1 - c0, a, unweighted, XF_BIN_OP_BCE_LOGITS, rescued);
        XF_BIN_FN(xf_bce_logits_mixed)(c, c1 - c0, a, unweighted, loss_d, loss_o, grad);
        if (inf_upstream) {
            XF_BIN_FN(xf_bin_inf_upstream_store)(c, c1 - c0, a, rescued);
        }
    }
}

/* The fast-form decision per chunk of XF_BIN_FAST_CHUNK elements, for a literal `unweighted`; then one
 * call per run of chunks that decided alike, so that a block of ordinary elements is one call of the
 * fast loop.  A call per chunk cost ~10 % of a float32 BCE call: each call passes the block by value
 * and loads and spills its ~15 constants afresh.  Every element still gets the form its own chunk
 * decided, so the bits are those of one call per chunk.  A chunk that is not fast with near logits
 * (float64 |x| <= 500, float32 |x| <= 160) is tested again with far logits. */
XF_HD int XF_BIN_FN(xf_bce_logits_chunks)(XF_BIN_FN(xf_bin_blk) b, long long n, const xf_bin_args *a,
                                           const int unweighted, double *loss_d, XF_T *loss_o, XF_T *grad)
{
    long long start = 0, c0;
    int run_kind = XF_BIN_CHUNK_MIXED, all_fast = 1;
    for (c0 = 0; c0 < n; c0 += XF_BIN_FAST_CHUNK) {
        const long long len = (n - c0 < XF_BIN_FAST_CHUNK) ? n - c0 : XF_BIN_FAST_CHUNK;
        int kind = XF_BIN_FN(xf_bce_logits_chunk_fast)(b, c0, len, a, unweighted, grad != 0, 0)
                       ? XF_BIN_CHUNK_FAST
                       : XF_BIN_CHUNK_MIXED;
        if (kind == XF_BIN_CHUNK_MIXED &&
            XF_BIN_FN(xf_bce_logits_chunk_fast)(b, c0, len, a, unweighted, grad != 0, 1)) {
            kind = XF_BIN_CHUNK_FAR;
        }
#if XF_BIN_FAST == 2
        /* the middle logits' loop instance only where a chunk needs it: handling them cost chunks of far
         * logits (padding's -1e4) ~10 % */
        if (kind == XF_BIN_CHUNK_MIXED &&
            XF_BIN_FN(xf_bce_logits_chunk_fast)(b, c0, len, a, unweighted, grad != 0, 2)) {
            kind = XF_BIN_CHUNK_MID;
        }
#endif
        if (c0 > 0 && kind != run_kind) {
            XF_BIN_FN(xf_bce_logits_run)(b, start, c0, run_kind, a, unweighted, loss_d, loss_o, grad);
            start = c0;
        }
        run_kind = kind;
        all_fast &= (kind != XF_BIN_CHUNK_MIXED);
    }
    if (n > 0) {
        XF_BIN_FN(xf_bce_logits_run)(b, start, n, run_kind, a, unweighted, loss_d, loss_o, grad);
    }
    return all_fast;
}

/* Whether one of the n targets lies outside [0, 1] or is NaN. */
XF_HD int XF_BIN_FN(xf_bin_targets_outside_unit)(const XF_T *t, long long n)
{
    int bad = 0;
    long long j;
#pragma omp simd reduction(| : bad)
    for (j = 0; j < n; j++) {
        bad |= !((t[j] >= (XF_T)0.0) & (t[j] <= (XF_T)1.0));
    }
    return bad;
}

/* BCE with logits over elements [off, off + n) */
XF_KERNEL void XF_BIN_FN(xf_bce_logits_block)(const XF_T *x, const XF_T *t, long long off, long long n,
                                               const xf_bin_args *a, double *loss_d, XF_T *loss_o, XF_T *grad)
{
    double wbuf[XF_BIN_BLOCK], pwbuf[XF_BIN_BLOCK], gbuf[XF_BIN_BLOCK];
    double sum_scratch[XF_BIN_BLOCK];
    XF_BIN_FN(xf_bin_blk) b = XF_BIN_FN(xf_bin_blk_make)(x, t, off, a, loss_d, loss_o, grad, sum_scratch);
    loss_d = b.ld; /* from here on only tested for presence: which outputs the instances write */
    const int unweighted = (a->w == 0 && a->pw == 0);
    /* no upstream array and no ignore value either: the instances read no g and test no target */
    const int plain = unweighted && a->g == 0 && a->g_f32 == 0 && !a->has_ignore;
    /* the unweighted instances never read weights (they use the constant 1): no block of ones to fill
     * (two 8 KiB stores per block, ~5 % of a float32 element's time) */
    b.w = unweighted ? wbuf : xf_bin_gather(a->w, a->w_div, a->w_mod, a->w_full, off, n, wbuf);
    b.q = unweighted ? pwbuf : xf_bin_gather(a->pw, a->pw_div, a->pw_mod, a->pw_full, off, n, pwbuf);
    b.g = (grad && !plain) ? XF_BIN_FN(xf_bin_upstream_block)(a, off, n, gbuf) : 0;
    if (plain) {
        const int all_fast = XF_BIN_FN(xf_bce_logits_chunks)(b, n, a, XF_BIN_PLAIN, loss_d, loss_o, grad);
        /* every target of a fast chunk lies in [0, 1] (its test includes that), so only a block with a
         * slow chunk (an infinite or NaN logit, a bad target, an extreme scale) reads its targets once
         * more: the caller's target check at no cost on ordinary blocks, where a pass of its own over the
         * targets took ~10 % of a float32 call (benchmarks/README.md, 2026-12-05, third round) */
        if (!all_fast && a->unit_fail && XF_BIN_FN(xf_bin_targets_outside_unit)(t + off, n)) {
            a->unit_fail[off / XF_BIN_BLOCK] = 1;
        }
    } else if (unweighted) {
        XF_BIN_FN(xf_bce_logits_chunks)(b, n, a, 1, loss_d, loss_o, grad);
    } else {
        XF_BIN_FN(xf_bce_logits_chunks)(b, n, a, 0, loss_d, loss_o, grad);
    }
    XF_BIN_CONVERT_LOSS();
    XF_BIN_FN(xf_bin_block_partial)(a, off, n, sum_scratch);
}

/* ---- sigmoid focal loss ------------------------------------------------------------------------------- */

/* fast_mode: 0 the general form only, 2 the float32 plain-double form only (binary.h), 1 both with a
 * per-element select (chunks with many elements the fast form does not serve, xf_focal_mixed) */
XF_HD void XF_BIN_FN(xf_focal_body)(XF_BIN_FN(xf_bin_blk) b, long long n, const xf_bin_args *a,
                                     const int fast_mode, const int want_d, const int want_o, const int want_g)
{
    const XF_T *x = b.x, *t = b.t;
    const double *g = b.g;
    double *ld = b.ld;
    XF_T *lo = b.lo, *gr = b.gr;
    const int has_ignore = a->has_ignore;
    const double ignore = a->ignore, scale = a->scale, loss_k = a->loss_k;
    const double alpha = a->alpha, gamma = a->gamma;
    long long j;
#pragma omp simd
    for (j = 0; j < n; j++) {
        double xv = (double)x[j];
        double y = (double)t[j];
        int ign = has_ignore & (y == ignore);
        double sj = want_g ? scale * g[j] : 1.0;
        double v = 0.0, gv = 0.0;
        if (fast_mode == 2) {
            xf_bin_fast_logit f = xf_bin_fast_pieces(xv);
            xf_bin_focal_fast_parts r = xf_bin_focal_fast_prepare(f, y, alpha, gamma);
            v = (want_d | want_o) ? xf_bin_focal_fast_loss(r) : 0.0;
            gv = want_g ? xf_bin_focal_fast_grad(f, r, y, gamma, sj) : 0.0;
        } else {
            xf_bin_logit p = xf_bin_logit_pieces(xv);
            xf_bin_focal_parts f = xf_bin_focal_prepare(p, y, alpha, gamma);
            v = (want_d | want_o) ? xf_bin_focal_loss(p, f, gamma, loss_k) : 0.0;
            gv = want_g ? xf_bin_focal_grad(p, f, y, gamma, sj) : 0.0;
            if (fast_mode == 1) {
                /* garbage outside the fast form's domain, discarded by the selects (see BCE's body) */
                int fast = xf_bin_focal_fast_ok(xv, y, gamma, loss_k);
                int fast_g = xf_bin_bce_fast_grad_ok(fast, sj);
                xf_bin_fast_logit fp = xf_bin_fast_pieces(xv);
                xf_bin_focal_fast_parts r = xf_bin_focal_fast_prepare(fp, y, alpha, gamma);
                v = (fast & (want_d | want_o)) ? xf_bin_focal_fast_loss(r) : v;
                gv = (fast_g & want_g) ? xf_bin_focal_fast_grad(fp, r, y, gamma, sj) : gv;
            }
        }
        if (want_d | want_o) {
            v = ign ? 0.0 : v;
            if (want_d) {
                ld[j] = v;
            }
            if (want_o) {
                lo[j] = (XF_T)v;
            }
        }
        if (want_g) {
            gr[j] = (XF_T)(ign ? 0.0 : gv);
        }
    }
}

#if XF_BIN_FAST == 1
/* Whether every element of the chunk [c0, c0 + len) takes the focal loss's fast form for each wanted
 * output: |x| <= 550 and 0 <= y <= 1 tested on the stored floats (see xf_bce_logits_chunk_fast), the
 * upstream factors in double. */
XF_HD int XF_BIN_FN(xf_focal_chunk_fast)(XF_BIN_FN(xf_bin_blk) b, long long c0, long long len,
                                          const xf_bin_args *a, const int grad)
{
    const XF_BIN_FN(xf_bin_blk) c = XF_BIN_FN(xf_bin_blk_from)(b, c0);
    const XF_T max_abs = (XF_T)XF_BIN_FOCAL_FAST_MAX_ABS_X, zero = (XF_T)0.0, one = (XF_T)1.0;
    const double scale = a->scale;
    int all_ok = xf_bin_focal_fast_ok(0.0, 0.0, a->gamma, a->loss_k);
    long long j;
#pragma omp simd reduction(& : all_ok)
    for (j = 0; j < len; j++) {
        const XF_T xv = c.x[j], yv = c.t[j];
        all_ok &= (xv <= max_abs) & (xv >= -max_abs) & (yv >= zero) & (yv <= one);
    }
    if (grad && all_ok) {
#pragma omp simd reduction(& : all_ok)
        for (j = 0; j < len; j++) {
            all_ok &= xf_bin_bce_fast_grad_ok(1, scale * c.g[j]);
        }
    }
    return all_ok;
}


XF_BIN_OWN_CODE void XF_BIN_FN(xf_focal_mixed)(XF_BIN_FN(xf_bin_blk) b, long long n, const xf_bin_args *a,
                                              double *loss_d, XF_T *loss_o, XF_T *grad)
{
    double loss_general[XF_BIN_FAST_CHUNK], grad_general[XF_BIN_FAST_CHUNK];
    int redo[XF_BIN_FAST_CHUNK];
    const double scale = a->scale, gamma = a->gamma, loss_k = a->loss_k;
    const int want_loss = (loss_d || loss_o), want_grad = (grad != 0);
    int odd = 0;
    long long j;
    if (want_grad) {
#pragma omp simd reduction(+ : odd)
        for (j = 0; j < n; j++) {
            const int fast = xf_bin_focal_fast_ok((double)b.x[j], (double)b.t[j], gamma, loss_k);
            redo[j] = (want_loss & !fast) | (!xf_bin_bce_fast_grad_ok(fast, scale * b.g[j]) << 1);
            odd += (redo[j] != 0);
        }
    } else {
#pragma omp simd reduction(+ : odd)
        for (j = 0; j < n; j++) {
            redo[j] = !xf_bin_focal_fast_ok((double)b.x[j], (double)b.t[j], gamma, loss_k);
            odd += redo[j];
        }
    }
    if (odd > XF_BIN_REDO_MAX) {
        XF_BIN_OUTPUTS(XF_BIN_FN(xf_focal_body), b, n, a, 1);
        return;
    }
    /* the chunk's few odd elements (|x| > 550, inf, NaN, a target outside [0, 1], an upstream factor
     * outside [2^-60, 2^60]) in the general form, the rest in the fast loop (xf_bin_redo_before); one
     * logit in 50 at 1000, float32 4096x1000, one thread: 70 ms, where a per-element select took 162 and
     * the general form alone 138 */
    XF_BIN_FN(xf_bin_redo_before)(b, n, a, XF_BIN_OP_FOCAL, 1, redo, loss_general, grad_general);
    XF_BIN_OUTPUTS(XF_BIN_FN(xf_focal_body), b, n, a, 2);
    XF_BIN_FN(xf_bin_redo_after)(b, n, redo, loss_general, grad_general);
}

/* one out-of-line function per form, as for BCE (xf_bce_logits_fast_chunk) */
XF_BIN_OWN_CODE void XF_BIN_FN(xf_focal_run)(XF_BIN_FN(xf_bin_blk) c, long long len, const xf_bin_args *a,
                                            const int fast, double *loss_d, XF_T *loss_o, XF_T *grad)
{
    if (fast) {
        const long long n = len;
        XF_BIN_FN(xf_bin_blk) b = c;
        XF_BIN_OUTPUTS(XF_BIN_FN(xf_focal_body), b, n, a, 2);
    } else {
        long long c0;
        for (c0 = 0; c0 < len; c0 += XF_BIN_FAST_CHUNK) {
            const long long m = (len - c0 < XF_BIN_FAST_CHUNK) ? len - c0 : XF_BIN_FAST_CHUNK;
            XF_BIN_FN(xf_focal_mixed)(XF_BIN_FN(xf_bin_blk_from)(c, c0), m, a, loss_d, loss_o, grad);
        }
    }
}
#endif

/* sigmoid focal loss over elements [off, off + n) */
XF_KERNEL void XF_BIN_FN(xf_focal_block)(const XF_T *x, const XF_T *t, long long off, long long n,
                                          const xf_bin_args *a, double *loss_d, XF_T *loss_o, XF_T *grad)
{
    double gbuf[XF_BIN_BLOCK];
    double sum_scratch[XF_BIN_BLOCK];
    XF_BIN_FN(xf_bin_blk) b = XF_BIN_FN(xf_bin_blk_make)(x, t, off, a, loss_d, loss_o, grad, sum_scratch);
    loss_d = b.ld; /* from here on only tested for presence: which outputs the instances write */
    b.g = grad ? XF_BIN_FN(xf_bin_upstream_block)(a, off, n, gbuf) : 0;
#if XF_BIN_FAST == 1
    /* gamma beyond 20 or a loss scale: no element takes the fast form (the general form below) */
    if (xf_bin_focal_fast_ok(0.0, 0.0, a->gamma, a->loss_k)) {
        XF_BIN_CHUNK_RUNS(XF_BIN_FN(xf_focal_chunk_fast), XF_BIN_FN(xf_focal_run), );
        XF_BIN_CONVERT_LOSS();
        XF_BIN_FN(xf_bin_block_partial)(a, off, n, sum_scratch);
        return;
    }
#endif
    /* unswitched on the loop-invariant tests of binary.h (gamma = 0, alpha < 0): inside each branch the
     * compiler knows their outcome, and gcc does not vectorize a select on an invariant condition */
    if (a->gamma == 0.0) {
        if (a->alpha < 0.0) {
            XF_BIN_UNSWITCH(XF_BIN_FN(xf_focal_body), b, n, a, 0);
        } else {
            XF_BIN_UNSWITCH(XF_BIN_FN(xf_focal_body), b, n, a, 0);
        }
    } else {
        if (a->alpha < 0.0) {
            XF_BIN_UNSWITCH(XF_BIN_FN(xf_focal_body), b, n, a, 0);
        } else {
            XF_BIN_UNSWITCH(XF_BIN_FN(xf_focal_body), b, n, a, 0);
        }
    }
    XF_BIN_FN(xf_bin_block_partial)(a, off, n, sum_scratch);
}

/* ---- BCE from probabilities --------------------------------------------------------------------------- */

/* The storage type's fast form (binary.h): float32's plain double, float64's double-double; each its own
 * predicate, pieces and formulas, the same chunk decision and loops.  XF_BIN_PROB_P_OK: the form's lower
 * limit on p tested on a stored value (float32 p > 0, float64 p >= 2^-400). */
#undef XF_BIN_PROB_OK
#undef XF_BIN_PROB_FAST_T
#undef XF_BIN_PROB_PIECES
#undef XF_BIN_PROB_LOSS
#undef XF_BIN_PROB_GRAD
#undef XF_BIN_PROB_P_OK
#if XF_BIN_FAST == 2
#define XF_BIN_PROB_OK xf_bin_bce_prob_fast64_ok
#define XF_BIN_PROB_FAST_T xf_bin_prob_fast64
#define XF_BIN_PROB_PIECES xf_bin_prob_fast64_pieces
#define XF_BIN_PROB_LOSS xf_bin_bce_prob_fast64_loss
#define XF_BIN_PROB_GRAD xf_bin_bce_prob_fast64_grad
#define XF_BIN_PROB_P_OK(pv) ((pv) >= (XF_T)XF_BIN_PROB_FAST64_MIN_P)
#else
#define XF_BIN_PROB_OK xf_bin_bce_prob_fast_ok
#define XF_BIN_PROB_FAST_T xf_bin_prob_fast
#define XF_BIN_PROB_PIECES xf_bin_prob_fast_pieces
#define XF_BIN_PROB_LOSS xf_bin_bce_prob_fast_loss
#define XF_BIN_PROB_GRAD xf_bin_bce_prob_fast_grad
/* p > 0 (a comparison with float32's least subnormal would itself be a subnormal operation) */
#define XF_BIN_PROB_P_OK(pv) ((pv) > (XF_T)0.0)
#endif

/* fast_mode: 0 the general form only, 2 the storage type's fast form only (binary.h), 1 both with a
 * per-element select (chunks with many elements the fast form does not serve) */
XF_HD void XF_BIN_FN(xf_bce_prob_body)(XF_BIN_FN(xf_bin_blk) b, long long n, const xf_bin_args *a,
                                        const int unweighted, const int fast_mode, const int want_d,
                                        const int want_o, const int want_g)
{
    const XF_T *x = b.x, *t = b.t;
    const double *w = b.w, *g = b.g;
    double *ld = b.ld;
    XF_T *lo = b.lo, *gr = b.gr;
    const int has_ignore = a->has_ignore;
    const double ignore = a->ignore, scale = a->scale, loss_k = a->loss_k;
    const xf_bin_prob_mode m = a->mode;
    long long j;
#pragma omp simd
    for (j = 0; j < n; j++) {
        double pv = (double)x[j];
        double y = (double)t[j];
        int ign = has_ignore & (y == ignore);
        const double wj = unweighted ? 1.0 : w[j];
        const double sj = want_g ? scale * g[j] : 1.0;
        double v = 0.0, gv = 0.0;
        if (fast_mode == 2) {
            const XF_BIN_PROB_FAST_T f = XF_BIN_PROB_PIECES(pv);
            v = (want_d | want_o) ? XF_BIN_PROB_LOSS(f, y, wj) : 0.0;
            gv = want_g ? XF_BIN_PROB_GRAD(f, pv, y, wj, sj) : 0.0;
        } else {
            v = (want_d | want_o) ? xf_bin_bce_prob_loss(pv, y, wj, &m, loss_k) : 0.0;
            gv = want_g ? xf_bin_bce_prob_grad(pv, y, wj, sj, &m) : 0.0;
            if (fast_mode == 1) {
                /* garbage outside the fast form's domain, discarded by the selects (see BCE's body) */
                const int fast = XF_BIN_PROB_OK(pv, y, wj, &m, loss_k);
                const int fast_g = xf_bin_bce_fast_grad_ok(fast, sj);
                const XF_BIN_PROB_FAST_T f = XF_BIN_PROB_PIECES(pv);
                v = (fast & (want_d | want_o)) ? XF_BIN_PROB_LOSS(f, y, wj) : v;
                gv = (fast_g & want_g) ? XF_BIN_PROB_GRAD(f, pv, y, wj, sj) : gv;
            }
        }
        if (want_d | want_o) {
            v = ign ? 0.0 : v;
            if (want_d) {
                ld[j] = v;
            }
            if (want_o) {
                lo[j] = (XF_T)v;
            }
        }
        if (want_g) {
            gr[j] = (XF_T)(ign ? 0.0 : gv);
        }
    }
}

/* How many of the chunk's elements the fast form does not serve for a wanted output (redo[j]: 1 the loss, 2
 * the gradient), for literal `unweighted` and `want_grad`, so that no loop loads the weights or the upstream
 * factors under a condition (gcc makes masked loads of those) */
XF_HD int XF_BIN_FN(xf_bce_prob_odd)(XF_BIN_FN(xf_bin_blk) c, long long n, const xf_bin_args *a,
                                      const int unweighted, const int want_loss, const int want_grad, int *redo)
{
    const double scale = a->scale, loss_k = a->loss_k;
    const xf_bin_prob_mode m = a->mode;
    int odd = 0;
    long long j;
#pragma omp simd reduction(+ : odd)
    for (j = 0; j < n; j++) {
        const int fast = XF_BIN_PROB_OK((double)c.x[j], (double)c.t[j], unweighted ? 1.0 : c.w[j], &m, loss_k);
        const double sj = want_grad ? scale * c.g[j] : 1.0;
        redo[j] = (want_loss & !fast) | ((want_grad & !xf_bin_bce_fast_grad_ok(fast, sj)) << 1);
        odd += (redo[j] != 0);
    }
    return odd;
}

/* Whether every element of the chunk [c0, c0 + len) takes the fast form for each wanted output.  Without
 * weights, upstream array, clip or clamp the rule is XF_BIN_PROB_P_OK(p), p < 1 and 0 <= y <= 1 (float64:
 * y = 0 or y >= 2^-60), tested on the stored values (exact, as xf_bce_logits_chunk_fast's); else the rule
 * itself in double. */
XF_HD int XF_BIN_FN(xf_bce_prob_chunk_fast)(XF_BIN_FN(xf_bin_blk) b, long long c0, long long len,
                                             const xf_bin_args *a, const int unweighted, const int grad)
{
    const XF_BIN_FN(xf_bin_blk) c = XF_BIN_FN(xf_bin_blk_from)(b, c0);
    const double scale = a->scale, loss_k = a->loss_k;
    const XF_T zero = (XF_T)0.0, one = (XF_T)1.0;
    int all_ok = 1;
    long long j;
    if (unweighted && a->g == 0 && a->g_f32 == 0 && !a->mode.clip && !a->mode.clamp) {
        all_ok = (loss_k == 0.0) && (!grad || xf_bin_bce_fast_grad_ok(1, scale));
#pragma omp simd reduction(& : all_ok)
        for (j = 0; j < len; j++) {
            const XF_T pv = c.x[j], yv = c.t[j];
            all_ok &= XF_BIN_PROB_P_OK(pv) & (pv < one) & (yv >= zero) & (yv <= one) & XF_BIN_FAST_Y_OK(yv);
        }
    } else {
        int redo[XF_BIN_FAST_CHUNK];
        int odd;
        if (grad) {
            odd = unweighted ? XF_BIN_FN(xf_bce_prob_odd)(c, len, a, 1, 1, 1, redo)
                             : XF_BIN_FN(xf_bce_prob_odd)(c, len, a, 0, 1, 1, redo);
        } else {
            odd = unweighted ? XF_BIN_FN(xf_bce_prob_odd)(c, len, a, 1, 1, 0, redo)
                             : XF_BIN_FN(xf_bce_prob_odd)(c, len, a, 0, 1, 0, redo);
        }
        all_ok = (odd == 0);
    }
    return all_ok;
}


/* a chunk that is not all fast: its few odd elements (p = 0 or 1, NaN, a clipped or clamped p, a target
 * outside [0, 1], an extreme weight or upstream factor) redone in the general form after the fast loop,
 * or with more than XF_BIN_REDO_MAX the per-element select, as for the focal loss (xf_focal_mixed) */
XF_BIN_OWN_CODE void XF_BIN_FN(xf_bce_prob_mixed)(XF_BIN_FN(xf_bin_blk) b, long long n, const xf_bin_args *a,
                                                 const int unweighted, double *loss_d, XF_T *loss_o, XF_T *grad)
{
    double loss_general[XF_BIN_FAST_CHUNK], grad_general[XF_BIN_FAST_CHUNK];
    int redo[XF_BIN_FAST_CHUNK];
    const int want_loss = (loss_d || loss_o);
    int odd;
    if (grad) {
        odd = unweighted ? XF_BIN_FN(xf_bce_prob_odd)(b, n, a, 1, want_loss, 1, redo)
                         : XF_BIN_FN(xf_bce_prob_odd)(b, n, a, 0, want_loss, 1, redo);
    } else {
        odd = unweighted ? XF_BIN_FN(xf_bce_prob_odd)(b, n, a, 1, want_loss, 0, redo)
                         : XF_BIN_FN(xf_bce_prob_odd)(b, n, a, 0, want_loss, 0, redo);
    }
    /* `unweighted` a literal in each instance of the body (a condition would make its loads masked) */
    if (odd > XF_BIN_REDO_MAX) {
        if (unweighted) {
            XF_BIN_OUTPUTS(XF_BIN_FN(xf_bce_prob_body), b, n, a, 1, 1);
        } else {
            XF_BIN_OUTPUTS(XF_BIN_FN(xf_bce_prob_body), b, n, a, 0, 1);
        }
        return;
    }
    XF_BIN_FN(xf_bin_redo_before)(b, n, a, XF_BIN_OP_BCE_PROB, unweighted, redo, loss_general, grad_general);
    if (unweighted) {
        XF_BIN_OUTPUTS(XF_BIN_FN(xf_bce_prob_body), b, n, a, 1, 2);
    } else {
        XF_BIN_OUTPUTS(XF_BIN_FN(xf_bce_prob_body), b, n, a, 0, 2);
    }
    XF_BIN_FN(xf_bin_redo_after)(b, n, redo, loss_general, grad_general);
}

/* one out-of-line function per form, as for BCE with logits */
XF_BIN_OWN_CODE void XF_BIN_FN(xf_bce_prob_run)(XF_BIN_FN(xf_bin_blk) c, long long len, const xf_bin_args *a,
                                               const int unweighted, const int fast, double *loss_d, XF_T *loss_o,
                                               XF_T *grad)
{
    if (fast) {
        const long long n = len;
        XF_BIN_FN(xf_bin_blk) b = c;
        if (unweighted) {
            XF_BIN_OUTPUTS(XF_BIN_FN(xf_bce_prob_body), b, n, a, 1, 2);
        } else {
            XF_BIN_OUTPUTS(XF_BIN_FN(xf_bce_prob_body), b, n, a, 0, 2);
        }
    } else {
        long long c0;
        for (c0 = 0; c0 < len; c0 += XF_BIN_FAST_CHUNK) {
            const long long m = (len - c0 < XF_BIN_FAST_CHUNK) ? len - c0 : XF_BIN_FAST_CHUNK;
            XF_BIN_FN(xf_bce_prob_mixed)(XF_BIN_FN(xf_bin_blk_from)(c, c0), m, a, unweighted, loss_d, loss_o,
                                         grad);
        }
    }
}

/* BCE from probabilities over elements [off, off + n) */
XF_KERNEL void XF_BIN_FN(xf_bce_prob_block)(const XF_T *x, const XF_T *t, long long off, long long n,
                                             const xf_bin_args *a, double *loss_d, XF_T *loss_o, XF_T *grad)
{
    double wbuf[XF_BIN_BLOCK], gbuf[XF_BIN_BLOCK];
    double sum_scratch[XF_BIN_BLOCK];
    XF_BIN_FN(xf_bin_blk) b = XF_BIN_FN(xf_bin_blk_make)(x, t, off, a, loss_d, loss_o, grad, sum_scratch);
    loss_d = b.ld; /* from here on only tested for presence: which outputs the instances write */
    b.w = a->w ? xf_bin_gather(a->w, a->w_div, a->w_mod, a->w_full, off, n, wbuf) : wbuf; /* as above */
    b.g = grad ? XF_BIN_FN(xf_bin_upstream_block)(a, off, n, gbuf) : 0;
    double rescued[XF_BIN_BLOCK];
    const int unweighted = (a->w == 0);
    const int stored_before =
        XF_BIN_FN(xf_bin_inf_upstream_before)(b, n, a, unweighted, XF_BIN_OP_BCE_PROB, rescued);
    if (a->loss_k == 0.0) {
        XF_BIN_CHUNK_RUNS(XF_BIN_FN(xf_bce_prob_chunk_fast), XF_BIN_FN(xf_bce_prob_run), unweighted, );
        XF_BIN_CONVERT_LOSS();
    } else if (unweighted) {
        XF_BIN_UNSWITCH(XF_BIN_FN(xf_bce_prob_body), b, n, a, 1, 0);
    } else {
        XF_BIN_UNSWITCH(XF_BIN_FN(xf_bce_prob_body), b, n, a, 0, 0);
    }
    XF_BIN_FN(xf_bin_inf_upstream_after)(b, n, a, unweighted, XF_BIN_OP_BCE_PROB, stored_before, rescued);
    XF_BIN_FN(xf_bin_block_partial)(a, off, n, sum_scratch);
}

/* whether a class of the row has a mass w_c t_c below 2^-969 (xf_bin_ce_tiny_mass) */
XF_HD int XF_BIN_FN(xf_ce_probs_any_tiny_mass)(const XF_T *t, const double *w, long long C)
{
    int any = 0;
    long long j;
    if (w) {
#pragma omp simd reduction(| : any)
        for (j = 0; j < C; j++) {
            any |= xf_bin_ce_tiny_mass(w[j], (double)t[j]);
        }
    } else {
#pragma omp simd reduction(| : any)
        for (j = 0; j < C; j++) {
            any |= xf_bin_ce_tiny_mass(1.0, (double)t[j]);
        }
    }
    return any;
}

/* Cross-entropy from class probabilities, one row of C classes.
 * Index target y (t == NULL): loss w_y (-log p_y), gradient -s w_y / p_y at y and 0 elsewhere.
 * Probability target t: loss sum_c w_c t_c (-log p_c), all terms >= 0, summed with TwoSum compensation
 * (xf_acc_add) in class order; gradient -s w_c t_c / p_c.
 * A NaN anywhere in the row makes its loss and gradient NaN (the softmax family's row policy).  Returns
 * the row loss in double, times 2^loss_k; s is the row's upstream factor. */
XF_KERNEL double XF_BIN_FN(xf_ce_probs_row)(const XF_T *p, long long C, long long y, double w_y, const XF_T *t,
                                         const double *w, double s, const xf_bin_prob_mode *m, double loss_k,
                                         XF_T *grad)
{
    long long j;
    int has_nan = 0;
    for (j = 0; j < C; j++) {
        has_nan |= ((double)p[j] != (double)p[j]);
    }
    if (has_nan) {
        if (grad) {
            for (j = 0; j < C; j++) {
                grad[j] = (XF_T)XF_NAN;
            }
        }
        return XF_NAN;
    }
    if (t == 0) {
        double py = (double)p[y];
        double loss = xf_bin_neg_log_prob_term(py, w_y, 1.0, m, loss_k);
        if (grad) {
            for (j = 0; j < C; j++) {
                grad[j] = (XF_T)0.0;
            }
            grad[y] = (XF_T)xf_bin_neg_log_prob_grad(py, w_y, 1.0, s, m);
        }
        return loss;
    }
    double acc = 0.0, err = 0.0;
    for (j = 0; j < C; j++) {
        double pj = (double)p[j];
        double wc = w ? w[j] : 1.0;
        double tj = (double)t[j];
        xf_acc_add(&acc, &err, xf_bin_neg_log_prob_term(pj, wc, tj, m, loss_k));
        if (grad) {
            grad[j] = (XF_T)xf_bin_neg_log_prob_grad(pj, wc, tj, s, m);
        }
    }
    /* float32 rows round their loss to float32, far above these errors; the masses are looked at only
     * where the sum is tiny (confident rows, p_c = 1: a test in the loop above cost them 4 %) */
    if (sizeof(XF_T) == sizeof(double) && xf_fabs(acc + err) < XF_BIN_TINY_LOSS &&
        XF_BIN_FN(xf_ce_probs_any_tiny_mass)(t, w, C)) {
        double acc2 = 0.0, err2 = 0.0;
        for (j = 0; j < C; j++) {
            xf_acc_add(&acc2, &err2, xf_bin_neg_log_prob_term((double)p[j], w ? w[j] : 1.0, (double)t[j], m,
                                                              loss_k + XF_BIN_TINY_LIFT));
        }
        return xf_bin_ce_tiny_loss(acc2, err2, acc + err);
    }
    return acc + err;
}

#undef XF_BIN_UNSWITCH
#undef XF_BIN_CHUNK_RUNS
#undef XF_BIN_OWN_CODE
#undef XF_BIN_OUTPUTS
#undef XF_BIN_CONVERT_LOSS
#undef XF_BIN_FAST_CHUNK
#undef XF_BIN_PLAIN
#undef XF_BIN_DIVISIONS_APART
#undef XF_BIN_FN
#undef XF_BIN_CAT
#undef XF_BIN_CAT_
