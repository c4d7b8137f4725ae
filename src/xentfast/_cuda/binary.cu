/* xentfast/_cuda/binary.cu: the binary family on the GPU (BCE with logits, sigmoid focal loss, BCE from
 * probabilities: elementwise; cross-entropy from class probabilities: per row), templated on the storage
 * type (float, double).  Compiled at run time by xentfast._cuda through NVRTC with the options of
 * kernels.cu (e) plus -I for _core (binary_kernels.h), and at CI time by nvcc (tests/test_cuda.py).
 *
 * Design
 * (a) One formula.  Every number comes from the functions the CPU kernels use: xentfast/binary.h (the
 *     arithmetic) and _core/binary_kernels.h (xf_bin_args, xf_bin_prob_mode_init, the per-type stores),
 *     included unchanged.  What this file restates are the loop bodies of binary_blocks.h (each element
 *     loop one element per call, the loops of xf_ce_probs_row split over a team, (d); marked "as
 *     binary_blocks.h: <function>") and the row driver of _binary.pyx: so the GPU gives the CPU's bits.
 *     tests/test_cuda.py runs this very file on the CPU (host model, (e)) against
 *     xentfast._core._binary.
 * (b) No gather buffers.  The CPU block functions gather broadcast weights into 8 KiB stack buffers
 *     (wbuf[XF_BIN_BLOCK]); here element i reads w[(i / div) % mod] directly (the value the gather would
 *     have copied; div = 1, mod = n is the full-size weight).  The block functions are never called on
 *     the device, so their buffers never reach a stack frame.
 * (c) Elementwise kernels: a grid-stride loop, one element per thread per iteration, consecutive
 *     threads on consecutive elements (coalesced).  An element reads x[i] and t[i] before writing
 *     grad[i], so the gradient may overwrite the input (inplace), as on the CPU.  One kernel per
 *     (storage type, op): the op is a template parameter, so each kernel holds one formula.
 * (d) CE from class probabilities: a warp per row (a "team" of 32 threads, XF_CU_CE_ROWS rows per CUDA
 *     block, grid-stride over rows), restating the loop bodies of binary_blocks.h xf_ce_probs_row.  The
 *     NaN scan is an OR (any order), the gradient is elementwise, and the expensive part of the loss,
 *     the terms (a log each), are computed by all lanes into a chunk of XF_CU_CE_CHUNK shared doubles;
 *     lane 0 then adds the chunk in class order with xf_acc_add, as the CPU's single chain does.  So the
 *     bits are the CPU's, coalesced loads, and only the TwoSum chain (a few flops per class) is serial.
 *     Steps are separated by __syncwarp (team.step); what crosses a step lives in the team's shared
 *     scratch.  The gradient step comes after every read of the row, so it may overwrite p (inplace).
 *     What stays slow: the chain is C dependent TwoSum steps per row (for few rows of ~10^5 classes it
 *     dominates), and a team of 32 idles on rows of a few classes.
 * (e) Host model: with XF_CUDA == 0 (g++) the __global__ wrappers disappear and the per-element and
 *     per-row functions below run on the CPU (tests/cuda_model/binary_model.cpp), elements and rows in
 *     any order, a team's threads one at a time in any order (as kernels.cu (f)).
 * (f) No flush to zero, no contraction (kernels.cu (e)): the #error below refuses a build with FTZ on.
 */
#include "binary_kernels.h"

#if defined(__CUDA_FTZ) && __CUDA_FTZ
#error "xentfast kernels must be compiled with -ftz=false (CuPy's compile path appends -ftz=true; see kernels.cu (e))"
#endif

/* the ops, as _binary.pyx OP_* */
#define XF_CU_OP_BCE_LOGITS 0
#define XF_CU_OP_FOCAL 1
#define XF_CU_OP_BCE_PROB 2

/* ---- per storage type: the stores and the row function of binary_blocks.h ----------------------------- */

/* as binary_blocks.h: the loss stores of the element loops (an ignored element's loss is 0) */
template <typename T>
XF_HD void xf_cu_bin_store(double v, int ign, long long j, double *loss_d, T *loss_o)
{
    v = ign ? 0.0 : v;
    if (loss_d) {
        loss_d[j] = v;
    }
    if (loss_o) {
        loss_o[j] = (T)v;
    }
}

/* ---- elementwise -------------------------------------------------------------------------------------- */

/* the weight of element i: what xf_bin_gather would have read (b); a full-size weight (div = 1, mod = n)
 * skips the 64-bit divisions, with the same value */
XF_HD double xf_cu_bin_weight(const double *w, long long div, long long mod, int full, long long i)
{
    return w ? w[full ? i : (i / div) % mod] : 1.0;
}

/* the upstream factor of element i (binary_blocks.h: XF_BIN_UPSTREAM) */
XF_HD double xf_cu_bin_upstream(const xf_bin_args *a, long long i) { return a->g ? a->scale * a->g[i] : a->scale; }

/* The focal loss's general form for one element. */
template <typename T>
XF_HD void xf_cu_focal_general(double xv, double y, int ign, long long i, const xf_bin_args *a, double s,
                               double *loss_d, T *loss_o, T *grad)
{
    const xf_bin_logit p = xf_bin_logit_pieces(xv);
    const xf_bin_focal_parts f = xf_bin_focal_prepare(p, y, a->alpha, a->gamma);
    if (loss_d || loss_o) {
        xf_cu_bin_store(xf_bin_focal_loss(p, f, a->gamma, a->loss_k), ign, i, loss_d, loss_o);
    }
    if (grad) {
        grad[i] = (T)(ign ? 0.0 : xf_bin_focal_grad(p, f, y, a->gamma, s));
    }
}

/* The same out of line, for the float kernel, where it runs beside the fast form: inlined there, the two
 * forms' values shared the kernel's registers and spilled at its 128 (the double kernel, general form
 * only, keeps it inline). */
template <typename T>
XF_HD_COLD void xf_cu_focal_general_apart(double xv, double y, int ign, long long i, const xf_bin_args *a,
                                          double s, double *loss_d, T *loss_o, T *grad)
{
    xf_cu_focal_general(xv, y, ign, i, a, s, loss_d, loss_o, grad);
}

/* Element i of op OP: the loss into loss_d / loss_o and the gradient into grad, each when not NULL. */
template <typename T, int OP>
XF_HD void xf_cu_bin_elem(const T *x, const T *t, long long i, const xf_bin_args *a, double *loss_d, T *loss_o,
                          T *grad)
{
    const double xv = (double)x[i];
    const double y = (double)t[i];
    const int ign = a->has_ignore && y == a->ignore;
    if (OP == XF_CU_OP_BCE_LOGITS) {
        /* as binary_blocks.h: xf_bce_logits_block */
        const double w = xf_cu_bin_weight(a->w, a->w_div, a->w_mod, a->w_full, i);
        const double q = xf_cu_bin_weight(a->pw, a->pw_div, a->pw_mod, a->pw_full, i);
        const double s = grad ? xf_cu_bin_upstream(a, i) : 1.0;
        /* the storage type's fast form (binary.h) for each output that qualifies, as the CPU picks it */
        const int f32 = sizeof(T) == sizeof(float);
        const int fast = f32 ? xf_bin_bce_fast_ok(xv, y, w, q, a->loss_k)
                             : xf_bin_bce_fast64_ok(xv, y, w, q, a->loss_k);
        const int fast_g = xf_bin_bce_fast_grad_ok(fast, s);
        xf_bin_fast_logit f;
        xf_bin_fast64_logit f64;
        xf_bin_logit p;
        if (fast) {
            if (f32) {
                f = xf_bin_fast_pieces(xv);
            } else {
                f64 = xf_bin_fast64_pieces(xv);
            }
        }
        if (!fast || (grad && !fast_g)) {
            p = xf_bin_logit_pieces(xv);
        }
        if (loss_d || loss_o) {
            double v = !fast ? xf_bin_bce_logits_loss(p, y, w, q, a->loss_k)
                       : f32 ? xf_bin_bce_fast_loss(f, y, w, q)
                             : xf_bin_bce_fast64_loss(f64, y, w, q);
            xf_cu_bin_store(v, ign, i, loss_d, loss_o);
        }
        if (grad) {
            /* an infinite upstream factor is never fast_g (|s| lies within [2^-60, 2^60] there) */
            double g = xf_bin_upstream_is_inf(s) ? xf_bin_bce_logits_grad_inf(p, y, w, q, s)
                       : !fast_g ? xf_bin_bce_logits_grad(p, y, w, q, s)
                       : f32     ? xf_bin_bce_fast_grad(f, y, w, q, s)
                                 : xf_bin_bce_fast64_grad(f64, y, w, q, s);
            grad[i] = (T)(ign ? 0.0 : g);
        }
    } else if (OP == XF_CU_OP_FOCAL) {
        /* as binary_blocks.h: xf_focal_block (float32 storage: the plain-double form where it qualifies;
         * the general form out of line there, see xf_cu_focal_general_apart) */
        const double s = grad ? xf_cu_bin_upstream(a, i) : 1.0;
        const int fast = sizeof(T) == sizeof(float) && xf_bin_focal_fast_ok(xv, y, a->gamma, a->loss_k);
        const int fast_g = xf_bin_bce_fast_grad_ok(fast, s);
        if (fast) {
            const xf_bin_fast_logit fp = xf_bin_fast_pieces(xv);
            const xf_bin_focal_fast_parts r = xf_bin_focal_fast_prepare(fp, y, a->alpha, a->gamma);
            if (loss_d || loss_o) {
                xf_cu_bin_store(xf_bin_focal_fast_loss(r), ign, i, loss_d, loss_o);
            }
            if (grad && fast_g) {
                grad[i] = (T)(ign ? 0.0 : xf_bin_focal_fast_grad(fp, r, y, a->gamma, s));
            }
        }
        if (!fast || (grad && !fast_g)) {
            if (sizeof(T) == sizeof(float)) {
                xf_cu_focal_general_apart(xv, y, ign, i, a, s, fast ? 0 : loss_d, fast ? 0 : loss_o, grad);
            } else {
                xf_cu_focal_general(xv, y, ign, i, a, s, loss_d, loss_o, grad);
            }
        }
    } else {
        /* as binary_blocks.h: xf_bce_prob_block (xv is the probability; the storage type's fast form for each
         * output that qualifies, as the CPU picks it) */
        const double w = xf_cu_bin_weight(a->w, a->w_div, a->w_mod, a->w_full, i);
        const double s = grad ? xf_cu_bin_upstream(a, i) : 1.0;
        const int f32 = sizeof(T) == sizeof(float);
        const int fast = f32 ? xf_bin_bce_prob_fast_ok(xv, y, w, &a->mode, a->loss_k)
                             : xf_bin_bce_prob_fast64_ok(xv, y, w, &a->mode, a->loss_k);
        const int fast_g = xf_bin_bce_fast_grad_ok(fast, s);
        xf_bin_prob_fast f;
        xf_bin_prob_fast64 f64;
        if (fast) {
            if (f32) {
                f = xf_bin_prob_fast_pieces(xv);
            } else {
                f64 = xf_bin_prob_fast64_pieces(xv);
            }
        }
        if (loss_d || loss_o) {
            const double v = !fast ? xf_bin_bce_prob_loss(xv, y, w, &a->mode, a->loss_k)
                             : f32 ? xf_bin_bce_prob_fast_loss(f, y, w)
                                   : xf_bin_bce_prob_fast64_loss(f64, y, w);
            xf_cu_bin_store(v, ign, i, loss_d, loss_o);
        }
        if (grad) {
            /* an infinite upstream factor is never fast_g (|s| lies within [2^-60, 2^60] there) */
            double g = xf_bin_upstream_is_inf(s) ? xf_bin_bce_prob_grad_inf(xv, y, w, s, &a->mode)
                       : !fast_g                 ? xf_bin_bce_prob_grad(xv, y, w, s, &a->mode)
                       : f32                     ? xf_bin_bce_prob_fast_grad(f, xv, y, w, s)
                                                 : xf_bin_bce_prob_fast64_grad(f64, xv, y, w, s);
            grad[i] = (T)(ign ? 0.0 : g);
        }
    }
}

/* The arguments of one call, as _binary.pyx: elementwise fills them (n: the element count). */
XF_HD void xf_cu_bin_args_init(xf_bin_args *a, long long n, const double *w, long long w_div, long long w_mod,
                               const double *pw, long long pw_div, long long pw_mod, const double *g, double scale,
                               int has_ignore, double ignore, double alpha, double gamma, int clip, double eps,
                               int clamp, double log_clamp, double clamp_lo, double clamp_hi, double loss_k)
{
    a->w = w;
    a->w_div = w_div;
    a->w_mod = w_mod;
    a->w_full = (w != 0) && w_div == 1 && w_mod == n;
    a->pw = pw;
    a->pw_div = pw_div;
    a->pw_mod = pw_mod;
    a->pw_full = (pw != 0) && pw_div == 1 && pw_mod == n;
    a->g = g;
    a->g_f32 = 0; /* the device front end hands its upstream factors over in double */
    a->scale = scale;
    a->has_ignore = has_ignore;
    a->ignore = ignore;
    a->alpha = alpha;
    a->gamma = gamma;
    a->loss_k = loss_k;
    a->part = 0; /* the reduction sums loss_d (reduce.cu); the CPU's in-block partials are not used here */
    a->unit_fail = 0; /* the device front end checks the targets before the kernels run */
    xf_bin_prob_mode_init(&a->mode, clip, eps, clamp, log_clamp, clamp_lo, clamp_hi);
}

/* ---- cross-entropy from class probabilities ----------------------------------------------------------- */

#define XF_CU_CE_CHUNK 256 /* terms per chunk of the loss sum (d) */
#define XF_CU_CE_TEAM 32   /* threads per row: a warp */
#define XF_CU_CE_ROWS 4    /* rows (teams) per CUDA block */

/* A row team's shared state; nothing in it survives from one row to the next. */
typedef struct {
    double term[XF_CU_CE_CHUNK];
    double acc, err, loss, g_y;
    int nan_part[XF_CU_CE_TEAM];
    int has_nan;
    int tiny; /* rows whose loss is tiny (binary.h, xf_bin_ce_tiny_mass) */
} xf_cu_ce_scratch;

/* The row's terms w_c t_c (-log p_c) 2^k summed into sc->acc, sc->err (from 0) in class order, as the
 * CPU's chain */
template <typename T, typename Team>
XF_HD void xf_cu_ce_probs_sum(const Team &team, const T *p, long long C, const T *t, const double *w,
                              const xf_bin_prob_mode *m, double k, xf_cu_ce_scratch *sc)
{
    const int nt = team.nt;
    for (long long c0 = 0; c0 < C; c0 += XF_CU_CE_CHUNK) {
        const long long cn = (C - c0 < XF_CU_CE_CHUNK) ? C - c0 : XF_CU_CE_CHUNK;
        team.step([&](int tid) {
            for (long long q = tid; q < cn; q += nt) {
                const long long j = c0 + q;
                sc->term[q] = xf_bin_neg_log_prob_term((double)p[j], w ? w[j] : 1.0, (double)t[j], m, k);
            }
        });
        team.step([&](int tid) {
            if (tid == 0) { /* class order, as the CPU's chain */
                for (long long q = 0; q < cn; q++) {
                    xf_acc_add(&sc->acc, &sc->err, sc->term[q]);
                }
            }
        });
    }
}

/* Row i: loss[i] and, when grad, the gradient row (as _binary.pyx: _ce_probs_one_row, then as
 * binary_blocks.h: xf_ce_probs_row, by a team of team.nt <= XF_CU_CE_TEAM threads, see (d)). */
template <typename T, typename Team>
XF_HD void xf_cu_ce_probs_row(const Team &team, const T *p_all, long long C, long long i, const long long *y,
                              long long ignore_index, const T *t_all, const double *w, const double *row_scale,
                              double scale, const xf_bin_prob_mode *m, double loss_k, double *loss, T *grad,
                              xf_cu_ce_scratch *sc)
{
    const int nt = team.nt;
    const T *p = p_all + i * C;
    T *gr = grad ? grad + i * C : (T *)0;
    long long yi = -1;
    double w_y = 1.0;
    double s = scale;
    if (y) {
        yi = y[i];
        if (yi == ignore_index) {
            team.step([&](int tid) {
                if (tid == 0) {
                    loss[i] = 0.0;
                }
                if (gr) {
                    for (long long j = tid; j < C; j += nt) {
                        gr[j] = (T)0.0;
                    }
                }
            });
            return;
        }
        if (w) {
            w_y = w[yi];
        }
    }
    if (row_scale) {
        s = s * row_scale[i];
    }
    const T *t = t_all ? t_all + i * C : (const T *)0;
    /* the NaN scan: an OR, in any order */
    team.step([&](int tid) {
        int f = 0;
        for (long long j = tid; j < C; j += nt) {
            f |= ((double)p[j] != (double)p[j]);
        }
        sc->nan_part[tid] = f;
    });
    team.step([&](int tid) {
        if (tid == 0) {
            int f = 0;
            for (int k = 0; k < nt; k++) {
                f |= sc->nan_part[k];
            }
            sc->has_nan = f;
            sc->acc = 0.0;
            sc->err = 0.0;
            if (!f && !t) { /* index target: one term, one gradient entry */
                double py = (double)p[yi];
                sc->loss = xf_bin_neg_log_prob_term(py, w_y, 1.0, m, loss_k);
                sc->g_y = xf_bin_neg_log_prob_grad(py, w_y, 1.0, s, m);
            }
        }
    });
    if (sc->has_nan) { /* uniform: read by every thread after the step */
        team.step([&](int tid) {
            if (tid == 0) {
                loss[i] = XF_NAN;
            }
            if (gr) {
                for (long long j = tid; j < C; j += nt) {
                    gr[j] = (T)XF_NAN;
                }
            }
        });
        return;
    }
    if (!t) {
        team.step([&](int tid) {
            if (tid == 0) {
                loss[i] = sc->loss;
            }
            if (gr) {
                for (long long j = tid; j < C; j += nt) {
                    gr[j] = (j == yi) ? (T)sc->g_y : (T)0.0;
                }
            }
        });
        return;
    }
    xf_cu_ce_probs_sum(team, p, C, t, w, m, loss_k, sc);
    team.step([&](int tid) {
        if (tid == 0) {
            /* float32 rows round their loss to float32, far above these errors (and their kernel
             * spilled with the second sum compiled in) */
            int tiny = 0;
            if (sizeof(T) == sizeof(double) && xf_fabs(sc->acc + sc->err) < XF_BIN_TINY_LOSS) {
                /* rare rows: their masses looked at only here, as the CPU's */
                for (long long j = 0; j < C && !tiny; j++) {
                    tiny = xf_bin_ce_tiny_mass(w ? w[j] : 1.0, (double)t[j]);
                }
            }
            sc->tiny = tiny;
            sc->loss = sc->acc + sc->err;
            sc->acc = 0.0;
            sc->err = 0.0;
        }
    });
    if (sizeof(T) == sizeof(double) && sc->tiny) { /* uniform: read by every thread after the step */
        xf_cu_ce_probs_sum(team, p, C, t, w, m, loss_k + XF_BIN_TINY_LIFT, sc);
        team.step([&](int tid) {
            if (tid == 0) {
                sc->loss = xf_bin_ce_tiny_loss(sc->acc, sc->err, sc->loss);
            }
        });
    }
    team.step([&](int tid) {
        if (tid == 0) {
            loss[i] = sc->loss;
        }
        if (gr) {
            for (long long j = tid; j < C; j += nt) {
                gr[j] = (T)xf_bin_neg_log_prob_grad((double)p[j], w ? w[j] : 1.0, (double)t[j], s, m);
            }
        }
    });
}

/* ---- CUDA entry points -------------------------------------------------------------------------------- */
#if XF_CUDA

/* One elementwise pass, as _binary.elementwise (absent arrays are NULL; weights w[(i / div) % mod]). */
template <typename T, int OP>
__global__ void xf_bin_elementwise_kernel(const T *x, const T *t, const double *w, long long w_div, long long w_mod,
                                          const double *pw, long long pw_div, long long pw_mod, const double *g,
                                          double scale, int has_ignore, double ignore, double alpha, double gamma,
                                          int clip, double eps, int clamp, double log_clamp, double clamp_lo,
                                          double clamp_hi, double *loss_d, T *loss_o, T *grad, long long n,
                                          double loss_k)
{
    xf_bin_args a;
    xf_cu_bin_args_init(&a, n, w, w_div, w_mod, pw, pw_div, pw_mod, g, scale, has_ignore, ignore, alpha, gamma,
                        clip, eps, clamp, log_clamp, clamp_lo, clamp_hi, loss_k);
    for (long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x; i < n;
         i += (long long)gridDim.x * blockDim.x) {
        xf_cu_bin_elem<T, OP>(x, t, i, &a, loss_d, loss_o, grad);
    }
}

struct xf_cu_warp_team {
    int tid, nt;
    template <class F>
    __device__ __forceinline__ void step(F &&f) const
    {
        f(tid);
        __syncwarp();
    }
};

/* Row losses (and the gradient) of CE from class probabilities, as _binary.ce_probs: a warp per row (d),
 * blockDim = XF_CU_CE_TEAM * XF_CU_CE_ROWS, grid-stride over rows. */
template <typename T>
__global__ void __launch_bounds__(XF_CU_CE_TEAM * XF_CU_CE_ROWS)
xf_ce_probs_kernel(const T *p, const long long *y, const T *t, const double *w, long long ignore_index,
                   const double *row_scale, double scale, int clip, double eps, double *loss, T *grad, long long N,
                   long long C, double loss_k)
{
    __shared__ xf_cu_ce_scratch scratch[XF_CU_CE_ROWS];
    const int team_id = (int)threadIdx.x / XF_CU_CE_TEAM;
    const xf_cu_warp_team team = {(int)threadIdx.x % XF_CU_CE_TEAM, XF_CU_CE_TEAM};
    xf_bin_prob_mode m;
    xf_bin_prob_mode_init(&m, clip, eps, 0, 0.0, 0.0, 1.0);
    for (long long i = (long long)blockIdx.x * XF_CU_CE_ROWS + team_id; i < N;
         i += (long long)gridDim.x * XF_CU_CE_ROWS) {
        xf_cu_ce_probs_row(team, p, C, i, y, ignore_index, t, w, row_scale, scale, &m, loss_k, loss, grad,
                           &scratch[team_id]);
        __syncwarp(); /* the next row's first step rewrites the scratch */
    }
}

#endif /* XF_CUDA */
