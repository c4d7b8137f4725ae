/* CPU kernels of the softmax family: the block kernels of softmax_rows.h instantiated for float (f32)
 * and double (f64) storage and for each CPU code path, and their dispatch tables.  The per-row
 * bookkeeping they share with the CUDA kernels is xentfast/softmax_row.h.  The Cython layer decides
 * who runs which block.
 */
#ifndef XENTFAST_XENT_KERNELS_H
#define XENTFAST_XENT_KERNELS_H

#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#if defined(__linux__)
#include <sys/mman.h>
#include <unistd.h>
#endif

#include "xentfast/softmax_row.h"

/* ---- instantiation: storage type x CPU code path ----------------------------------------------------
 * The baseline path is compiled here, for the build's target (x86-64: SSE2).  On x86-64 with gcc or
 * clang, setup.py also compiles avx2_softmax.c, which defines XF_AVX2_PATH_UNIT and includes this header
 * with -mavx2 -mfma, into a static library linked into every extension that includes this header, and
 * defines XF_AVX2_PATH_BUILT for them.  That path is chosen at import when the CPU has AVX2 and FMA
 * (xentfast._core._xent.cpu_path(); XENTFAST_CPU=baseline|avx2|avx512 overrides).  It is a translation
 * unit of its own, not a target attribute, because xf_fma (xentfast/xf_math.h) must be the fma
 * instruction in the kernels of that path and its exact emulation in the baseline ones, and the header's
 * inline functions are compiled once per unit.  Contraction is off in the whole build and xf_fma rounds
 * once on every path, so they produce the SAME bits: the wider vectors and the fma instruction change
 * speed, never an operation's rounding (tests/test_dispatch.py).
 * A third path, avx512 (avx512_softmax.c: the same source with AVX-512 F/DQ/VL/BW besides AVX2 and FMA,
 * and 512-bit vectors preferred, XF_AVX512_PATH_UNIT / XF_AVX512_PATH_BUILT), is chosen on CPUs that have
 * all of them: its loops run 8 double lanes per instruction instead of 4, and the same bits again
 * (12-15 % off the large fused rows, benchmarks/README.md, 2026-12-04 late).  Of the explicit intrinsics
 * of softmax_rows.h, the float32 max pass and the float32 pending gradient's stores have 512-bit forms
 * there; the float64 ones stay the AVX2 path's 256-bit code. */
#if defined(XF_AVX2_PATH_BUILT) && XF_AVX2_PATH_BUILT && (defined(__x86_64__) || defined(__i386__))
#define XF_HAVE_AVX2_PATH 1
#else
#define XF_HAVE_AVX2_PATH 0
#endif
#if XF_HAVE_AVX2_PATH && defined(XF_AVX512_PATH_BUILT) && XF_AVX512_PATH_BUILT
#define XF_HAVE_AVX512_PATH 1
#else
#define XF_HAVE_AVX512_PATH 0
#endif

/* A row driver's per-thread memory for xf_xent_row (softmax_rows.h): `row`, C doubles, where rows keep
 * exponentials between passes, and a long simple row (float64: of the stored form) whose gradient is still
 * being written
 * (XF_STREAMED_ROWS): the next row's sum pass writes it a chunk at a time between its exponentials, so
 * the gradient's stores overlap that pass's arithmetic instead of following it.  A driver makes one per
 * thread with xf_row_scratch_new, passes it to every row that thread runs, and after the last of them
 * calls xf_row_scratch_release on that thread, which completes the pending gradient: before it the
 * output is not whole. */
typedef struct xf_row_scratch {
    double *row;
    void *row_block; /* malloc's block, which holds `row` on a 64-byte boundary */
    /* the pending gradient, when `pending`: out_j = (kept_j * factor) * factor2 rounded to the storage type
     * for j in [done, n), but out[target] = target_grad.  `write` (set by the unit that left
     * one, else NULL) writes the rest, and with `fence` orders the streaming stores of every row it left
     * (`streaming`) before the caller's next reads. */
    int pending;
    int streaming; /* write by streaming stores (1, the default) or ordinary ones (xf_row_scratch_new_output) */
    void (*write)(struct xf_row_scratch *, int fence);
    const double *kept; /* exp(x_j - m) as the sum pass made them, for either storage type */
    void *out;
    long long n, done, target;
    double factor, factor2, target_grad;
    /* The next row's max pass, made during this row's sum pass (softmax_rows.h, xf_next_max): `x_end`
     * the end of the input the driver runs (NULL: no row is read ahead), `next_row` the row whose lanes
     * `next_lanes` hold (the storage type's max, min and inf/NaN marker; NULL: none), `next_done` the
     * entries they cover from its start. */
    const void *x_end;
    const void *next_row;
    long long next_done;
    double next_lanes[48];
} xf_row_scratch;

/* NULL when either allocation fails: the rows then run without scratch, to the same bits */
static inline xf_row_scratch *xf_row_scratch_new(long long n_classes)
{
    xf_row_scratch *s = (xf_row_scratch *)malloc(sizeof(xf_row_scratch));
    if (s == NULL) {
        return NULL;
    }
    /* `row` on a 64-byte boundary: the kernels read and write it in 512-bit (or 256-bit) vectors, and
     * where malloc's 16-byte alignment put it at 16 or 48 bytes into a line (or at 8, 24, ...), AMD's Zen 4
     * took 30-35 % longer over fused float32 rows of 32000 classes than at 0 or 32, the 256-bit halves then
     * straddling lines (one thread, 2048x32000, 39 against 52 ms; benchmarks/README.md, 2026-12-05, ninth
     * round).  Intel's CPU model 207 showed no difference. */
    s->row_block = malloc((size_t)n_classes * sizeof(double) + 64);
    if (s->row_block == NULL) {
        free(s);
        return NULL;
    }
    s->row = (double *)(((uintptr_t)s->row_block + 63) & ~(uintptr_t)63);
    s->pending = 0;
    s->streaming = 1;
    s->write = NULL;
    s->x_end = NULL;
    s->next_row = NULL;
    return s;
}

/* Lets the rows run with `s` read the next row's entries during their sum pass (its max pass then
 * costs no pass of its own), for an input that ends at x_end and that no thread writes during the call
 * (not a gradient written in place). */
static inline void xf_row_scratch_read_ahead(xf_row_scratch *s, const void *x_end)
{
    if (s != NULL) {
        s->x_end = x_end;
    }
}

/* The rows run with `s` write into an array made for this call, whose pages no store has touched yet:
 * pending rows then go out by ordinary stores (softmax_rows.h, xf_pending_stream) */
static inline void xf_row_scratch_new_output(xf_row_scratch *s)
{
    if (s != NULL) {
        s->streaming = 0;
    }
}

/* Whether the pages that hold the byte a page into [p, p + n) and its last byte have been touched (mapped
 * in): an array the caller keeps and passes again has; a new array of more than the allocator's mmap
 * threshold (glibc: up to 32 MiB) comes as fresh pages each time and has not, but for its first page,
 * where the allocator wrote its header.  1 where it cannot be told (mincore is Linux's here).  A hint for
 * the choice of stores, xf_row_scratch_new_output: no result depends on it. */
static inline int xf_memory_touched(const void *p, size_t n)
{
#if defined(__linux__)
    const long page = sysconf(_SC_PAGESIZE);
    if (page > 0 && n > 0) {
        const uintptr_t mask = ~(uintptr_t)(page - 1);
        unsigned char first = 1, last = 1;
        const size_t into = (n > (size_t)page) ? (size_t)page : 0;
        if (mincore((void *)(((uintptr_t)p + into) & mask), 1, &first) != 0 ||
            mincore((void *)(((uintptr_t)p + n - 1) & mask), 1, &last) != 0) {
            return 1;
        }
        return (first & 1) && (last & 1);
    }
#else
    (void)p;
    (void)n;
#endif
    return 1;
}

/* Completes a pending gradient, so that the scratch row is free again (xf_xent_row) */
static inline void xf_row_scratch_finish(xf_row_scratch *s)
{
    if (s != NULL && s->pending) {
        s->write(s, 0);
    }
}

static inline void xf_row_scratch_release(xf_row_scratch *s)
{
    if (s != NULL) {
        if (s->write != NULL) {
            s->write(s, 1);
        }
        free(s->row_block);
        free(s);
    }
}

/* One table of entry points per storage type; the Cython driver calls only through these. */
#define XF_DECLARE_TABLE(T, SFX)                                                                          \
    typedef struct {                                                                                      \
        void (*max_block)(const T *, long long, long long, xf_rowmax *);                                 \
        void (*sumexp_block)(const T *, long long, double, long long, int, double *, double *, T *);     \
        void (*terms_block)(const T *, long long, long long, const xf_rowjob *, const T *, const double *, \
                            double *);                                                                    \
        void (*grad_block)(const T *, T *, long long, long long, const xf_rowjob *, const T *,            \
                           const double *, const double *);                                               \
        void (*row_max)(const T *, long long, xf_rowjob *);                                              \
        void (*row_sum)(const T *, long long, xf_rowjob *);                                              \
        double (*xent_row)(const T *, T *, long long, xf_rowjob *, const T *, const double *,            \
                           xf_row_scratch *);                                                             \
        void (*row_z_lse)(const T *, long long, xf_rowjob *, const T *, const double *, double *);       \
        void (*log_softmax_block)(const T *, T *, long long, double, double, int);                       \
        unsigned (*short_rows)(const T *, const T *, T *, long long, long long, const int64_t *,         \
                               long long, const double *, double, double, const double *, double *, double,  \
                               double, double);                                                           \
        unsigned (*short_rows_family)(const T *, T *, double *, long long, long long, int);              \
        void (*xent_rows_forward)(const T *, const T *, long long, const long long *, int, xf_rowjob *,    \
                                  const double *, double *);                                              \
        void (*rows_max_sum)(const T *, long long, const long long *, int, xf_rowjob *);                  \
    } xf_softmax_table_##SFX;
XF_DECLARE_TABLE(float, f32)
XF_DECLARE_TABLE(double, f64)
#undef XF_DECLARE_TABLE

/* rows per short-row group (softmax_rows.h, xf_short_rows), and the transposed buffer's classes: the
 * widest group of any path (XF_GROUP_C_LIMIT, the avx512 path's float32 rows without a gradient); the
 * drivers send rows up to it to the groups, which hand back the rows their path does not take */
#define XF_GROUP_ROWS 8
#define XF_GROUP_MAX_C 512
/* independent running max, min and argmax chains in a group's statistics (xf_group_max), on the groups
 * XF_GROUP_CHAINS_FROM_C (softmax_rows.h) gives them */
#define XF_GROUP_CHAINS 4

enum { XF_PATH_BASELINE = 0, XF_PATH_AVX2 = 1, XF_PATH_AVX512 = 2 };

/* What _xent exports (a PyCapsule, _xent._kernel_exports) to the XLA FFI handlers (_xla_ffi.cc), which
 * call these kernels through it instead of compiling a copy of their own: the same machine code serves
 * both, and the handlers follow the path _xent.set_cpu_path selects (current_path, read at every call). */
typedef struct {
    const int *current_path;
    const xf_softmax_table_f32 *(*f32)(int path);
    const xf_softmax_table_f64 *(*f64)(int path);
} xf_softmax_exports;

/* Rows of at least this many classes write their gradient by streaming stores (or, into a new array,
 * ordinary ones) during the next row's sum pass, where the kernels are compiled for AVX2 (softmax_rows.h,
 * XF_STREAMED_ROWS), the exponentials kept in the scratch row below meanwhile: float32 rows from 1024
 * classes on the avx2 path and from 256 on the avx512 path (whose short-row groups take the rows of up to
 * 448 classes with a gradient, so in effect every row its row path gets), float64 stored rows from 2048
 * (16 KB).
 * Measured (benchmarks/README.md, 2026-12-04; float32 again in 2026-12-05, eighth round, once a row's
 * last partial line no longer went out by streaming stores): streaming pays where the logits come from
 * memory (two threads, 1 GB: avx512 512 / 700 classes 10 / 22 % faster from 512, avx2 520 / 700 classes
 * 10 % faster), and costs the avx2 path 5-6 % at 520-700 classes where they sit in the L3 cache (16-17
 * MB, one thread), the avx512 path nothing measurable.  Streamed from 256 classes, the avx512 path gained
 * 8-18 % at 460 classes from memory and stayed within noise in the cache; the avx2 path lost 2-7 % at
 * 300-500 in the cache and gained nothing at 300 from memory.  float64 streamed from 1024 classes (avx512) gained 5 % from memory and lost 2-6 % in
 * the cache.  The drivers (_xent.pyx, _xla_ffi.cc) ask with the path they run (XF_PATH_*); a path's own
 * unit knows its own. */
#define XF_STREAM_MIN_CLASSES_FOR(storage_is_float, path) \
    ((storage_is_float) ? (((path) == XF_PATH_AVX512) ? 256LL : 1024LL) : 2048LL)
#if defined(XF_AVX512_PATH_UNIT)
#define XF_STREAM_MIN_CLASSES(storage_is_float) XF_STREAM_MIN_CLASSES_FOR(storage_is_float, XF_PATH_AVX512)
#else
#define XF_STREAM_MIN_CLASSES(storage_is_float) XF_STREAM_MIN_CLASSES_FOR(storage_is_float, XF_PATH_AVX2)
#endif

/* Whether a row driver hands xf_xent_row a scratch row of C doubles per thread (softmax_rows.h): the
 * general gradient (probability targets, label smoothing, the z-loss) keeps exponentials there, float64
 * rows in their own gradient buffer unless that buffer is the logits; every float32 row keeps its
 * exponentials there as doubles (a float32 buffer would round them), and so do float64 stored rows of
 * XF_STREAM_MIN_CLASSES or more (the baseline path, which has no streaming stores, leaves that memory
 * unused for float64).  The Cython drivers and the FFI handlers both ask here.  With a gradient, the main
 * Cython driver's rows of XF_READ_AHEAD_MIN_CLASSES or more also keep the next row's max lanes there
 * (xf_next_max, xf_row_scratch_read_ahead): measured, reading ahead made fused float32 rows of 32000 and
 * 128256 classes 10-15 % faster, fused rows of 300-1000 classes, whose separate max pass is cheap, ~10 %
 * slower, and the forward pass alone no faster (benchmarks/README.md, 2026-12-05, fourth round; on AMD
 * Zen 5 15-17 % slower at 32000 and 128256 classes, 2026-12-07, later). */
#ifndef XF_READ_AHEAD_MIN_CLASSES
#define XF_READ_AHEAD_MIN_CLASSES 8192
#endif
/* ...and no scratch row for rows beyond XF_SCRATCH_MAX_CLASSES: its C doubles would then pass 32 MiB,
 * the most glibc's malloc ever serves from its heap (the dynamic mmap threshold's ceiling), so every call
 * would map fresh pages and fault each one in (~0.5 us per 4 KiB page here).  Such rows evaluate their
 * exponentials again, to the same bits: fused 1x8388608 float32 one thread 25.6-28.9 -> 12.6 ms,
 * 2x4194309 two threads 13.4-14.4 -> 6.2-6.5 ms (benchmarks/README.md, 2026-12-05, sixth round). */
#define XF_SCRATCH_MAX_CLASSES ((1LL << 22) - 1024)
static inline int xf_xent_wants_scratch(int has_grad, int general, int storage_is_float, int grad_is_logits,
                                        long long n_classes)
{
    return has_grad && n_classes <= XF_SCRATCH_MAX_CLASSES &&
           (storage_is_float || (general && grad_is_logits) || n_classes >= XF_STREAM_MIN_CLASSES(storage_is_float));
}

/* Whether a row driver hands out the losses without a gradient XF_GROUP_ROWS rows a task (softmax_rows.h,
 * xf_xent_rows_forward and xf_rows_max_sum: the rows' logarithms side by side) rather than one: rows of up
 * to XF_FORWARD_BATCH_MAX_C classes, in calls of at least XF_FORWARD_BATCHES_PER_THREAD such tasks per
 * thread (fewer rows go one a task, so that a call of a few long rows still gives each thread its share).
 * One logarithm is ~30 ns of a row's ~370 at 1000 float32 classes, nothing measurable at 32000, and the
 * batches measured 4 % slower at 2048x128256 float32 on two threads (within that VM's noise;
 * benchmarks/README.md, 2026-12-07, third round).  The Cython drivers (the losses, logsumexp) and the FFI
 * handlers both ask here. */
#define XF_FORWARD_BATCH_MAX_C 8192
#define XF_FORWARD_BATCHES_PER_THREAD 8
static inline int xf_forward_in_batches(long long n_rows, long long n_classes, int n_threads)
{
    return n_classes <= XF_FORWARD_BATCH_MAX_C &&
           (n_rows + XF_GROUP_ROWS - 1) / XF_GROUP_ROWS >= (long long)XF_FORWARD_BATCHES_PER_THREAD * n_threads;
}

/* XF_KERNEL_TABLES_ONLY: the types above without the kernels (the FFI handlers' unit) */
#ifndef XF_KERNEL_TABLES_ONLY

#if defined(XF_AVX512_PATH_UNIT)
#define XF_SFX_F32 f32_avx512
#define XF_SFX_F64 f64_avx512
#elif defined(XF_AVX2_PATH_UNIT)
#define XF_SFX_F32 f32_avx2
#define XF_SFX_F64 f64_avx2
#else
#define XF_SFX_F32 f32
#define XF_SFX_F64 f64
#endif
#define XF_KERNEL static
#define XF_T float
#define XF_SFX XF_SFX_F32
#define XF_COMPENSATED 0
#include "softmax_rows.h"
#undef XF_T
#undef XF_SFX
#undef XF_COMPENSATED
#define XF_T double
#define XF_SFX XF_SFX_F64
#define XF_COMPENSATED 1
#include "softmax_rows.h"
#undef XF_T
#undef XF_SFX
#undef XF_COMPENSATED
#undef XF_KERNEL
#undef XF_SFX_F32
#undef XF_SFX_F64


#define XF_TABLE(SFX, PSFX)                                                                             \
    {xf_max_block_##PSFX, xf_sumexp_block_##PSFX, xf_xent_terms_block_##PSFX, xf_xent_grad_block_##PSFX, \
     xf_row_max_##PSFX, xf_row_sum_##PSFX, xf_xent_row_##PSFX, xf_row_z_lse_##PSFX, xf_log_softmax_block_##PSFX, \
     xf_short_rows_##PSFX, xf_short_rows_family_##PSFX, xf_xent_rows_forward_##PSFX, xf_rows_max_sum_##PSFX}
#if defined(XF_AVX512_PATH_UNIT)
/* the only symbols of the path's unit; hidden: each extension module links its own copy */
__attribute__((visibility("hidden"))) const xf_softmax_table_f32 xf_softmax_f32_avx512 = XF_TABLE(f32, f32_avx512);
__attribute__((visibility("hidden"))) const xf_softmax_table_f64 xf_softmax_f64_avx512 = XF_TABLE(f64, f64_avx512);
__attribute__((visibility("hidden"))) const int xf_avx512_fma_native = XF_FMA_NATIVE;
#elif defined(XF_AVX2_PATH_UNIT)
__attribute__((visibility("hidden"))) const xf_softmax_table_f32 xf_softmax_f32_avx2 = XF_TABLE(f32, f32_avx2);
__attribute__((visibility("hidden"))) const xf_softmax_table_f64 xf_softmax_f64_avx2 = XF_TABLE(f64, f64_avx2);
__attribute__((visibility("hidden"))) const int xf_avx2_fma_native = XF_FMA_NATIVE;
#else
static const xf_softmax_table_f32 xf_softmax_f32_baseline = XF_TABLE(f32, f32);
static const xf_softmax_table_f64 xf_softmax_f64_baseline = XF_TABLE(f64, f64);
#if XF_HAVE_AVX2_PATH
#ifdef __cplusplus
extern "C" {
#endif
__attribute__((visibility("hidden"))) extern const xf_softmax_table_f32 xf_softmax_f32_avx2;
__attribute__((visibility("hidden"))) extern const xf_softmax_table_f64 xf_softmax_f64_avx2;
__attribute__((visibility("hidden"))) extern const int xf_avx2_fma_native;
#if XF_HAVE_AVX512_PATH
__attribute__((visibility("hidden"))) extern const xf_softmax_table_f32 xf_softmax_f32_avx512;
__attribute__((visibility("hidden"))) extern const xf_softmax_table_f64 xf_softmax_f64_avx512;
__attribute__((visibility("hidden"))) extern const int xf_avx512_fma_native;
#endif
#ifdef __cplusplus
}
#endif
#endif
#undef XF_TABLE

/* Whether this CPU can run a path (the OS-support checks are part of __builtin_cpu_supports). */
static int xf_cpu_supports_path(int path)
{
    if (path == XF_PATH_BASELINE) {
        return 1;
    }
#if XF_HAVE_AVX2_PATH
    if (path == XF_PATH_AVX2) {
        __builtin_cpu_init();
        return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
    }
#endif
#if XF_HAVE_AVX512_PATH
    if (path == XF_PATH_AVX512) {
        __builtin_cpu_init();
        return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") &&
               __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512dq") &&
               __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512bw");
    }
#endif
    return 0;
}

/* Whether a path's xf_fma is the fma instruction (1) or the exact emulation (0): the same bits either
 * way, so only this tells a build whose AVX2+FMA unit lost its -mfma. */
static inline int xf_path_fma_native(int path)
{
#if XF_HAVE_AVX2_PATH
    if (path == XF_PATH_AVX2) {
        return xf_avx2_fma_native;
    }
#endif
#if XF_HAVE_AVX512_PATH
    if (path == XF_PATH_AVX512) {
        return xf_avx512_fma_native;
    }
#endif
    (void)path;
    return XF_FMA_NATIVE;
}

static const xf_softmax_table_f32 *xf_softmax_table_for_f32(int path)
{
#if XF_HAVE_AVX2_PATH
    if (path == XF_PATH_AVX2) {
        return &xf_softmax_f32_avx2;
    }
#endif
#if XF_HAVE_AVX512_PATH
    if (path == XF_PATH_AVX512) {
        return &xf_softmax_f32_avx512;
    }
#endif
    (void)path;
    return &xf_softmax_f32_baseline;
}

static const xf_softmax_table_f64 *xf_softmax_table_for_f64(int path)
{
#if XF_HAVE_AVX2_PATH
    if (path == XF_PATH_AVX2) {
        return &xf_softmax_f64_avx2;
    }
#endif
#if XF_HAVE_AVX512_PATH
    if (path == XF_PATH_AVX512) {
        return &xf_softmax_f64_avx512;
    }
#endif
    (void)path;
    return &xf_softmax_f64_baseline;
}

#endif /* no path unit */

#endif /* !XF_KERNEL_TABLES_ONLY */

#endif /* XENTFAST_XENT_KERNELS_H */
