// Host model of xentfast/_cuda/kernels.cu: the kernel file itself, compiled by g++ (XF_CUDA == 0), with
// a "team" that runs each step for tid = 0 .. nt-1 in turn (kernels.cu, design (f)).  Built and loaded
// with ctypes by tests/test_cuda.py; not part of the package.
//
// Two checks beyond the arithmetic: the scratch is poisoned with NaN before every row (a step that
// read scratch no earlier step wrote would show up as NaN), and `order` runs the threads of each step
// forward, backward or interleaved (a step whose threads depended on each other -- a race on the GPU
// -- would give order-dependent results).
#include "kernels.cu"
#include "xent_kernels.h"  // the CPU's row kernels, for the alternative-order comparison

#include <vector>

struct xf_cu_host_team {
    int nt;
    int order;  // 0 forward, 1 backward, 2 odd threads first
    template <class F>
    void step(F &&f) const
    {
        if (order == 1) {
            for (int t = nt - 1; t >= 0; t--) f(t);
        } else if (order == 2) {
            for (int t = 1; t < nt; t += 2) f(t);
            for (int t = 0; t < nt; t += 2) f(t);
        } else {
            for (int t = 0; t < nt; t++) f(t);
        }
    }
};

static std::vector<double> model_smem(int nt, long long C, int cache_row, size_t itemsize)
{
    size_t n = (size_t)xf_cu_scratch_doubles(nt, C) + (cache_row ? ((size_t)C * itemsize + 7) / 8 : 0);
    return std::vector<double>(n);
}

static void poison(std::vector<double> &v, xf_rowjob *job)
{
    for (double &d : v) d = XF_NAN;
    unsigned char *p = (unsigned char *)job;
    for (size_t i = 0; i < sizeof *job; i++) p[i] = 0xff;
}

template <typename T>
static void model_xent(const T *x, const long long *y, const T *t, const double *w, const double *row_scale,
                       double *loss, T *grad, long long N, long long C, long long ignore_index, double eps,
                       double z, double scale, double loss_scale, int cache_row, int nt, int order)
{
    std::vector<double> smem = model_smem(nt, C, cache_row, sizeof(T));
    xf_rowjob job;
    const xf_cu_scratch sc = xf_cu_scratch_layout(smem.data(), &job, nt, C);
    const xf_cu_host_team team = {nt, order};
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
    std::vector<unsigned char> z_redo(N > 0 ? N : 1, 0);
    a.z_redo = z != 0.0 ? z_redo.data() : nullptr;
    for (long long row = 0; row < N; row++) {
        poison(smem, &job);
        xf_cu_xent_row<0>(team, a, row, sc);
    }
    /* as xf_xent_z_exact_kernel, which the launcher runs after the row kernel when z != 0 */
    for (long long row = 0; a.z_redo && row < N; row++) {
        if (z_redo[row]) {
            poison(smem, &job);
            xf_cu_xent_row<1>(team, a, row, sc);
        }
    }
}

template <typename T>
static void model_family(const T *x, T *out, double *lse, long long N, long long C, int mode, int cache_row, int nt,
                         int order)
{
    std::vector<double> smem = model_smem(nt, C, cache_row, sizeof(T));
    xf_rowjob job;
    const xf_cu_scratch sc = xf_cu_scratch_layout(smem.data(), &job, nt, C);
    const xf_cu_host_team team = {nt, order};
    std::vector<unsigned char> redo(N > 0 ? N : 1, 2);
    for (long long row = 0; row < N; row++) {
        poison(smem, &job);
        xf_cu_family_row(team, x + row * C, out, lse, redo.data(), row, C, mode, cache_row, sc);
    }
    /* as xf_lse_exact_kernel, which the launcher runs after the family kernel when lse is wanted */
    for (long long row = 0; lse && row < N; row++) {
        if (redo[row]) {
            lse[row] = xf_cu_lse_cancelling(x + row * C, C);
        }
    }
}

extern "C" {

long long xf_model_scratch_bytes(int nt, long long C) { return 8 * xf_cu_scratch_doubles(nt, C); }
int xf_model_sizeof_rowmax(void) { return (int)sizeof(xf_rowmax); }

#define XF_MODEL_XENT(SFX, T)                                                                                  \
    void xf_model_xent_##SFX(const T *x, const long long *y, const T *t, const double *w,                    \
                             const double *row_scale, double *loss, T *grad, long long N, long long C,        \
                             long long ignore_index, double eps, double z, double scale, double loss_scale,   \
                             int cache_row, int nt, int order)                                                \
    {                                                                                                         \
        model_xent<T>(x, y, t, w, row_scale, loss, grad, N, C, ignore_index, eps, z, scale, loss_scale,       \
                      cache_row, nt, order);                                                                  \
    }                                                                                                         \
    void xf_model_family_##SFX(const T *x, T *out, double *lse, long long N, long long C, int mode,           \
                               int cache_row, int nt, int order)                                              \
    {                                                                                                         \
        model_family<T>(x, out, lse, N, C, mode, cache_row, nt, order);                                       \
    }
XF_MODEL_XENT(f32, float)
XF_MODEL_XENT(f64, double)

}  // extern "C"

// ---- counterfactual: the order a GPU kernel would use if it did not copy the CPU's --------------------
// Each of nt threads sums the exponentials of its strided elements j = tid, tid + nt, ... (plain double
// for float data, TwoSum-compensated for double), then the nt partials merge pairwise in a halving tree
// (xf_dd_add), the shape of a shared-memory / warp-shuffle reduction.  Same max, same per-element math,
// only the summation order differs.  Outputs: lse (double) and log_softmax of the rows, so the tests can
// measure how far this order lands from the CPU's bits and from the exact values.  NOT what kernels.cu
// does.

template <typename T>
static void alt_order_row(const T *x, long long C, int nt, T *logp, double *lse)
{
    xf_rowjob job;
    xf_rowjob_init(&job, -1, 1.0, 0.0, 0.0, 1.0, 1.0, 1);
    if (sizeof(T) == 4) {
        xf_row_max_f32((const float *)x, C, &job);
    } else {
        xf_row_max_f64((const double *)x, C, &job);
    }
    if (job.status == XF_ROW_OK) {
        std::vector<double> hi(nt, 0.0), lo(nt, 0.0);
        for (int t = 0; t < nt; t++) {
            double a = 0.0, ae = 0.0;
            for (long long j = t; j < C; j += nt) {
                double e = xf_cu_exp_minus(x[j], job.m);
                e = (j == job.argmax) ? 0.0 : e;
                xf_cu_lane_add(x, &a, &ae, e);
            }
            hi[t] = a;
            lo[t] = ae;
        }
        for (int s = nt >> 1; s > 0; s >>= 1) {
            for (int t = 0; t < s; t++) {
                xf_dd_add(&hi[t], &lo[t], hi[t + s], lo[t + s]);
            }
        }
        xf_rowjob_set_sum(&job, hi[0], lo[0]);
    }
    *lse = (job.status == XF_ROW_OK) ? job.lse : (job.has_nan ? XF_NAN : job.m);
    for (long long j = 0; j < C; j++) {
        xf_cu_store(logp + j, job.status == XF_ROW_OK ? xf_cu_log_prob(x[j], job.m, job.log_s) : XF_NAN);
    }
}

extern "C" {
void xf_model_alt_order_f32(const float *x, float *logp, double *lse, long long N, long long C, int nt)
{
    for (long long i = 0; i < N; i++) alt_order_row(x + i * C, C, nt, logp + i * C, lse + i);
}
void xf_model_alt_order_f64(const double *x, double *logp, double *lse, long long N, long long C, int nt)
{
    for (long long i = 0; i < N; i++) alt_order_row(x + i * C, C, nt, logp + i * C, lse + i);
}
}  // extern "C"
