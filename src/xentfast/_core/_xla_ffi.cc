// XLA FFI handlers for xentfast.jax on CPU: the softmax and binary kernels called from inside an XLA
// program, with no Python on the way.
//
// Design
// (a) Same kernels, same bits.  The handlers call the dispatch tables of xent_kernels.h and
//     binary_kernels.h, the entry points the Cython drivers (_xent.pyx, _binary.pyx) call, with the
//     arguments those drivers receive for reduction="none".  They are not compiled here: the module
//     takes them from _xent and _binary when it is imported (their _kernel_exports capsules), so the
//     handlers run the very machine code the NumPy API runs, on the code path _xent.set_cpu_path chose
//     (read at every call), and this unit compiles in seconds.  tests/test_jax_dropin.py checks the
//     bits against the NumPy functions on every path.
// (b) Rows, and groups of short rows.  _xent.pyx also has a "phased" split for fewer rows than threads;
//     it gives the same bits as the row loop (tests/test_threads.py) and only changes which thread runs
//     which block, so the handlers keep to the row loop.  Short rows of index targets go side by side,
//     XF_GROUP_ROWS at a time, as the NumPy API runs them (the row kernel's bits, several times faster),
//     and so do the losses without a gradient of longer rows, each row's passes as alone, then their
//     logarithms side by side (xf_forward_in_batches; the same bits again).
// (c) Threads: OpenMP, with the NumPy API's rule (xentfast._threads.threads_for): all of OpenMP's
//     threads, but one per 16384 elements at most.  A row's result never depends on the count, nor
//     on which thread runs it: the loops are schedule(guided), as _xent.pyx (c) explains.
// (d) Nothing is validated here: xentfast.jax checks shapes and dtypes while tracing and replaces
//     invalid labels by the skip label -1 before the call.  A handler still refuses a dtype it has no
//     kernel for, with an error XLA reports, instead of reading memory wrongly.
// (e) ABI: XLA's FFI keeps accepting handlers built against older API versions, not newer ones.  The
//     build records the jaxlib whose headers it used (XF_JAXLIB_VERSION); xentfast.jax registers these
//     targets only with that jaxlib or a newer one.
// (f) Subnormals.  XLA runs CPU code with denormals flushed (x86: MXCSR FTZ and DAZ set on its threads),
//     which would turn every subnormal loss, probability or gradient into 0 and break the documented
//     bounds (ulp counts the subnormal spacing).  Every thread that runs a kernel here clears the flags
//     for the duration of its work and restores XLA's on the way out.  OpenMP workers keep their own
//     control register, so the guard sits inside each parallel region, not only around it.
// (g) The labels' gradients, -g log_softmax(x) and -g x, are computed here too (one rounding of the
//     product in the storage type), not by XLA, for the same reason.
//
// Built only when jaxlib's FFI headers are present at build time (setup.py); xentfast.jax falls back
// to buffer_callback / pure_callback without this module.

#include <Python.h>

#include <algorithm>
#include <cstdint>
#include <memory>
#include <new>
#include <string>
#include <type_traits>
#include <vector>

#ifdef _OPENMP
#include <omp.h>
#endif
#include "xla/ffi/api/ffi.h"

// the kernels' types and inline helpers, not the kernels: those come from _xent and _binary ((a))
#define XF_KERNEL_TABLES_ONLY 1
#include "binary_kernels.h"
#include "fp_ieee.h"
#include "xent_kernels.h"

namespace ffi = xla::ffi;

#ifndef XF_JAXLIB_VERSION
#error "XF_JAXLIB_VERSION must name the jaxlib whose FFI headers this build uses"
#endif

namespace {

constexpr long long kMinElementsPerThread = 16384;  // xentfast._threads.MIN_ELEMENTS_PER_THREAD
constexpr long long kSkip = -1;                      // xentfast.jax._SKIP

// IEEE subnormals on this thread while in scope ((f)), with the Cython kernels' guard (fp_ieee.h)
class IeeeDenormals {
public:
    IeeeDenormals() : saved_(xf_fp_ieee_enter()) {}
    ~IeeeDenormals() { xf_fp_ieee_leave(saved_); }
    IeeeDenormals(const IeeeDenormals &) = delete;
    IeeeDenormals &operator=(const IeeeDenormals &) = delete;

private:
    xf_fp_state saved_;
};

int threads_for(long long n_elements)
{
#ifdef _OPENMP
    long long wanted = omp_get_max_threads();
    return static_cast<int>(std::max(1LL, std::min(wanted, n_elements / kMinElementsPerThread)));
#else
    (void)n_elements;
    return 1;
#endif
}

// set once, when the module is imported (PyInit__xla_ffi), before any handler can run
const xf_softmax_exports *softmax_exports = nullptr;
const xf_binary_exports *binary_exports = nullptr;

// _xent's current code path; set_cpu_path stores it while holding the GIL, which XLA's threads do not
int cpu_path() { return __atomic_load_n(softmax_exports->current_path, __ATOMIC_RELAXED); }

template <typename T> struct Tables;
template <> struct Tables<float> {
    static const xf_softmax_table_f32 *softmax() { return softmax_exports->f32(cpu_path()); }
    static const xf_binary_table_f32 *binary() { return binary_exports->f32(cpu_path()); }
};
template <> struct Tables<double> {
    static const xf_softmax_table_f64 *softmax() { return softmax_exports->f64(cpu_path()); }
    static const xf_binary_table_f64 *binary() { return binary_exports->f64(cpu_path()); }
};

// rows x classes of a buffer whose last axis is the class axis (a 0-d or 1-d buffer is one row)
void rows_of(const ffi::AnyBuffer &x, long long *N, long long *C)
{
    auto dims = x.dimensions();
    long long n = 1;
    for (size_t k = 0; k + 1 < dims.size(); ++k) {
        n *= dims[k];
    }
    *C = dims.size() ? dims[dims.size() - 1] : 1;
    *N = *C ? n : 0;
}

template <typename T>
void fill(T *p, long long n, double v)
{
    for (long long j = 0; j < n; ++j) {
        p[j] = static_cast<T>(v);
    }
}

// body(k) for every task k in [0, n_tasks), on nt OpenMP threads, each with IEEE subnormals ((f)), the
// tasks handed out on demand ((c)): the handlers' parallel loop (xent_rows' row loop keeps a region of its
// own, for its per-thread scratch row)
template <typename Body>
void on_threads(int nt, long long n_tasks, const Body &body)
{
#pragma omp parallel num_threads(nt)
    {
    IeeeDenormals ieee;
#pragma omp for schedule(guided)
    for (long long k = 0; k < n_tasks; ++k) {
        body(k);
    }
    }
}

// _xent.pyx's _row_job_init with: no class weights, no smoothing, scale 1, loss_scale 1 (reduction
// "none"), the row's upstream factor g[i] (double, exact) when there is one
template <typename T, typename L>
void row_job_init(const L *y, const T *g, long long i, double z, xf_rowjob *job)
{
    const double s = g != nullptr ? 1.0 * static_cast<double>(g[i]) : 1.0;
    xf_rowjob_init(job, y != nullptr ? y[i] : -1, 1.0, 0.0, z, s, 1.0, y == nullptr);
}

// _xent.pyx's _xent_one_row (row_job_init's job).  Returns the row's loss.
template <typename T, typename L>
double xent_one_row(const T *x, const L *y, const T *t, const T *g, long long i, long long C, double z,
                    T *grad, xf_row_scratch *scratch)
{
    if (y != nullptr && y[i] == kSkip) {
        if (grad != nullptr) {
            fill(grad + i * C, C, 0.0);
        }
        return 0.0;
    }
    xf_rowjob job;
    row_job_init<T, L>(y, g, i, z, &job);
    return Tables<T>::softmax()->xent_row(x + i * C, grad != nullptr ? grad + i * C : nullptr, C, &job,
                                          t != nullptr ? t + i * C : nullptr, nullptr, scratch);
}

// _xent.pyx's _xent_rows_forward: the losses without a gradient of rows [i0, i0 + n), n <= XF_GROUP_ROWS,
// but those whose bit r is set in done, the rows' logarithms side by side (xf_xent_rows_forward,
// softmax_rows.h: the row kernel's bits)
template <typename T, typename L>
void xent_rows_forward(const T *x, const L *y, const T *t, long long C, double z, long long i0, long long n,
                       unsigned done, T *loss)
{
    xf_rowjob jobs[XF_GROUP_ROWS];
    long long rows[XF_GROUP_ROWS];
    double losses[XF_GROUP_ROWS];
    int n_left = 0;
    for (long long i = i0; i < i0 + n; ++i) {
        if ((done >> (i - i0)) & 1u) {
            continue;
        }
        if (y != nullptr && y[i] == kSkip) {
            loss[i] = static_cast<T>(0.0);
            continue;
        }
        row_job_init<T, L>(y, nullptr, i, z, &jobs[n_left]);
        rows[n_left++] = i;
    }
    if (n_left > 0) {
        Tables<T>::softmax()->xent_rows_forward(x, t, C, rows, n_left, jobs, nullptr, losses);
    }
    for (int r = 0; r < n_left; ++r) {
        loss[rows[r]] = static_cast<T>(losses[r]);  // the NumPy API's astype, as below
    }
}

// _xent.pyx's _xent_row_group: rows of index targets (z: the z-loss), XF_GROUP_ROWS at a time side by
// side where they qualify (xf_short_rows, softmax_rows.h: the row kernel's bits), the rest one by one
// (without a gradient, as a batch: xent_rows_forward).
// The group takes the skip label as its ignore_index, labels widened to int64 and the upstream factors
// to double, the row kernel's scale 1 * g[i] (exact) as the group's scale 1 times its row factor.
template <typename T, typename L>
void xent_row_groups(const T *x, const L *y, const T *g, long long N, long long C, double z, T *loss, T *grad)
{
    const long long n_groups = (N + XF_GROUP_ROWS - 1) / XF_GROUP_ROWS;
    on_threads(threads_for(N * C), n_groups, [=](long long k) {
        const long long i0 = k * XF_GROUP_ROWS;
        const long long n = std::min(N - i0, static_cast<long long>(XF_GROUP_ROWS));
        int64_t labels[XF_GROUP_ROWS];
        double factors[XF_GROUP_ROWS], losses[XF_GROUP_ROWS];
        unsigned done = 0;
        if (n == XF_GROUP_ROWS) {
            for (long long r = 0; r < n; ++r) {
                labels[r] = y[i0 + r];
                factors[r] = g != nullptr ? static_cast<double>(g[i0 + r]) : 1.0;
            }
            done = Tables<T>::softmax()->short_rows(x + i0 * C, nullptr,
                                                    grad != nullptr ? grad + i0 * C : nullptr, C, 0, labels, kSkip,
                                                    nullptr, 1.0, 1.0, g != nullptr ? factors : nullptr, losses,
                                                    0.0, z, 1.0);
        }
        if (grad == nullptr && loss != nullptr) {
            // the rows the group hands back, their logarithms side by side (_xent.pyx's _xent_row_group)
            for (long long r = 0; r < n; ++r) {
                if ((done >> r) & 1u) {
                    loss[i0 + r] = static_cast<T>(losses[r]);
                }
            }
            xent_rows_forward<T, L>(x, y, nullptr, C, z, i0, n, done, loss);
            return;
        }
        // the rows left to the row kernel get a scratch row as xent_rows' do (float32 keeps its
        // exponentials there; without it they are evaluated twice), made only where one is left
        std::unique_ptr<xf_row_scratch, void (*)(xf_row_scratch *)> scratch(nullptr, xf_row_scratch_release);
        for (long long r = 0; r < n; ++r) {
            if (!((done >> r) & 1u)) {
                if (scratch == nullptr && xf_xent_wants_scratch(grad != nullptr, z != 0.0, sizeof(T) == sizeof(float),
                                                                0, C)) {
                    scratch.reset(xf_row_scratch_new(C));
                }
                losses[r] = xent_one_row<T, L>(x, y, nullptr, g, i0 + r, C, z, grad, scratch.get());
            }
            if (loss != nullptr) {
                loss[i0 + r] = static_cast<T>(losses[r]);  // the NumPy API's astype, as below
            }
        }
    });
}

template <typename T, typename L>
void xent_rows(const T *x, const L *y, const T *t, const T *g, long long N, long long C, double z,
               T *loss, T *grad)
{
    if (y != nullptr && C <= XF_GROUP_MAX_C) {
        xent_row_groups<T, L>(x, y, g, N, C, z, loss, grad);
        return;
    }
    const int nt = threads_for(N * C);
    if (grad == nullptr && loss != nullptr && xf_forward_in_batches(N, C, nt)) {
        // the losses alone, XF_GROUP_ROWS rows a task (_xent.pyx's _xent_rows)
        on_threads(nt, (N + XF_GROUP_ROWS - 1) / XF_GROUP_ROWS, [=](long long k) {
            const long long i0 = k * XF_GROUP_ROWS;
            xent_rows_forward<T, L>(x, y, t, C, z, i0, std::min(N - i0, static_cast<long long>(XF_GROUP_ROWS)), 0u,
                                    loss);
        });
        return;
    }
    // exponentials kept between passes (xent_kernels.h: the general gradient's, every float32 row's,
    // long float64 stored rows'); no label smoothing here
    const bool want_scratch = xf_xent_wants_scratch(grad != nullptr, t != nullptr || z != 0.0,
                                                    sizeof(T) == sizeof(float), 0, C);
    // a gradient buffer whose pages are not mapped in yet takes ordinary stores (xf_pending_stream); only
    // calls whose rows may stream look
    const bool may_stream = want_scratch && grad != nullptr && cpu_path() != XF_PATH_BASELINE &&
                            C >= XF_STREAM_MIN_CLASSES_FOR(sizeof(T) == sizeof(float), cpu_path());
    const bool grad_touched =
        !may_stream || xf_memory_touched(grad, static_cast<size_t>(N) * static_cast<size_t>(C) * sizeof(T));
#pragma omp parallel num_threads(nt)
    {
    IeeeDenormals ieee;
    // released on this thread after its last row: that writes the last long row's pending gradient
    // (xf_row_scratch)
    std::unique_ptr<xf_row_scratch, void (*)(xf_row_scratch *)> scratch(
        want_scratch ? xf_row_scratch_new(C) : nullptr, xf_row_scratch_release);
    if (!grad_touched) {
        xf_row_scratch_new_output(scratch.get());
    }
#pragma omp for schedule(guided)
    for (long long i = 0; i < N; ++i) {
        const double l = xent_one_row<T, L>(x, y, t, g, i, C, z, grad, scratch.get());
        if (loss != nullptr) {
            loss[i] = static_cast<T>(l);  // the NumPy API's astype: one rounding, inf beyond the range
        }
    }
    }
}

// The labels' gradient of the probability-target loss: -g_i log_softmax(x)_ij.  log_softmax is
// _xent.pyx's _softmax_family_row, mode 1, no logsumexp output; the product rounds once in T, as
// NumPy's -(g[:, None] * xentfast.log_softmax(x)) does.
template <typename T>
void labels_grad_rows(const T *g, const T *x, T *out, long long N, long long C)
{
    const auto *K = Tables<T>::softmax();
    on_threads(threads_for(N * C), N, [=](long long i) {
        xf_rowjob job;
        xf_rowjob_init(&job, -1, 1.0, 0.0, 0.0, 1.0, 1.0, 1);
        K->row_max(x + i * C, C, &job);
        K->row_sum(x + i * C, C, &job);
        if (job.status != XF_ROW_OK) {
            fill(out + i * C, C, XF_NAN);
        } else {
            for (long long b0 = 0; b0 < C; b0 += XF_BLOCK) {
                const long long blen = std::min(C - b0, static_cast<long long>(XF_BLOCK));
                K->log_softmax_block(x + i * C + b0, out + i * C + b0, blen, job.m, job.log_s, job.exp_normal == 1);
            }
        }
        const T gi = g[i];
        for (long long j = 0; j < C; ++j) {
            out[i * C + j] = -(gi * out[i * C + j]);
        }
    });
}

// _binary.pyx's elementwise(OP_BCE_LOGITS) with no weights, no ignore value, scale 1; the upstream
// factor per element in x's dtype, which the kernel reads as the NumPy API hands it over (float64 as it
// is, float32 widened block by block)
template <typename T>
void bce_elements(const T *x, const T *y, const T *g, long long n, T *loss, T *grad)
{
    const auto *K = Tables<T>::binary();
    xf_bin_args a;
    a.w = nullptr;
    a.w_div = 1;
    a.w_mod = 1;
    a.w_full = 0;
    a.pw = nullptr;
    a.pw_div = 1;
    a.pw_mod = 1;
    a.pw_full = 0;
    if constexpr (std::is_same<T, float>::value) {
        a.g = nullptr;
        a.g_f32 = g;
    } else {
        a.g = g;
        a.g_f32 = nullptr;
    }
    a.scale = 1.0;
    a.has_ignore = 0;
    a.ignore = 0.0;
    a.alpha = 0.25;
    a.gamma = 2.0;
    a.loss_k = 0.0;
    a.part = nullptr;
    a.unit_fail = nullptr;  // the JAX front end checks the targets before the handler runs
    xf_bin_prob_mode_init(&a.mode, 0, 0.0, 0, 0.0, 0.0, 1.0);
    const long long nb = (n + XF_BIN_BLOCK - 1) / XF_BIN_BLOCK;
    on_threads(threads_for(n), nb, [&](long long b) {
        const long long off = b * XF_BIN_BLOCK;
        const long long blen = std::min(n - off, static_cast<long long>(XF_BIN_BLOCK));
        K->bce_logits_block(x, y, off, blen, &a, nullptr, loss, grad);
    });
}

// The labels' gradient of the binary loss, -g x: the loss is linear in y with slope exactly -x
template <typename T>
void neg_product(const T *g, const T *x, T *out, long long n)
{
    on_threads(threads_for(n), n, [=](long long i) { out[i] = -(g[i] * x[i]); });
}

template <typename T>
T *data(ffi::AnyBuffer b)
{
    return static_cast<T *>(b.untyped_data());
}

ffi::Error unsupported(const char *what, ffi::DataType t)
{
    return ffi::Error::InvalidArgument(std::string("xentfast: no kernel for ") + what + " of XLA dtype " +
                                       std::to_string(static_cast<int>(t)));
}

// y: int32 labels (int64 for more than 2^31 - 1 classes), one per row, or probabilities of x's dtype and shape; g: the per-row upstream factor
// (backward) or null (forward)
template <typename T>
ffi::Error xent(const T *g, ffi::AnyBuffer x, ffi::AnyBuffer y, T *loss, T *grad, double z)
{
    IeeeDenormals ieee;
    long long N, C;
    rows_of(x, &N, &C);
    if (N == 0 || C == 0) {
        return ffi::Error::Success();
    }
    // int32 labels, or int64 where the class axis passes int32's range (jax.py, x64 enabled)
    if (y.element_type() == ffi::DataType::S32) {
        xent_rows<T, int32_t>(data<const T>(x), data<const int32_t>(y), nullptr, g, N, C, z, loss, grad);
    } else if (y.element_type() == ffi::DataType::S64) {
        xent_rows<T, int64_t>(data<const T>(x), data<const int64_t>(y), nullptr, g, N, C, z, loss, grad);
    } else if (y.element_type() == x.element_type()) {
        xent_rows<T, int32_t>(data<const T>(x), nullptr, data<const T>(y), g, N, C, z, loss, grad);
    } else {
        return unsupported("labels", y.element_type());
    }
    return ffi::Error::Success();
}

ffi::Error XentFwdImpl(ffi::AnyBuffer x, ffi::AnyBuffer y, ffi::Result<ffi::AnyBuffer> loss, double z)
{
    switch (x.element_type()) {
    case ffi::DataType::F32:
        return xent<float>(nullptr, x, y, data<float>(*loss), nullptr, z);
    case ffi::DataType::F64:
        return xent<double>(nullptr, x, y, data<double>(*loss), nullptr, z);
    default:
        return unsupported("logits", x.element_type());
    }
}

ffi::Error XentBwdImpl(ffi::AnyBuffer g, ffi::AnyBuffer x, ffi::AnyBuffer y, ffi::Result<ffi::AnyBuffer> dx,
                       double z)
{
    if (g.element_type() != x.element_type()) {
        return unsupported("the cotangent", g.element_type());
    }
    switch (x.element_type()) {
    case ffi::DataType::F32:
        return xent<float>(data<const float>(g), x, y, nullptr, data<float>(*dx), z);
    case ffi::DataType::F64:
        return xent<double>(data<const double>(g), x, y, nullptr, data<double>(*dx), z);
    default:
        return unsupported("logits", x.element_type());
    }
}

ffi::Error XentDtImpl(ffi::AnyBuffer g, ffi::AnyBuffer x, ffi::Result<ffi::AnyBuffer> dt)
{
    IeeeDenormals ieee;
    long long N, C;
    rows_of(x, &N, &C);
    if (N == 0 || C == 0) {
        return ffi::Error::Success();
    }
    if (g.element_type() != x.element_type()) {
        return unsupported("the cotangent", g.element_type());
    }
    switch (x.element_type()) {
    case ffi::DataType::F32:
        labels_grad_rows<float>(data<const float>(g), data<const float>(x), data<float>(*dt), N, C);
        return ffi::Error::Success();
    case ffi::DataType::F64:
        labels_grad_rows<double>(data<const double>(g), data<const double>(x), data<double>(*dt), N, C);
        return ffi::Error::Success();
    default:
        return unsupported("logits", x.element_type());
    }
}

template <typename T>
ffi::Error bce(const T *g, ffi::AnyBuffer x, ffi::AnyBuffer y, T *loss, T *grad)
{
    if (y.element_type() != x.element_type()) {
        return unsupported("labels", y.element_type());
    }
    const long long n = static_cast<long long>(x.element_count());
    if (n == 0) {
        return ffi::Error::Success();
    }
    bce_elements<T>(data<const T>(x), data<const T>(y), g, n, loss, grad);
    return ffi::Error::Success();
}

ffi::Error BceFwdImpl(ffi::AnyBuffer x, ffi::AnyBuffer y, ffi::Result<ffi::AnyBuffer> loss)
{
    switch (x.element_type()) {
    case ffi::DataType::F32:
        return bce<float>(nullptr, x, y, data<float>(*loss), nullptr);
    case ffi::DataType::F64:
        return bce<double>(nullptr, x, y, data<double>(*loss), nullptr);
    default:
        return unsupported("logits", x.element_type());
    }
}

ffi::Error BceBwdImpl(ffi::AnyBuffer g, ffi::AnyBuffer x, ffi::AnyBuffer y, ffi::Result<ffi::AnyBuffer> dx)
{
    if (g.element_type() != x.element_type()) {
        return unsupported("the cotangent", g.element_type());
    }
    switch (x.element_type()) {
    case ffi::DataType::F32:
        return bce<float>(data<const float>(g), x, y, nullptr, data<float>(*dx));
    case ffi::DataType::F64:
        return bce<double>(data<const double>(g), x, y, nullptr, data<double>(*dx));
    default:
        return unsupported("logits", x.element_type());
    }
}

ffi::Error BceDyImpl(ffi::AnyBuffer g, ffi::AnyBuffer x, ffi::Result<ffi::AnyBuffer> dy)
{
    IeeeDenormals ieee;
    if (g.element_type() != x.element_type()) {
        return unsupported("the cotangent", g.element_type());
    }
    const long long n = static_cast<long long>(x.element_count());
    switch (x.element_type()) {
    case ffi::DataType::F32:
        neg_product<float>(data<const float>(g), data<const float>(x), data<float>(*dy), n);
        return ffi::Error::Success();
    case ffi::DataType::F64:
        neg_product<double>(data<const double>(g), data<const double>(x), data<double>(*dy), n);
        return ffi::Error::Success();
    default:
        return unsupported("logits", x.element_type());
    }
}

}  // namespace

XLA_FFI_DEFINE_HANDLER_SYMBOL(XfXentFwd, XentFwdImpl,
                              ffi::Ffi::Bind().Arg<ffi::AnyBuffer>().Arg<ffi::AnyBuffer>()
                                  .Ret<ffi::AnyBuffer>().Attr<double>("z"));
XLA_FFI_DEFINE_HANDLER_SYMBOL(XfXentBwd, XentBwdImpl,
                              ffi::Ffi::Bind().Arg<ffi::AnyBuffer>().Arg<ffi::AnyBuffer>().Arg<ffi::AnyBuffer>()
                                  .Ret<ffi::AnyBuffer>().Attr<double>("z"));
XLA_FFI_DEFINE_HANDLER_SYMBOL(XfXentDt, XentDtImpl,
                              ffi::Ffi::Bind().Arg<ffi::AnyBuffer>().Arg<ffi::AnyBuffer>().Ret<ffi::AnyBuffer>());
XLA_FFI_DEFINE_HANDLER_SYMBOL(XfBceFwd, BceFwdImpl,
                              ffi::Ffi::Bind().Arg<ffi::AnyBuffer>().Arg<ffi::AnyBuffer>().Ret<ffi::AnyBuffer>());
XLA_FFI_DEFINE_HANDLER_SYMBOL(XfBceBwd, BceBwdImpl,
                              ffi::Ffi::Bind().Arg<ffi::AnyBuffer>().Arg<ffi::AnyBuffer>().Arg<ffi::AnyBuffer>()
                                  .Ret<ffi::AnyBuffer>());
XLA_FFI_DEFINE_HANDLER_SYMBOL(XfBceDy, BceDyImpl,
                              ffi::Ffi::Bind().Arg<ffi::AnyBuffer>().Arg<ffi::AnyBuffer>().Ret<ffi::AnyBuffer>());

// ---- the Python module: {target name: PyCapsule of the handler}, and the jaxlib it was built for ----

static PyObject *targets(PyObject *, PyObject *)
{
    static const struct {
        const char *name;
        void *fn;
    } table[] = {
        {"xentfast_xent_fwd", reinterpret_cast<void *>(XfXentFwd)},
        {"xentfast_xent_bwd", reinterpret_cast<void *>(XfXentBwd)},
        {"xentfast_xent_dt", reinterpret_cast<void *>(XfXentDt)},
        {"xentfast_bce_fwd", reinterpret_cast<void *>(XfBceFwd)},
        {"xentfast_bce_bwd", reinterpret_cast<void *>(XfBceBwd)},
        {"xentfast_bce_dy", reinterpret_cast<void *>(XfBceDy)},
    };
    PyObject *d = PyDict_New();
    if (d == nullptr) {
        return nullptr;
    }
    for (const auto &t : table) {
        PyObject *cap = PyCapsule_New(t.fn, nullptr, nullptr);
        if (cap == nullptr || PyDict_SetItemString(d, t.name, cap) < 0) {
            Py_XDECREF(cap);
            Py_DECREF(d);
            return nullptr;
        }
        Py_DECREF(cap);
    }
    return d;
}

static PyMethodDef methods[] = {
    {"targets", targets, METH_NOARGS, "FFI target names mapped to PyCapsules of their CPU handlers."},
    {nullptr, nullptr, 0, nullptr},
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT, "_xla_ffi",
    "XLA FFI handlers (CPU) for xentfast.jax; JAXLIB_VERSION is the jaxlib whose headers built them.", -1,
    methods,
};

// The kernel tables a Cython module exports ((a)), or null with an ImportError set (xentfast.jax then
// uses its callbacks): a module without them is a build this one was not made with
static const void *kernel_exports(const char *module_name, const char *capsule_name)
{
    PyObject *mod = PyImport_ImportModule(module_name);
    if (mod == nullptr) {
        return nullptr;
    }
    PyObject *cap = PyObject_GetAttrString(mod, "_kernel_exports");
    Py_DECREF(mod);
    // the pointer outlives the capsule: it points to the module's static data, and extension modules
    // are never unloaded
    const void *p = cap != nullptr ? PyCapsule_GetPointer(cap, capsule_name) : nullptr;
    Py_XDECREF(cap);
    if (p == nullptr) {
        PyErr_Format(PyExc_ImportError, "xentfast._core._xla_ffi: %s exports no kernel tables named %s",
                     module_name, capsule_name);
    }
    return p;
}

PyMODINIT_FUNC PyInit__xla_ffi(void)
{
    softmax_exports = static_cast<const xf_softmax_exports *>(
        kernel_exports("xentfast._core._xent", "xentfast._core._xent._kernel_exports"));
    if (softmax_exports == nullptr) {
        return nullptr;
    }
    binary_exports = static_cast<const xf_binary_exports *>(
        kernel_exports("xentfast._core._binary", "xentfast._core._binary._kernel_exports"));
    if (binary_exports == nullptr) {
        return nullptr;
    }
    PyObject *m = PyModule_Create(&module);
    if (m == nullptr) {
        return nullptr;
    }
    if (PyModule_AddStringConstant(m, "JAXLIB_VERSION", XF_JAXLIB_VERSION) < 0 ||
        PyModule_AddIntConstant(m, "FFI_API_MAJOR", XLA_FFI_API_MAJOR) < 0 ||
        PyModule_AddIntConstant(m, "FFI_API_MINOR", XLA_FFI_API_MINOR) < 0) {
        Py_DECREF(m);
        return nullptr;
    }
    return m;
}
