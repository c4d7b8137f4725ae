/* xentfast/_cuda/kernels.cu: the softmax family on the GPU (cross-entropy fused loss + gradient,
 * forward only, log_softmax, softmax, logsumexp), templated on the storage type (float, double).
 *
 * Compiled at run time by xentfast._cuda through NVRTC with "-std=c++17 -I<include> -I<_core>
 * --fmad=false -ftz=false --maxrregcount=128 -DXF_CU_XENT_MIN_BLOCKS=2" (see (e) and XF_CU_XENT_MIN_BLOCKS
 * below), and at CI time by nvcc (tests/test_cuda.py).
 *
 * Design
 * (a) One formula.  Every number is computed by the functions the CPU kernels use: the shared header
 *     xentfast/numerics.h (exp, log1p, TwoSum, double-double) and the per-row bookkeeping of
 *     xentfast/softmax_row.h (xf_rowjob_init / set_max / set_sum / rescue_wanted / rescue_finish /
 *     finish, xf_rescue_lane, xf_row_target_q, xf_target_grad, xf_lanes_to_dd, xf_terms_merge,
 *     xf_exp_minus_f32/f64), included unchanged.  What this file restates are only the loop bodies of
 *     softmax_rows.h (which are host block loops and cannot be called per element); each is marked
 *     "as softmax_rows.h: <function>".
 *     That includes the CPU's softmax output path (its sum pass keeps exp(x_j - m) in the output
 *     buffer, rounded to the storage type): the GPU recomputes the exponential instead of storing it,
 *     and rounds it the same way, so the outputs keep the CPU's bits without the extra traffic.  (The
 *     CPU's cross-entropy gradient keeps its exponentials as doubles, which recomputing reproduces.)
 *     tests/test_cuda.py runs this very file on the CPU (host model, (f)) against the CPU kernels, so
 *     a restated body that drifts from the CPU one fails the normal test suite.
 * (b) A CUDA block per row (grid-stride over rows), blockDim = nt, a power of two in [32, 512] chosen
 *     by the launcher; nt = 32 is the "warp per row" of short rows.  A row's life is a fixed sequence
 *     of steps separated by __syncthreads(); state that crosses a step lives in shared memory only.
 * (c) Reduction order: the CPU's, exactly.  The CPU cuts a row into blocks of XF_BLOCK = 4096
 *     classes; inside a block, element j feeds lane j % XF_LANES (8 lanes) in increasing j, each lane a
 *     sequential (TwoSum-compensated for float64) sum; lanes merge by xf_lanes_to_dd's fixed tree,
 *     blocks by xf_dd_add in block order.  Here one thread owns one (block, lane) chain and walks it in
 *     the same increasing order, a thread per block then runs xf_lanes_to_dd, and thread 0 merges the
 *     blocks in order: every floating-point operation of the CPU sum happens here with the same
 *     operands in the same order, so the sums (and everything after them) have the CPU's bits, for
 *     every nt.  The price: the sum steps run 8 * ceil(C / 4096) sequential chains (256 for C = 128256),
 *     not nt * (elements / nt) free ones; the max and elementwise steps use all nt threads.
 *     A warp's loads in a chain step read 32-byte runs (8 floats / 4 doubles of one block-lane
 *     group), whole sectors, so the chain layout costs no DRAM bandwidth, only parallelism.
 * (d) The max step needs no order: max, counts and min are exact in any order, and the argmax is the
 *     first index attaining the max (ties broken by index), as the CPU's block merge gives.  Only the
 *     sign of a zero max may differ from the CPU's, which no output can see (x - m and m + log S
 *     absorb it).
 * (e) No flush to zero, no contraction.  CuPy's own compile path appends -ftz=true after the caller's
 *     options and NVRTC honours the last one: float32 logits would load through cvt.ftz.f64.f32
 *     (subnormal inputs read as 0) and float results below 2^-126 would store as 0.  xentfast compiles
 *     through NVRTC itself with -ftz=false and loads the cubin into a cupy.RawModule; the #error below
 *     refuses any build with FTZ on.  --fmad=false keeps every a*b+c two roundings, as -ffp-contract=off does
 *     on the CPU; the only fused multiply-adds are the header's explicit xf_fma (__fma_rn, the exponentials'
 *     polynomials and range reductions), which the CPU rounds once too (tests/test_cuda.py: with xf_fma
 *     emulated, the PTX holds no fma.rn).
 * (f) Host model: with XF_CUDA == 0 (g++), the __global__ wrappers disappear and the row drivers below
 *     run with a "team" whose step(f) calls f(tid) for tid = 0 .. nt-1 in turn: a faithful execution
 *     of the block, since steps communicate only through the shared scratch across barriers.
 * (g) XF_CU_TREE_ORDER=1 (xentfast._cuda: XENTFAST_CUDA_ORDER=tree) swaps (c) for the order a GPU
 *     kernel would pick on its own: each thread sums its strided elements j = tid, tid + nt, ..., and
 *     the nt partials merge in a halving tree.  Every step then uses all threads, but the bits depend
 *     on nt and may differ from the CPU's.  It exists to measure what (c) costs (benchmarks) and how
 *     often the bits differ (tests/test_cuda.py, host model); it is not the default.
 * (h) Left out (not yet written): split rows for few rows of hundreds of thousands of classes (a row
 *     is limited by shared memory to ~3.2M classes), a float32-native arithmetic path.  The binary
 *     family lives in binary.cu, the reductions (dd_sum, the `mean` denominator) in reduce.cu.  Rows stream from global memory three times (max, sum, gradient);
 *     cache_row = 1 keeps a row in shared memory instead when it fits (same bits); the launcher does so
 *     by default for rows of at most 16 KB, where that was measured faster (xentfast._cuda).
 */
#include "xentfast/softmax_row.h"

#if defined(__CUDA_FTZ) && __CUDA_FTZ
#error "xentfast kernels must be compiled with -ftz=false (CuPy's compile path appends -ftz=true; see (e))"
#endif

#define XF_CU_MAX_THREADS 512
/* Blocks of XF_CU_MAX_THREADS threads that xf_softmax_xent_kernel must fit on one multiprocessor.  2 holds
 * it to 64 registers, so 4 blocks of 256 threads fit (32 warps), at the price of a 24-28 byte spill; 1 let
 * ptxas take 72 registers, spill-free, and only 3 blocks fit (1 of 512 threads).  The row's steps wait on
 * memory and on the thread that merges the blocks, so resident warps pay more than the spill costs: on
 * an H200 (benchmarks/README.md, GPU) 8192x128256 float32 took 11.6 ms against 20.1 (13.8 in an
 * earlier run), 32768x32000 14.7 against 21.0 (17.3).  xentfast._cuda passes it on every build
 * (XENTFAST_CUDA_XENT_MIN_BLOCKS); the default here is for the compile checks. */
#ifndef XF_CU_XENT_MIN_BLOCKS
#define XF_CU_XENT_MIN_BLOCKS 2
#endif
/* 0: the CPU's summation order, same bits (c), the default.  1: the counterfactual of (g). */
#ifndef XF_CU_TREE_ORDER
#define XF_CU_TREE_ORDER 0
#endif
#define XF_CU_NO_INDEX 0x7fffffffffffffffLL

/* ---- storage type ------------------------------------------------------------------------------------ */

XF_HD double xf_cu_load(float v) { return (double)v; }
XF_HD double xf_cu_load(double v) { return v; }
XF_HD void xf_cu_store(float *p, double v) { *p = (float)v; }
XF_HD void xf_cu_store(double *p, double v) { *p = v; }
/* log_softmax's entry by storage type, as softmax_rows.h xf_log_softmax_block: float entries in plain
 * double (numerics.h xf_log_prob_single), double ones with x - m carried exactly */
XF_HD double xf_cu_log_prob(float x, double m, double log_s) { return xf_log_prob_single((double)x, m, log_s); }
XF_HD double xf_cu_log_prob(double x, double m, double log_s) { return xf_log_prob(x, m, log_s); }

/* The logsumexp of a row where m and log S cancel (xentfast/softmax_row.h xf_rowjob_lse_cancels):
 * recomputed at rising precision, as the CPU's xf_rowjob_exact_lse_f32/_f64 do.  On the GPU this runs
 * in its own kernel, xf_lse_exact_kernel, on the rows the family kernel flagged: the fixed-point path's
 * limb arrays and registers would otherwise weigh on every row of the hot kernel (spills). */
/* No bound on |D| here (the flagged rows' fast lse is not kept): the double-double step runs, and fails,
 * on the rows the CPU lets skip it, so the results are the same bits. */
XF_HD double xf_cu_lse_cancelling(const float *x, long long C) { return xf_lse_cancelling(x, 0, C, 1, XF_INF); }
XF_HD double xf_cu_lse_cancelling(const double *x, long long C) { return xf_lse_cancelling(0, x, C, 0, XF_INF); }

/* softmax_rows.h xf_row_z_lse, for the thread that finishes a row.  Level 1 is a few dozen operations
 * and runs in the row kernel.  The rest (the exact logsumexp where m + log S cancels, level 2 where
 * A + 2 z r lse cancels) would weigh on every row of the row kernel as xf_lse_cancelling does on the
 * family kernel (calls, local arrays, spills), so the row kernel (ZX = 0) only flags such rows
 * (job->z_exact) and leaves their gradient unwritten; xf_xent_z_exact_kernel then redoes each flagged
 * row whole with ZX = 1.  Same bits as the CPU, which does it all in one pass (both through
 * xf_rowjob_z_lse_row). */
XF_HD_COLD void xf_cu_z_exact(xf_rowjob *job, const float *x, long long C, const float *t, const double *w,
                             double *terms)
{
    xf_rowjob_z_lse_row(job, x, 0, t, 0, w, C, xf_rowjob_lse_cancels(job) ? xf_cu_lse_cancelling(x, C) : 0.0, terms);
}
XF_HD_COLD void xf_cu_z_exact(xf_rowjob *job, const double *x, long long C, const double *t, const double *w,
                             double *terms)
{
    xf_rowjob_z_lse_row(job, 0, x, 0, t, w, C, xf_rowjob_lse_cancels(job) ? xf_cu_lse_cancelling(x, C) : 0.0, terms);
}

/* float64 rows whose loss sum is tiny: summed again 2^1200 larger (xentfast/softmax_row.h); float32 rows
 * round their loss to float32 and keep the first sum */
XF_HD_COLD void xf_cu_tiny_loss(const xf_rowjob *job, const double *x, long long C, const double *t, const double *w,
                                double *terms)
{
    xf_rowjob_tiny_loss_row(job, x, t, w, C, terms);
}
XF_HD void xf_cu_tiny_loss(const xf_rowjob *, const float *, long long, const float *, const double *, double *) {}

template <int ZX, typename T>
XF_HD void xf_cu_row_z_lse(xf_rowjob *job, const T *x, long long C, const T *t, const double *w, double *terms)
{
    job->z_exact = 0;
    if (job->z == 0.0 || job->status != XF_ROW_OK) {
        return;
    }
    if (ZX) {
        xf_cu_z_exact(job, x, C, t, w, terms);
        return;
    }
    int cancels = xf_rowjob_lse_cancels(job);
    xf_rowjob_z_lse(job, job->lse); /* a placeholder where cancels: the row is flagged */
    job->z_exact = cancels || xf_rowjob_z_cancels(job, terms, sizeof(T) == sizeof(float));
}

/* exp(x - m) as the CPU's storage type sees it (softmax_rows.h xf_exp_minus, instantiated per type) */
XF_HD double xf_cu_exp_minus(float x, double m) { return xf_exp_minus_f32(x, m); }
XF_HD double xf_cu_exp_minus(double x, double m) { return xf_exp_minus_f64(x, m); }

/* one step of a lane sum: plain double for float data, TwoSum-compensated for double (softmax_rows.h (c)) */
XF_HD void xf_cu_lane_add(const float *, double *acc, double *cmp, double e)
{
    (void)cmp;
    *acc += e;
}
XF_HD void xf_cu_lane_add(const double *, double *acc, double *cmp, double e) { xf_acc_add(acc, cmp, e); }

/* the scaled gradient exists for float64 only (#if XF_COMPENSATED on the CPU), as does the rescue below */
XF_HD int xf_cu_grad_scaled(const xf_rowjob *job, const float *) { (void)job; return 0; }
XF_HD int xf_cu_grad_scaled(const xf_rowjob *job, const double *) { return job->grad_scaled; }

/* ---- shared scratch ---------------------------------------------------------------------------------- */

/* One row's shared state.  part (the max tree, nt entries) and chain (4 doubles per (block, lane) chain)
 * are never live at the same time and share storage; blk holds 4 doubles per block; xs the cached row. */
typedef struct {
    xf_rowjob *job;
    xf_rowmax *part;
    double *chain;
    double *blk;
    void *xs;
} xf_cu_scratch;

XF_HD long long xf_cu_nblocks(long long C) { return (C + XF_BLOCK - 1) / XF_BLOCK; }

/* Size in doubles of the dynamic scratch before the cached row; xentfast._cuda.smem_bytes mirrors it. */
XF_HD long long xf_cu_scratch_doubles(int nt, long long C)
{
    long long nb = xf_cu_nblocks(C);
    long long part = (long long)nt * (long long)(sizeof(xf_rowmax) / sizeof(double));
    long long chain = 4 * XF_LANES * nb;
    return (part > chain ? part : chain) + 4 * nb;
}

XF_HD xf_cu_scratch xf_cu_scratch_layout(double *smem, xf_rowjob *job, int nt, long long C)
{
    xf_cu_scratch sc;
    long long nb = xf_cu_nblocks(C);
    long long total = xf_cu_scratch_doubles(nt, C);
    sc.job = job;
    sc.part = (xf_rowmax *)smem;
    sc.chain = smem;
    sc.blk = smem + (total - 4 * nb);
    sc.xs = (void *)(smem + total);
    return sc;
}

/* ---- the steps of a row -------------------------------------------------------------------------------- */

/* The float64 tiny-sum rescue (softmax_row.h, xf_rowjob_rescue_tiny_sum): a lane per thread into the
 * scratch's chain storage, free once the sum is set, then one thread adds the lanes in order.  After a
 * step, so every thread reads the same job and takes the same branch. */
template <typename Team>
XF_HD void xf_cu_rescue(const Team &, const xf_cu_scratch &, const float *, long long)
{
}
template <typename Team>
XF_HD void xf_cu_rescue(const Team &team, const xf_cu_scratch &sc, const double *x, long long C)
{
    if (!xf_rowjob_rescue_wanted(sc.job)) {
        return;
    }
    double *acc = sc.chain, *err = sc.chain + XF_RESCUE_LANES, *sub = sc.chain + 2 * XF_RESCUE_LANES;
    team.step([&](int tid) {
        for (int k = tid; k < XF_RESCUE_LANES; k += team.nt) {
            xf_rescue_lane(x, C, sc.job->m, sc.job->argmax, k, &acc[k], &err[k], &sub[k]);
        }
    });
    team.step([&](int tid) {
        if (tid == 0) {
            xf_rowjob_rescue_finish(sc.job, acc, err, sub);
        }
    });
}

/* Merge max-tree partials; b covers other indices than a, in any interleaving, so ties go to the
 * smaller index (d). */
XF_HD void xf_cu_rowmax_merge(xf_rowmax *a, const xf_rowmax *b)
{
    if (b->m > a->m || (b->m == a->m && b->argmax < a->argmax)) {
        a->m = b->m;
        a->argmax = b->argmax;
    }
    a->n_nan += b->n_nan;
    a->n_finite += b->n_finite;
    a->min_finite = (b->min_finite < a->min_finite) ? b->min_finite : a->min_finite;
}

typedef struct {
    long long y;
    double w_y, eps, z, scale, loss_scale;
    int prob;
    int has_grad; /* for xf_rowjob_plan; -1: a softmax-family row, which the CPU does not plan */
} xf_cu_jobspec;

/* Steps 1-2: the row statistics (max pass, sum of exponentials), leaving sc.job as xf_row_stats does
 * on the CPU (softmax_rows.h), including the float64 tiny-sum rescue. */
template <typename T, typename Team>
XF_HD void xf_cu_row_stats(const Team &team, const T *x, long long C, const xf_cu_jobspec &spec,
                           const xf_cu_scratch &sc)
{
    const int nt = team.nt;
    xf_rowmax *part = sc.part;
    /* as softmax_rows.h: xf_max_block, over the strided elements of each thread */
    team.step([&](int tid) {
        xf_rowmax p;
        p.m = -XF_INF;
        p.argmax = XF_CU_NO_INDEX;
        p.n_nan = 0;
        p.n_finite = 0;
        p.min_finite = XF_INF;
        for (long long j = tid; j < C; j += nt) {
            double v = xf_cu_load(x[j]);
            if (v > p.m) { /* increasing j: the first index of this thread's max */
                p.m = v;
                p.argmax = j;
            }
            p.min_finite = (v < p.min_finite && v > -XF_INF) ? v : p.min_finite;
            p.n_nan += (v != v);
            p.n_finite += (v > -XF_INF);
        }
        part[tid] = p;
    });
    for (int s = nt >> 1; s > 0; s >>= 1) {
        team.step([&](int tid) {
            if (tid < s) {
                xf_cu_rowmax_merge(&part[tid], &part[tid + s]);
            }
        });
    }
    team.step([&](int tid) {
        if (tid == 0) {
            xf_rowmax st = part[0];
            /* no element equals the max (all NaN, all -inf): the CPU reports index 0; such a row has
             * no softmax and its argmax is never used */
            st.argmax = (st.argmax == XF_CU_NO_INDEX) ? 0 : st.argmax;
            xf_rowjob_init(sc.job, spec.y, spec.w_y, spec.eps, spec.z, spec.scale, spec.loss_scale, spec.prob);
            xf_rowjob_set_max(sc.job, &st);
            if (spec.has_grad >= 0) { /* as softmax_rows.h: xf_xent_row */
                xf_rowjob_plan(sc.job, (sc.job->y >= 0) ? xf_cu_load(x[sc.job->y]) : 0.0, spec.has_grad);
            }
        }
    });
    if (sc.job->status != XF_ROW_OK) { /* status is final from here on: a uniform branch */
        return;
    }
#if XF_CU_TREE_ORDER
    /* counterfactual order (g): strided per-thread sums, then a halving tree */
    double *ph = sc.chain, *pl = sc.chain + nt;
    team.step([&](int tid) {
        const double m = sc.job->m;
        const long long am = sc.job->argmax;
        double a = 0.0, ae = 0.0;
        for (long long j = tid; j < C; j += nt) {
            double e = xf_cu_exp_minus(x[j], m);
            e = (j == am) ? 0.0 : e;
            xf_cu_lane_add(x, &a, &ae, e);
        }
        ph[tid] = a;
        pl[tid] = ae;
    });
    for (int s = nt >> 1; s > 0; s >>= 1) {
        team.step([&](int tid) {
            if (tid < s) {
                xf_dd_add(&ph[tid], &pl[tid], ph[tid + s], pl[tid + s]);
            }
        });
    }
    team.step([&](int tid) {
        if (tid == 0) {
            xf_rowjob_set_sum(sc.job, ph[0], pl[0]);
        }
    });
    xf_cu_rescue(team, sc, x, C);
#else
    const long long nb = xf_cu_nblocks(C);
    const long long nch = nb * XF_LANES;
    double *acc = sc.chain;
    double *cmp = sc.chain + nch;
    /* as softmax_rows.h: xf_sumexp_block, one (block, lane) chain per thread at a time, see (c) */
    team.step([&](int tid) {
        const double m = sc.job->m;
        const long long am = sc.job->argmax;
        for (long long c = tid; c < nch; c += nt) {
            const long long b0 = (c / XF_LANES) * XF_BLOCK;
            const long long end = (C - b0 < XF_BLOCK) ? C : b0 + XF_BLOCK;
            double a = 0.0, ae = 0.0;
            for (long long j = b0 + c % XF_LANES; j < end; j += XF_LANES) {
                double e = xf_cu_exp_minus(x[j], m);
                e = (j == am) ? 0.0 : e;
                xf_cu_lane_add(x, &a, &ae, e);
            }
            acc[c] = a;
            cmp[c] = ae;
        }
    });
    team.step([&](int tid) {
        for (long long b = tid; b < nb; b += nt) {
            xf_lanes_to_dd(acc + XF_LANES * b, cmp + XF_LANES * b, &sc.blk[2 * b], &sc.blk[2 * b + 1]);
        }
    });
    /* as softmax_rows.h: xf_row_stats, the block merge and the rescue */
    team.step([&](int tid) {
        if (tid == 0) {
            double hi = 0.0, lo = 0.0;
            for (long long b = 0; b < nb; b++) {
                xf_dd_add(&hi, &lo, sc.blk[2 * b], sc.blk[2 * b + 1]);
            }
            xf_rowjob_set_sum(sc.job, hi, lo);
        }
    });
    xf_cu_rescue(team, sc, x, C);
#endif
}

/* Copy a row into shared memory (cache_row): later steps read it from there; the bits do not change. */
template <typename T, typename Team>
XF_HD const T *xf_cu_cache_row(const Team &team, const T *x, long long C, const xf_cu_scratch &sc)
{
    T *xs = (T *)sc.xs;
    const int nt = team.nt;
    team.step([&](int tid) {
        for (long long j = tid; j < C; j += nt) {
            xs[j] = x[j];
        }
    });
    return xs;
}

template <typename T>
struct xf_cu_xent_args {
    const T *x;               /* (N, C) logits */
    T *grad;                  /* (N, C) or NULL; may alias x (inplace) */
    const long long *y;       /* (N,) class indices, or NULL for probability targets */
    const T *t;               /* (N, C) probabilities or NULL */
    const double *w;          /* (C,) class weights or NULL */
    const double *row_scale;  /* (N,) upstream gradient per row or NULL */
    double *loss;             /* (N,) row losses */
    long long C, ignore_index;
    double eps, z, scale, loss_scale;
    int cache_row;
    unsigned char *z_redo;    /* (N,) rows flagged for xf_xent_z_exact_kernel, or NULL (z = 0) */
};

/* The gradient of one element, d loss / d x_j, from the finished job (as softmax_rows.h:
 * xf_xent_grad_block, its three paths).  x_j is read before the caller writes the result, so the
 * gradient may overwrite the logits (inplace). */
template <typename T>
XF_HD double xf_cu_grad_elem(const xf_rowjob *job, T xj, long long j, const T *t, const double *w)
{
    const double m = job->m, coef_per_S = job->coef_per_S, mult = job->coef_mult;
    const double xv = xf_cu_load(xj);
    if (xf_cu_grad_scaled(job, t)) {
        /* float64 only: subnormal probabilities times |coef| > 1 (see xf_exp_shifted_pow2) */
        if (job->simple && j == job->y) {
            return xf_target_grad(job, xf_exp_shifted(xv, m));
        }
        int tiny = (xv - m < -700.0);
        double e = tiny ? xf_exp_shifted_pow2(xv, m) : xf_exp_shifted(xv, m);
        double unscale = tiny ? mult * XF_POW2_UNSCALE : mult;
        double sq = 0.0, q = 0.0;
        if (!job->simple) {
            double wc = w ? w[j] : 1.0;
            double fin = (xv > -XF_INF) ? 1.0 : 0.0;
            double tj = t ? xf_cu_load(t[j]) : 0.0;
            q = xf_row_target_q(job, j, wc, fin, tj);
            sq = xf_target_grad_q_from(job->prob, job->eps, job->eps_per_class, job->scale, q, wc, fin,
                                       xf_grad_mass_t(job, j, tj), 1);
        }
        return xf_general_grad_entry(e * coef_per_S, unscale, sq, q, job->scale, mult);
    }
    double e = xf_cu_exp_minus(xj, m);
    /* the CPU keeps exp(x_j - m) as this very double (float64 stored rows, every float32 row): the simple rows' bits */
    if (job->simple) {
        return (j == job->y) ? xf_target_grad(job, e) : (e * coef_per_S) * mult;
    }
    double wc = w ? w[j] : 1.0;
    double fin = (xv > -XF_INF) ? 1.0 : 0.0;
    double tj = t ? xf_cu_load(t[j]) : 0.0;
    double q = xf_row_target_q(job, j, wc, fin, tj);
    return xf_general_grad_entry(e * coef_per_S, mult,
                                 xf_target_grad_q_from(job->prob, job->eps, job->eps_per_class, job->scale, q, wc, fin,
                                                       xf_grad_mass_t(job, j, tj), 1),
                                 q, job->scale, mult);
}

/* One row of cross-entropy: loss[row] and, when a.grad, the gradient row (as _xent.pyx
 * _xent_one_row + softmax_rows.h xf_xent_row). */
template <int ZX, typename T, typename Team>
XF_HD void xf_cu_xent_row(const Team &team, const xf_cu_xent_args<T> &a, long long row, const xf_cu_scratch &sc)
{
    const int nt = team.nt;
    const long long C = a.C;
    const T *xg = a.x + row * C;
    T *g = a.grad ? a.grad + row * C : (T *)0;
    if (a.y && a.y[row] == a.ignore_index) {
        /* ignored row: 0 loss, 0 gradient, whatever the logits hold */
        team.step([&](int tid) {
            if (tid == 0) {
                a.loss[row] = 0.0;
            }
            if (g) {
                for (long long j = tid; j < C; j += nt) {
                    xf_cu_store(g + j, 0.0);
                }
            }
        });
        return;
    }
    const T *x = a.cache_row ? xf_cu_cache_row(team, xg, C, sc) : xg;
    const T *t = a.t ? a.t + row * C : (const T *)0;
    const double *w = a.w;
    xf_cu_jobspec spec; /* as _xent.pyx: _row_job_init */
    spec.y = -1;
    spec.w_y = 1.0;
    spec.scale = a.scale;
    if (a.y) {
        spec.y = a.y[row];
        if (w) {
            spec.w_y = w[spec.y];
        }
    }
    if (a.row_scale) {
        spec.scale = spec.scale * a.row_scale[row];
    }
    spec.eps = a.eps;
    spec.z = a.z;
    spec.loss_scale = a.loss_scale;
    spec.prob = a.y ? 0 : 1;
    spec.has_grad = a.grad ? 1 : 0;
    xf_cu_row_stats(team, x, C, spec, sc);

    const int ok = (sc.job->status == XF_ROW_OK);
    const long long nb = xf_cu_nblocks(C);
    (void)nb;
    if (ok && sc.job->needs_terms && sc.job->prob && sizeof(T) == sizeof(float)) {
        /* as softmax_rows.h: xf_xent_row's xf_targets_scan, before the terms pass (xf_terms_plain): a
         * flag per thread in the max tree's storage (dead since the row statistics; the chains reuse it
         * only in the terms step), then their and */
        int *flag = (int *)sc.part;
        team.step([&](int tid) {
            int nonneg = 1;
            for (long long j = tid; j < C; j += nt) {
                nonneg &= (xf_cu_load(t[j]) >= 0.0);
            }
            flag[tid] = nonneg;
        });
        team.step([&](int tid) {
            if (tid == 0) {
                int all = 1;
                for (int k = 0; k < nt; k++) {
                    all &= flag[k];
                }
                sc.job->targets_nonneg = all;
            }
        });
    }
#if XF_CU_TREE_ORDER
    if (ok && sc.job->needs_terms) {
        double *T4 = sc.chain; /* 4 doubles per thread: (term hi, lo, q hi, lo) */
        team.step([&](int tid) {
            const xf_rowjob *job = sc.job;
            const int plain = xf_terms_plain(sizeof(T) == sizeof(float), job->prob, job->targets_nonneg);
            double s = 0.0, se = 0.0, q = 0.0, qe = 0.0;
            for (long long j = tid; j < C; j += nt) {
                double qj;
                double term = xf_xent_term(job, j, xf_cu_load(x[j]), w ? w[j] : 1.0,
                                           t ? xf_cu_load(t[j]) : 0.0, &qj);
                xf_terms_lane_add(&s, &se, term, plain);
                xf_terms_lane_add(&q, &qe, qj, plain);
            }
            T4[4 * tid] = s;
            T4[4 * tid + 1] = se;
            T4[4 * tid + 2] = q;
            T4[4 * tid + 3] = qe;
        });
        for (int s = nt >> 1; s > 0; s >>= 1) {
            team.step([&](int tid) {
                if (tid < s) {
                    xf_terms_merge(&T4[4 * tid], &T4[4 * (tid + s)]);
                }
            });
        }
    }
#else
    if (ok && sc.job->needs_terms) {
        const long long nch = nb * XF_LANES;
        double *ta = sc.chain, *tc = sc.chain + nch, *qa = sc.chain + 2 * nch, *qc = sc.chain + 3 * nch;
        /* as softmax_rows.h: xf_xent_terms_block, one (block, lane) chain per thread at a time */
        team.step([&](int tid) {
            const xf_rowjob *job = sc.job;
            const int plain = xf_terms_plain(sizeof(T) == sizeof(float), job->prob, job->targets_nonneg);
            for (long long c = tid; c < nch; c += nt) {
                const long long b0 = (c / XF_LANES) * XF_BLOCK;
                const long long end = (C - b0 < XF_BLOCK) ? C : b0 + XF_BLOCK;
                double s = 0.0, se = 0.0, q = 0.0, qe = 0.0;
                for (long long j = b0 + c % XF_LANES; j < end; j += XF_LANES) {
                    double qj;
                    double term = xf_xent_term(job, j, xf_cu_load(x[j]), w ? w[j] : 1.0,
                                               t ? xf_cu_load(t[j]) : 0.0, &qj);
                    xf_terms_lane_add(&s, &se, term, plain);
                    xf_terms_lane_add(&q, &qe, qj, plain);
                }
                ta[c] = s;
                tc[c] = se;
                qa[c] = q;
                qc[c] = qe;
            }
        });
        team.step([&](int tid) {
            for (long long b = tid; b < nb; b += nt) {
                xf_lanes_to_dd(ta + XF_LANES * b, tc + XF_LANES * b, &sc.blk[4 * b], &sc.blk[4 * b + 1]);
                xf_lanes_to_dd(qa + XF_LANES * b, qc + XF_LANES * b, &sc.blk[4 * b + 2], &sc.blk[4 * b + 3]);
            }
        });
    }
#endif
    team.step([&](int tid) {
        if (tid == 0) {
            double terms[4] = {0.0, 0.0, 0.0, 0.0};
            if (ok && sc.job->needs_terms) {
#if XF_CU_TREE_ORDER
                xf_terms_merge(terms, sc.chain);
#else
                for (long long b = 0; b < nb; b++) {
                    xf_terms_merge(terms, &sc.blk[4 * b]);
                }
#endif
            }
            xf_cu_tiny_loss(sc.job, x, C, t, w, terms);
            xf_cu_row_z_lse<ZX>(sc.job, x, C, t, w, terms);
            a.loss[row] = xf_rowjob_finish(sc.job, terms);
            if (!ZX && a.z_redo) {
                a.z_redo[row] = (unsigned char)sc.job->z_exact;
            }
        }
    });
    if (g) {
        team.step([&](int tid) {
            const xf_rowjob *job = sc.job;
            if (!ok) {
                for (long long j = tid; j < C; j += nt) {
                    xf_cu_store(g + j, XF_NAN);
                }
                return;
            }
            if (!ZX && job->z_exact) {
                return; /* xf_xent_z_exact_kernel writes this row, from logits still unchanged (inplace) */
            }
            for (long long j = tid; j < C; j += nt) {
                xf_cu_store(g + j, xf_cu_grad_elem(job, x[j], j, t, w));
            }
        });
    }
}

/* One row of the family: lse[row] (when lse) and, for mode 1 / 2, log_softmax / softmax of the row
 * (as _xent.pyx _softmax_family_row: softmax_rows.h xf_log_softmax_block, and softmax as the gradient of a
 * row without a target, each exponential times 1 / S rounded once, softmax_rows.h xf_stored_entry).
 * With lse, redo[row] says whether the row cancels: xf_lse_exact_kernel then replaces lse[row]. */
template <typename T, typename Team>
XF_HD void xf_cu_family_row(const Team &team, const T *xrow, T *out, double *lse, unsigned char *redo,
                            long long row, long long C, int mode, int cache_row, const xf_cu_scratch &sc)
{
    const int nt = team.nt;
    const T *x = cache_row ? xf_cu_cache_row(team, xrow, C, sc) : xrow;
    xf_cu_jobspec spec;
    spec.y = -1;
    spec.w_y = 1.0;
    spec.eps = 0.0;
    spec.z = 0.0;
    spec.scale = 1.0;
    spec.loss_scale = 1.0;
    spec.prob = 1;
    spec.has_grad = -1;
    xf_cu_row_stats(team, x, C, spec, sc);
    team.step([&](int tid) {
        const xf_rowjob *job = sc.job;
        const int ok = (job->status == XF_ROW_OK);
        if (tid == 0 && lse) {
            /* the limits: all -inf sums to 0 (lse -inf), +inf gives +inf, NaN stays NaN */
            lse[row] = ok ? job->lse : (job->has_nan ? XF_NAN : job->m);
            redo[row] = (unsigned char)(ok && xf_rowjob_lse_cancels(job));
        }
        if (mode == 0) {
            return;
        }
        const double inv_S = ok ? xf_rowjob_div_S(job, 1.0) : XF_NAN;
        for (long long j = tid; j < C; j += nt) {
            double v;
            if (!ok) {
                v = XF_NAN;
            } else if (mode == 1) {
                v = xf_cu_log_prob(x[j], job->m, job->log_s);
            } else {
                v = xf_cu_exp_minus(x[j], job->m) * inv_S;
            }
            xf_cu_store(out + row * C + j, v);
        }
    });
}

/* ---- CUDA entry points ----------------------------------------------------------------------------------- */
#if XF_CUDA

struct xf_cu_device_team {
    int tid, nt;
    template <class F>
    __device__ __forceinline__ void step(F &&f) const
    {
        f(tid);
        __syncthreads();
    }
};

/* The body of both cross-entropy kernels below. */
template <int ZX, typename T>
__device__ __forceinline__ void xf_cu_xent_rows(const T *x, const long long *y, const T *t, const double *w, const double *row_scale,
                                double *loss, T *grad, long long N, long long C, long long ignore_index, double eps,
                                double z, double scale, double loss_scale, int cache_row, unsigned char *z_redo)
{
    extern __shared__ double xf_cu_smem[];
    __shared__ xf_rowjob job;
    const xf_cu_scratch sc = xf_cu_scratch_layout(xf_cu_smem, &job, (int)blockDim.x, C);
    const xf_cu_device_team team = {(int)threadIdx.x, (int)blockDim.x};
    xf_cu_xent_args<T> a;
    a.x = x;
    a.grad = grad;
    a.y = y;
    a.t = t;
    a.w = w;
    a.row_scale = row_scale;
    a.loss = loss;
    a.C = C;
    a.ignore_index = ignore_index;
    a.eps = eps;
    a.z = z;
    a.scale = scale;
    a.loss_scale = loss_scale;
    a.cache_row = cache_row;
    a.z_redo = z_redo;
    for (long long row = blockIdx.x; row < N; row += gridDim.x) {
        if (ZX && !z_redo[row]) {
            continue; /* block-uniform: the row index is */
        }
        xf_cu_xent_row<ZX>(team, a, row, sc);
        __syncthreads(); /* the next row's first step rewrites the scratch */
    }
}

/* softmax cross-entropy, as _xent.softmax_xent: a block per row, grid-stride over rows.  Absent
 * arrays are NULL; z_redo (zeroed, (N,)) only where z != 0: rows the z-loss needs exact, see
 * xf_cu_row_z_lse.  Dynamic shared memory: 8 * xf_cu_scratch_doubles(nt, C) bytes (+ C * sizeof(T)
 * with cache_row). */
template <typename T>
__global__ void __launch_bounds__(XF_CU_MAX_THREADS, XF_CU_XENT_MIN_BLOCKS)
xf_softmax_xent_kernel(const T *x, const long long *y, const T *t, const double *w, const double *row_scale,
                       double *loss, T *grad, long long N, long long C, long long ignore_index, double eps,
                       double z, double scale, double loss_scale, int cache_row, unsigned char *z_redo)
{
    xf_cu_xent_rows<0>(x, y, t, w, row_scale, loss, grad, N, C, ignore_index, eps, z, scale, loss_scale,
                       cache_row, z_redo);
}

/* The rows xf_softmax_xent_kernel flagged in z_redo, redone whole with the z-loss's exact logsumexp
 * (same launch configuration).  Flagged rows are rare; the others cost a byte read per block. */
template <typename T>
__global__ void __launch_bounds__(XF_CU_MAX_THREADS)
xf_xent_z_exact_kernel(const T *x, const long long *y, const T *t, const double *w, const double *row_scale,
                       double *loss, T *grad, long long N, long long C, long long ignore_index, double eps,
                       double z, double scale, double loss_scale, int cache_row, unsigned char *z_redo)
{
    xf_cu_xent_rows<1>(x, y, t, w, row_scale, loss, grad, N, C, ignore_index, eps, z, scale, loss_scale,
                       cache_row, z_redo);
}

/* log_softmax (mode 1), softmax (mode 2), logsumexp only (mode 0), as _xent.softmax_family.
 * Minimum 1 block per SM: with xf_fma in the exponential, ptxas's own choice for the float kernel was 64
 * registers and an 8-byte spill; this bound lets it take 84 registers and spill nothing (tests/test_cuda.py),
 * at the price of one 512-thread block per SM instead of two.  Which costs less is for a GPU to measure. */
template <typename T>
__global__ void __launch_bounds__(XF_CU_MAX_THREADS, 1)
xf_softmax_family_kernel(const T *x, T *out, double *lse, unsigned char *redo, long long N, long long C, int mode,
                         int cache_row)
{
    extern __shared__ double xf_cu_smem[];
    __shared__ xf_rowjob job;
    const xf_cu_scratch sc = xf_cu_scratch_layout(xf_cu_smem, &job, (int)blockDim.x, C);
    const xf_cu_device_team team = {(int)threadIdx.x, (int)blockDim.x};
    for (long long row = blockIdx.x; row < N; row += gridDim.x) {
        xf_cu_family_row(team, x + row * C, out, lse, redo, row, C, mode, cache_row, sc);
        __syncthreads();
    }
}

/* The exact logsumexp of the rows xf_softmax_family_kernel flagged in redo: a thread per row,
 * grid-stride.  Flagged rows are rare (a row of log-probabilities, say), and each costs ~100-300 row
 * passes; the others cost one byte read. */
template <typename T>
__global__ void xf_lse_exact_kernel(const T *x, double *lse, const unsigned char *redo, long long N, long long C)
{
    for (long long row = (long long)blockIdx.x * blockDim.x + threadIdx.x; row < N;
         row += (long long)gridDim.x * blockDim.x) {
        if (redo[row]) {
            lse[row] = xf_cu_lse_cancelling(x + row * C, C);
        }
    }
}

#endif /* XF_CUDA */
