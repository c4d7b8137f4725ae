# OpenMP queries that compile with or without OpenMP: Cython guards its prange pragmas with
# `#ifdef _OPENMP`, and this shim does the same for the runtime calls (cimporting `openmp` would
# require <omp.h> and break the serial fallback build).
cdef extern from *:
    """
    #ifdef _OPENMP
    #include <omp.h>
    #define XF_OPENMP_ENABLED 1
    #else
    #define XF_OPENMP_ENABLED 0
    static int omp_get_max_threads(void) { return 1; }
    #endif
    """
    bint XF_OPENMP_ENABLED
    int omp_get_max_threads() noexcept nogil
