# The argument tests of the plain-call lanes (_xent.pyx: cross-entropy, _binary.pyx: BCE with logits),
# C-level type and flag checks that cost nanoseconds where xentfast.api's Python checks cost
# microseconds.  Each returns False (or -1) for anything it does not recognise: the caller then returns
# NotImplemented and the general path validates and raises.

cimport numpy as cnp

from ._openmp cimport XF_OPENMP_ENABLED, omp_get_max_threads

cdef extern from "numpy/arrayobject.h":
    object PyArray_Scalar(void *data, cnp.dtype descr, object base)

# below this many elements xentfast._threads gives every call a single thread (threads_for: at most
# n // MIN_ELEMENTS_PER_THREAD = 1 thread), so the lane runs on the calling thread like the general path
# (both lanes also take larger calls, on the threads xentfast._threads would start: plain_threads)
cdef enum:
    PLAIN_MIN_ELEMENTS_PER_THREAD = 16384
    PLAIN_MAX_ELEMENTS = 2 * PLAIN_MIN_ELEMENTS_PER_THREAD


cdef inline bint plain_float_array(object a) noexcept:
    """A NumPy float32/float64 array (exact type), C-contiguous, aligned, in native byte order (a
    byte-swapped '>f8' has the type number of float64 too, and the kernels would read its bytes as if
    it were not swapped)."""
    cdef cnp.ndarray arr
    if type(a) is not cnp.ndarray:
        return False
    arr = <cnp.ndarray>a
    return ((cnp.PyArray_TYPE(arr) == cnp.NPY_FLOAT32 or cnp.PyArray_TYPE(arr) == cnp.NPY_FLOAT64)
            and cnp.PyArray_IS_C_CONTIGUOUS(arr) and cnp.PyArray_ISALIGNED(arr)
            and cnp.PyArray_ISNOTSWAPPED(arr))


cdef inline bint plain_zero(object v) noexcept:
    return (type(v) is float or type(v) is int) and v == 0


cdef inline int plain_reduction(object reduction) noexcept:
    """0 none, 1 mean, 2 sum; -1 anything else."""
    if type(reduction) is not str:
        return -1
    if reduction == "mean":
        return 1
    if reduction == "sum":
        return 2
    if reduction == "none":
        return 0
    return -1


cdef inline bint plain_n_threads(object n_threads) noexcept:
    # any valid thread count: below PLAIN_MAX_ELEMENTS every one of them means a single thread (the
    # lanes' larger calls resolve it as xentfast._threads does, plain_threads)
    return n_threads is None or (type(n_threads) is int and n_threads != 0)


cdef inline bint plain_options(object empty_mean, object nan_policy, object n_threads) noexcept:
    return (type(empty_mean) is str and (empty_mean == "nan" or empty_mean == "zero")
            and type(nan_policy) is str and nan_policy == "propagate" and plain_n_threads(n_threads))


cdef inline bint plain_same_layout(cnp.ndarray a, cnp.ndarray b) noexcept:
    cdef int d
    if cnp.PyArray_TYPE(a) != cnp.PyArray_TYPE(b) or cnp.PyArray_NDIM(a) != cnp.PyArray_NDIM(b):
        return False
    for d in range(cnp.PyArray_NDIM(a)):
        if cnp.PyArray_DIMS(a)[d] != cnp.PyArray_DIMS(b)[d]:
            return False
    return True


cdef inline bint plain_disjoint(cnp.ndarray a, cnp.ndarray b) noexcept:
    """No byte in common, for C-contiguous a and b (comparing the two address ranges is then exact)."""
    cdef char *a0 = <char *>cnp.PyArray_DATA(a)
    cdef char *b0 = <char *>cnp.PyArray_DATA(b)
    cdef Py_ssize_t na = cnp.PyArray_NBYTES(a)
    cdef Py_ssize_t nb = cnp.PyArray_NBYTES(b)
    return na == 0 or nb == 0 or a0 + na <= b0 or b0 + nb <= a0


cdef inline bint plain_out(object out, cnp.ndarray x, cnp.ndarray target) noexcept:
    """`out` usable as the gradient buffer: the input's exact type, dtype and shape, C-contiguous,
    aligned, writeable, and no byte in common with the input or the (C-contiguous) target."""
    cdef cnp.ndarray o
    if not plain_float_array(out):
        return False
    o = <cnp.ndarray>out
    if not plain_same_layout(o, x) or not cnp.PyArray_ISWRITEABLE(o):
        return False
    return plain_disjoint(o, x) and plain_disjoint(o, target)


cdef inline object plain_scalar(double total, float total32, bint f32):
    """xentfast._backend.CPU.result: the reduction as a NumPy scalar of the loss dtype; for float32
    `total32`, which the caller rounded from `total` by a C cast (as NumPy's cast rounds: an overflow is
    inf, without a warning) inside its subnormal guard.  A cast here, outside the guard, flushed a
    subnormal result to 0 under the caller's flush-to-zero (torch.set_flush_denormal)."""
    if f32:
        return PyArray_Scalar(&total32, cnp.PyArray_DescrFromType(cnp.NPY_FLOAT32), None)
    return PyArray_Scalar(&total, cnp.PyArray_DescrFromType(cnp.NPY_FLOAT64), None)


cdef inline int plain_threads(object n_threads, Py_ssize_t n_elements):
    """xentfast._threads.threads_for at C level, for the lanes' larger calls (n_threads: None or a nonzero
    int, plain_options); 0 for a count beyond long long, which the general path then handles."""
    cdef long long wanted = -1
    if n_threads is not None:
        try:
            wanted = n_threads
        except OverflowError:
            return 0
    if not XF_OPENMP_ENABLED:
        return 1
    if wanted < 0:
        wanted = max(1, omp_get_max_threads() + 1 + wanted)
    return <int>max(1, min(wanted, <long long>(n_elements // PLAIN_MIN_ELEMENTS_PER_THREAD)))
