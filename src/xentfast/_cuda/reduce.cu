/* xentfast/_cuda/reduce.cu: the reductions on the GPU (the double-double sum of losses, the `mean`
 * denominator of index targets), independent of the storage type; compiled once per device by
 * xentfast._cuda, with the options of kernels.cu (e).
 *
 * Design
 * (a) dd_sum has ONE shape, xentfast/ddsum.h, shared with the CPU (xentfast._core._xent.dd_sum): block
 *     partials of XF_DDSUM_BLOCK consecutive elements (xf_ddsum_block, called unchanged, one thread per
 *     block), then a fixed pairwise tree (xf_ddsum_merge) whose levels one CUDA block of threads runs
 *     between __syncthreads.  Every addition has the CPU's operands, so (hi, lo) has the CPU's bits for
 *     every launch shape.  Two launches on the caller's stream, no synchronization: the partials live in
 *     a scratch array of 2 * nb doubles.  A thread's block is 8 KiB of consecutive doubles: a warp's
 *     loads are not coalesced, but each 32-byte sector serves four consecutive iterations from L1, and
 *     65536 threads sum 2^26 elements (1024 additions each, in 8 independent lanes, not 2^26).
 * (b) target_weight_sum with class weights stays the CPU's index-order double-double sum (one thread;
 *     its bits are those of _xent.target_weight_sum, which is serial); labels outside [0, C) that are not
 *     ignore_index are skipped, so no label can read outside the weights (the API rejects such labels
 *     anyway).  Without weights the sum is a count, exact in any order: xentfast._cuda counts in
 *     parallel and does not launch this kernel.
 * (c) Host model (tests/cuda_model/binary_model.cpp): with XF_CUDA == 0 the tree runs with a team whose
 *     step(f) calls f(tid) for every tid in turn, as kernels.cu (f).
 */
#include "xentfast/ddsum.h"

#if defined(__CUDA_FTZ) && __CUDA_FTZ
#error "xentfast kernels must be compiled with -ftz=false (CuPy's compile path appends -ftz=true; see kernels.cu (e))"
#endif

#define XF_CU_TREE_THREADS 1024

/* as ddsum.h: xf_ddsum_tree, a level per step, the merges of a level spread over the team */
template <typename Team>
XF_HD void xf_cu_ddsum_tree(const Team &team, double *part, long long nb)
{
    const long long nt = team.nt;
    for (long long s = 1; s < nb; s *= 2) {
        team.step([&](int tid) {
            for (long long i = 2 * s * (long long)tid; i + s < nb; i += 2 * s * nt) {
                xf_ddsum_merge(part, i, s);
            }
        });
    }
}

/* as _xent.pyx: target_weight_sum, with the label range guard of (b) */
XF_HD double xf_cu_target_weight_sum(const long long *y, const double *w, long long n, long long ignore_index,
                                     long long C)
{
    double hi = 0.0, lo = 0.0;
    for (long long i = 0; i < n; i++) {
        const long long yi = y[i];
        if (yi != ignore_index && yi >= 0 && yi < C) {
            xf_dd_add(&hi, &lo, w ? w[yi] : 1.0, 0.0);
        }
    }
    return hi + lo;
}

#if XF_CUDA

/* step 1: partial b for b = thread index (grid-stride) */
__global__ void xf_ddsum_blocks_kernel(const double *v, long long n, long long nb, double *part)
{
    for (long long b = (long long)blockIdx.x * blockDim.x + threadIdx.x; b < nb;
         b += (long long)gridDim.x * blockDim.x) {
        xf_ddsum_block(v, n, b, part);
    }
}

struct xf_cu_reduce_team {
    int tid, nt;
    template <class F>
    __device__ __forceinline__ void step(F &&f) const
    {
        f(tid);
        __syncthreads();
    }
};

/* step 2: one CUDA block (any power-of-two size up to XF_CU_TREE_THREADS) merges the nb >= 1 partials
 * and writes out[0], out[1] = hi, lo */
__global__ void __launch_bounds__(XF_CU_TREE_THREADS) xf_ddsum_tree_kernel(double *part, long long nb, double *out)
{
    const xf_cu_reduce_team team = {(int)threadIdx.x, (int)blockDim.x};
    xf_cu_ddsum_tree(team, part, nb);
    if (threadIdx.x == 0) {
        out[0] = part[0];
        out[1] = part[1];
    }
}

/* out[0] = sum of w[y_i] (1 without weights) over rows with y_i in [0, C), y_i != ignore_index */
__global__ void xf_target_weight_sum_kernel(const long long *y, const double *w, long long n,
                                            long long ignore_index, long long C, double *out)
{
    if (blockIdx.x == 0 && threadIdx.x == 0) {
        out[0] = xf_cu_target_weight_sum(y, w, n, ignore_index, C);
    }
}

#endif /* XF_CUDA */
