from ._openmp cimport XF_OPENMP_ENABLED, omp_get_max_threads


def openmp_enabled():
    """True when the extension was compiled with OpenMP."""
    return bool(XF_OPENMP_ENABLED)


def omp_max_threads():
    """OpenMP's default team size (honours OMP_NUM_THREADS and threadpoolctl); 1 without OpenMP."""
    return omp_get_max_threads()
