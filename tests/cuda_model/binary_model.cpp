// Host model of xentfast/_cuda/binary.cu and reduce.cu: the kernel files themselves, compiled by g++
// (XF_CUDA == 0), run on the CPU (binary.cu (e), reduce.cu (c)).  Built and loaded with ctypes by
// tests/test_cuda.py; not part of the package.
//
// `order` runs the elements (rows, dd_sum blocks, the threads of a tree level) forward, backward or odd
// ones first: on the GPU they run in any order, so a result that depended on it would be a race.  The
// dd_sum partials are poisoned with NaN first (a merge that read a partial no block wrote would show).
#include "binary.cu"
#include "reduce.cu"

#include <vector>

static std::vector<long long> model_order(long long n, int order)
{
    std::vector<long long> idx;
    idx.reserve((size_t)n);
    if (order == 1) {
        for (long long i = n - 1; i >= 0; i--) idx.push_back(i);
    } else if (order == 2) {
        for (long long i = 1; i < n; i += 2) idx.push_back(i);
        for (long long i = 0; i < n; i += 2) idx.push_back(i);
    } else {
        for (long long i = 0; i < n; i++) idx.push_back(i);
    }
    return idx;
}

struct xf_cu_host_team {
    int nt;
    int order;
    template <class F>
    void step(F &&f) const
    {
        for (long long t : model_order(nt, order)) f((int)t);
    }
};

template <typename T>
static void model_elementwise(int op, const T *x, const T *t, const double *w, long long w_div, long long w_mod,
                              const double *pw, long long pw_div, long long pw_mod, const double *g, double scale,
                              int has_ignore, double ignore, double alpha, double gamma, int clip, double eps,
                              int clamp, double log_clamp, double clamp_lo, double clamp_hi, double *loss_d,
                              T *loss_o, T *grad, long long n, double loss_k, int order)
{
    xf_bin_args a;
    xf_cu_bin_args_init(&a, n, w, w_div, w_mod, pw, pw_div, pw_mod, g, scale, has_ignore, ignore, alpha, gamma,
                        clip, eps, clamp, log_clamp, clamp_lo, clamp_hi, loss_k);
    for (long long i : model_order(n, order)) {
        if (op == XF_CU_OP_BCE_LOGITS) {
            xf_cu_bin_elem<T, XF_CU_OP_BCE_LOGITS>(x, t, i, &a, loss_d, loss_o, grad);
        } else if (op == XF_CU_OP_FOCAL) {
            xf_cu_bin_elem<T, XF_CU_OP_FOCAL>(x, t, i, &a, loss_d, loss_o, grad);
        } else {
            xf_cu_bin_elem<T, XF_CU_OP_BCE_PROB>(x, t, i, &a, loss_d, loss_o, grad);
        }
    }
}

template <typename T>
static void model_ce_probs(const T *p, const long long *y, const T *t, const double *w, long long ignore_index,
                           const double *row_scale, double scale, int clip, double eps, double *loss, T *grad,
                           long long N, long long C, double loss_k, int nt, int order)
{
    xf_bin_prob_mode m;
    xf_bin_prob_mode_init(&m, clip, eps, 0, 0.0, 0.0, 1.0);
    const xf_cu_host_team team = {nt, order};
    xf_cu_ce_scratch sc;
    for (long long i : model_order(N, order)) {
        // poison the team's scratch: a step that read what no earlier step of this row wrote shows as NaN
        for (double &d : sc.term) d = XF_NAN;
        sc.acc = sc.err = sc.loss = sc.g_y = XF_NAN;
        for (int &f : sc.nan_part) f = -1;
        sc.has_nan = -1;
        xf_cu_ce_probs_row(team, p, C, i, y, ignore_index, t, w, row_scale, scale, &m, loss_k, loss, grad, &sc);
    }
}

extern "C" {

#define XF_MODEL_BIN(SFX, T)                                                                                   \
    void xf_model_elementwise_##SFX(int op, const T *x, const T *t, const double *w, long long w_div,          \
                                    long long w_mod, const double *pw, long long pw_div, long long pw_mod,    \
                                    const double *g, double scale, int has_ignore, double ignore,             \
                                    double alpha, double gamma, int clip, double eps, int clamp,              \
                                    double log_clamp, double clamp_lo, double clamp_hi, double *loss_d,       \
                                    T *loss_o, T *grad, long long n, double loss_k, int order)                \
    {                                                                                                         \
        model_elementwise<T>(op, x, t, w, w_div, w_mod, pw, pw_div, pw_mod, g, scale, has_ignore, ignore,     \
                             alpha, gamma, clip, eps, clamp, log_clamp, clamp_lo, clamp_hi, loss_d, loss_o,   \
                             grad, n, loss_k, order);                                                         \
    }                                                                                                         \
    void xf_model_ce_probs_##SFX(const T *p, const long long *y, const T *t, const double *w,                 \
                                 long long ignore_index, const double *row_scale, double scale, int clip,     \
                                 double eps, double *loss, T *grad, long long N, long long C, double loss_k,  \
                                 int nt, int order)                                                           \
    {                                                                                                         \
        model_ce_probs<T>(p, y, t, w, ignore_index, row_scale, scale, clip, eps, loss, grad, N, C, loss_k,     \
                          nt, order);                                                                         \
    }
XF_MODEL_BIN(f32, float)
XF_MODEL_BIN(f64, double)

/* reduce.cu's dd_sum: the block kernel (blocks in `order`), then the tree kernel with nt threads */
void xf_model_dd_sum(const double *v, long long n, int nt, int order, double *out)
{
    out[0] = 0.0;
    out[1] = 0.0;
    long long nb = xf_ddsum_nblocks(n);
    if (nb == 0) return;
    std::vector<double> part((size_t)(2 * nb), XF_NAN);
    for (long long b : model_order(nb, order)) xf_ddsum_block(v, n, b, part.data());
    const xf_cu_host_team team = {nt, order};
    xf_cu_ddsum_tree(team, part.data(), nb);
    out[0] = part[0];
    out[1] = part[1];
}

double xf_model_target_weight_sum(const long long *y, const double *w, long long n, long long ignore_index,
                                  long long C)
{
    return xf_cu_target_weight_sum(y, w, n, ignore_index, C);
}

}  // extern "C"
