/* IEEE subnormals on the calling thread, whatever the caller set.
 *
 * A caller may run with subnormals flushed: torch.set_flush_denormal(True) sets x86's MXCSR FTZ and DAZ
 * bits on its thread, XLA sets them on its CPU threads, and OpenMP workers inherit the state of the
 * thread that created them.  Every bound xentfast documents counts the subnormal spacing (a tiny loss or
 * gradient flushed to 0 is an error of many ULPs), so the kernels clear these bits for the time they run
 * and restore the caller's state afterwards: on the calling thread around the whole call, and in every
 * OpenMP thread inside each parallel region (each thread has its own control register).  Entering when
 * the bits are already clear changes nothing, so nesting is free.  Elsewhere (no known control
 * register) both calls do nothing.
 */
#ifndef XENTFAST_FP_IEEE_H
#define XENTFAST_FP_IEEE_H

#if defined(__x86_64__) || defined(_M_X64)
#include <xmmintrin.h>
#endif

typedef unsigned long long xf_fp_state;

#if defined(__x86_64__) || defined(_M_X64)
#define XF_FP_FLUSH_BITS 0x8040ULL /* MXCSR: flush-to-zero (bit 15), denormals-are-zero (bit 6) */
static inline xf_fp_state xf_fp_ieee_enter(void)
{
    xf_fp_state saved = (xf_fp_state)_mm_getcsr();
    if (saved & XF_FP_FLUSH_BITS) {
        _mm_setcsr((unsigned)(saved & ~XF_FP_FLUSH_BITS));
    }
    return saved;
}
static inline void xf_fp_ieee_leave(xf_fp_state saved)
{
    if (saved & XF_FP_FLUSH_BITS) {
        _mm_setcsr((unsigned)saved);
    }
}
#elif defined(__aarch64__) && defined(__GNUC__)
#define XF_FP_FLUSH_BITS ((1ULL << 24) | (1ULL << 19)) /* FPCR: FZ, FZ16 */
static inline xf_fp_state xf_fp_ieee_enter(void)
{
    xf_fp_state saved;
    __asm__ __volatile__("mrs %0, fpcr" : "=r"(saved));
    if (saved & XF_FP_FLUSH_BITS) {
        xf_fp_state cleared = saved & ~XF_FP_FLUSH_BITS;
        __asm__ __volatile__("msr fpcr, %0" : : "r"(cleared));
    }
    return saved;
}
static inline void xf_fp_ieee_leave(xf_fp_state saved)
{
    if (saved & XF_FP_FLUSH_BITS) {
        __asm__ __volatile__("msr fpcr, %0" : : "r"(saved));
    }
}
#else
static inline xf_fp_state xf_fp_ieee_enter(void) { return 0; }
static inline void xf_fp_ieee_leave(xf_fp_state saved) { (void)saved; }
#endif

#endif /* XENTFAST_FP_IEEE_H */
