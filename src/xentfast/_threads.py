"""Thread-count resolution, in one place (sklearn's `_openmp_effective_n_threads` convention)."""

import operator

from ._core._openmp_helpers import omp_max_threads, openmp_enabled

# Below this many elements a parallel region costs more than it saves (about 1-2 us to start a team on
# this class of machine, against ~1 ns per element of work), so small problems run on the calling thread.
# Results do not depend on the thread count, so this is purely a speed decision.
MIN_ELEMENTS_PER_THREAD = 16384


def effective_n_threads(n_threads=None):
    """Number of OpenMP threads a kernel may use.

    ``None`` or ``-1``: OpenMP's default (``OMP_NUM_THREADS``, or what threadpoolctl set); ``-k``: that
    default plus 1 minus k; a positive int: exactly that.  Always 1 when built without OpenMP.
    """
    if n_threads is None:
        n_threads = -1
    try:
        if isinstance(n_threads, bool):
            raise TypeError    # True would otherwise ask for one thread
        n_threads = operator.index(n_threads)
    except TypeError:
        raise TypeError(f"n_threads: expected None or an int, got {type(n_threads).__name__}") from None
    if n_threads == 0:
        raise ValueError("n_threads: 0 is not a thread count; use None for all available threads or a positive int")
    if not openmp_enabled():
        return 1
    if n_threads < 0:
        return max(1, omp_max_threads() + 1 + n_threads)
    return n_threads


def threads_for(n_threads, n_elements):
    """Threads to actually start for a problem of ``n_elements``: never more than the work can feed."""
    wanted = effective_n_threads(n_threads)
    return max(1, min(wanted, n_elements // MIN_ELEMENTS_PER_THREAD))
