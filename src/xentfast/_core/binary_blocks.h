/* Element loops of the binary family for one storage type; included by binary_kernels.h with XF_T and
 * XF_SFX defined.  All arithmetic is double and comes from xentfast/binary.h.
 *
 * Every block function takes the outputs it should produce as pointers, NULL for the ones not wanted:
 * loss_d (double, for reductions), loss_o (storage type, reduction="none") and grad (storage type, may
 * alias x).  The forward, the backward and the fused call run the same per-element expressions, so
 * they give the same bits.
 */

#define XF_BIN_CAT_(a, b) a##_##b
#define XF_BIN_CAT(a, b) XF_BIN_CAT_(a, b)
#define XF_BIN_FN(name) XF_BIN_CAT(name, XF_SFX)

/* the upstream factor of element i */
#define XF_BIN_UPSTREAM(a, i) ((a)->g ? (a)->scale * (a)->g[i] : (a)->scale)

XF_HD void XF_BIN_FN(xf_bin_store)(double v, int ign, long long j, double *loss_d, XF_T *loss_o)
{
    v = ign ? 0.0 : v;
    if (loss_d) {
        loss_d[j] = v;
    }
    if (loss_o) {
        loss_o[j] = (XF_T)v;
    }
}

/* BCE with logits over elements [off, off + n) */
XF_HD void XF_BIN_FN(xf_bce_logits_block)(const XF_T *x, const XF_T *t, long long off, long long n,
                                           const xf_bin_args *a, double *loss_d, XF_T *loss_o, XF_T *grad)
{
    double wbuf[XF_BIN_BLOCK], pwbuf[XF_BIN_BLOCK];
    const double *w = xf_bin_gather(a->w, a->w_div, a->w_mod, a->w_full, off, n, wbuf);
    const double *q = xf_bin_gather(a->pw, a->pw_div, a->pw_mod, a->pw_full, off, n, pwbuf);
    long long j;
    for (j = 0; j < n; j++) {
        double xv = (double)x[off + j];
        double y = (double)t[off + j];
        int ign = a->has_ignore && y == a->ignore;
        xf_bin_logit p = xf_bin_logit_pieces(xv);
        if (loss_d || loss_o) {
            XF_BIN_FN(xf_bin_store)(xf_bin_bce_logits_loss(p, y, w[j], q[j], a->loss_k), ign, off + j, loss_d, loss_o);
        }
        if (grad) {
            double g = xf_bin_bce_logits_grad(p, y, w[j], q[j], XF_BIN_UPSTREAM(a, off + j));
            grad[off + j] = (XF_T)(ign ? 0.0 : g);
        }
    }
}

/* sigmoid focal loss over elements [off, off + n) */
XF_HD void XF_BIN_FN(xf_focal_block)(const XF_T *x, const XF_T *t, long long off, long long n,
                                      const xf_bin_args *a, double *loss_d, XF_T *loss_o, XF_T *grad)
{
    long long j;
    for (j = 0; j < n; j++) {
        double xv = (double)x[off + j];
        double y = (double)t[off + j];
        int ign = a->has_ignore && y == a->ignore;
        xf_bin_logit p = xf_bin_logit_pieces(xv);
        xf_bin_focal_parts f = xf_bin_focal_prepare(p, y, a->alpha, a->gamma);
        if (loss_d || loss_o) {
            XF_BIN_FN(xf_bin_store)(xf_bin_focal_loss(p, f, a->gamma, a->loss_k), ign, off + j, loss_d, loss_o);
        }
        if (grad) {
            double g = xf_bin_focal_grad(p, f, y, a->gamma, XF_BIN_UPSTREAM(a, off + j));
            grad[off + j] = (XF_T)(ign ? 0.0 : g);
        }
    }
}

/* BCE from probabilities over elements [off, off + n) */
XF_HD void XF_BIN_FN(xf_bce_prob_block)(const XF_T *x, const XF_T *t, long long off, long long n,
                                         const xf_bin_args *a, double *loss_d, XF_T *loss_o, XF_T *grad)
{
    double wbuf[XF_BIN_BLOCK];
    const double *w = xf_bin_gather(a->w, a->w_div, a->w_mod, a->w_full, off, n, wbuf);
    long long j;
    for (j = 0; j < n; j++) {
        double pv = (double)x[off + j];
        double y = (double)t[off + j];
        int ign = a->has_ignore && y == a->ignore;
        if (loss_d || loss_o) {
            XF_BIN_FN(xf_bin_store)(xf_bin_bce_prob_loss(pv, y, w[j], &a->mode, a->loss_k), ign, off + j, loss_d, loss_o);
        }
        if (grad) {
            double g = xf_bin_bce_prob_grad(pv, y, w[j], XF_BIN_UPSTREAM(a, off + j), &a->mode);
            grad[off + j] = (XF_T)(ign ? 0.0 : g);
        }
    }
}

/* Cross-entropy from class probabilities, one row of C classes.
 * Index target y (t == NULL): loss w_y (-log p_y), gradient -s w_y / p_y at y and 0 elsewhere.
 * Probability target t: loss sum_c w_c t_c (-log p_c), all terms >= 0, summed with TwoSum compensation
 * (xf_acc_add) in class order; gradient -s w_c t_c / p_c.
 * A NaN anywhere in the row makes its loss and gradient NaN (the softmax family's row policy).  Returns
 * the row loss in double, times 2^loss_k; s is the row's upstream factor. */
XF_HD double XF_BIN_FN(xf_ce_probs_row)(const XF_T *p, long long C, long long y, double w_y, const XF_T *t,
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
    return acc + err;
}

#undef XF_BIN_UPSTREAM
#undef XF_BIN_FN
#undef XF_BIN_CAT
#undef XF_BIN_CAT_
