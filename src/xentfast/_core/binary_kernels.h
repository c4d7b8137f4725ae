/* CPU element loops of the binary family, written once for float and double storage (binary_blocks.h)
 * around the shared arithmetic of xentfast/binary.h.
 *
 * Design (see also the block comment of _binary.pyx):
 * (a) The unit of work is a block of XF_BIN_BLOCK consecutive elements (or one row for CE from class
 *     probabilities).  An element's result depends on that element only, so any assignment of blocks to
 *     threads gives the same bits.
 * (b) Broadcast weights (torch: `weight` broadcasts to the input, `pos_weight` along the last axis) are
 *     addressed as w[(i / div) % mod], which covers every broadcast whose non-trivial axes are
 *     contiguous; the API materialises the rare other patterns.  A block gathers its weights into a
 *     small stack buffer first (integer work only), so the arithmetic loop reads them with stride 1.
 * (c) Each element is read before its gradient is written, and the same index is written, so the
 *     gradient may overwrite the input (inplace=True).
 */
#ifndef XENTFAST_BINARY_KERNELS_H
#define XENTFAST_BINARY_KERNELS_H

#include "xentfast/binary.h"

#define XF_BIN_BLOCK 1024

typedef struct {
    const double *w;     /* element weight, NULL: 1 */
    long long w_div, w_mod;
    int w_full;          /* w has one entry per element (no gather needed) */
    const double *pw;    /* pos_weight, NULL: 1 */
    long long pw_div, pw_mod;
    int pw_full;
    const double *g;     /* per-element upstream gradient (reduction="none"), NULL: none */
    double scale;        /* scalar upstream factor (grad_output / denominator) */
    int has_ignore;
    double ignore;       /* targets equal to it are ignored */
    double alpha, gamma; /* focal */
    xf_bin_prob_mode mode;
    double loss_k;       /* losses written times 2^loss_k (0, or 600 for reductions of tiny terms) */
} xf_bin_args;

/* w[(i / div) % mod] for i in [off, off + n), see (b) */
XF_HD const double *xf_bin_gather(const double *w, long long div, long long mod, int full, long long off,
                                  long long n, double *buf)
{
    long long j;
    if (w == 0) {
        for (j = 0; j < n; j++) {
            buf[j] = 1.0;
        }
        return buf;
    }
    if (full) {
        return w + off;
    }
    long long idx = (off / div) % mod;
    long long r = off % div;
    for (j = 0; j < n; j++) {
        buf[j] = w[idx];
        r += 1;
        if (r == div) {
            r = 0;
            idx += 1;
            if (idx == mod) {
                idx = 0;
            }
        }
    }
    return buf;
}

/* log(eps) and log1p(-eps) once per call, with the header's own functions (same bits on every device) */
XF_HD void xf_bin_prob_mode_init(xf_bin_prob_mode *m, int clip, double eps, int clamp, double c)
{
    m->clip = clip;
    m->eps = eps;
    m->log_eps = clip ? xf_log(eps) : 0.0;
    m->log1m_eps = clip ? xf_log1p(-eps) : 0.0;
    m->clamp = clamp;
    m->c = c;
}

#define XF_T float
#define XF_SFX f32
#include "binary_blocks.h"
#undef XF_T
#undef XF_SFX

#define XF_T double
#define XF_SFX f64
#include "binary_blocks.h"
#undef XF_T
#undef XF_SFX

#endif /* XENTFAST_BINARY_KERNELS_H */
