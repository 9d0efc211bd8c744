"""Kernels compiled twice from one definition: over the threads, and on one.

Why: a numba ``prange`` loop hands its iterations to the thread pool on every
call.  On small arrays that costs as much as the work, and on a machine shared
with other processes it costs far more: the parallel region waits until every
one of its threads gets a core.  On this project's 2-core machines, a GPT-mini
training step (layer norms and softmaxes of 16K-32K elements) took ~120 ms
instead of ~7 ms while another process kept the cores busy (load 3.9), almost
all of it in its parallel row kernels; on one thread those kernels cost the
same on an idle machine (a 256x64 layer norm: 9.2 us either way) and no more
on a busy one.  GELU on 131K elements: 43 us on one thread, 85 us on two.

So ``@twin(...)`` compiles the function with ``parallel=True`` and, from the
same source, without (a ``prange`` is then a plain ``range``), and a call runs
on the threads only when its work, the size of the argument ``size_of`` (an
array), is at least ``PARALLEL_MIN`` elements.  The two compilations are the
same arithmetic in the same order (no kernel here reduces across ``prange``
iterations), and ``tests/kernels/test_cpu_twins.py`` checks they agree bit
for bit, except the fast-math activation loops (GELU, SiLU), which LLVM may
vectorize differently in the two: their backward can differ in the last bit.
The choice depends on sizes only, so every run and every rank of one shape
makes it alike.  ``.parallel`` and ``.serial`` are there for callers with
their own rule (activation.py, index.py).
"""
import types

import numba

from numba import njit

PARALLEL_MIN = 1 << 18     # elements of work from which the threads pay for themselves


class Twin:
    """One kernel, compiled for the threads and for one thread."""

    def __init__(self, fn, size_of, options):
        self.py_func = fn
        self.size_of = size_of
        self.parallel = njit(parallel=True, **options)(fn)
        self.serial = njit(**options)(_renamed(fn, "_serial"))
        self.__name__, self.__doc__ = fn.__name__, fn.__doc__

    def __call__(self, *args):
        if args[self.size_of].size >= PARALLEL_MIN:
            return self.parallel(*args)
        return self.serial(*args)


def twin(size_of=0, **options):
    """Decorator: ``@twin(size_of=k, **njit options)`` in place of
    ``@njit(parallel=True, **options)``; argument ``k`` measures the work."""
    def deco(fn):
        return Twin(fn, size_of, options)
    return deco


def _renamed(fn, suffix):
    """A copy of ``fn`` under another name: numba caches compiled code per
    function name, and the serial compilation must not share the parallel one's
    cache entries."""
    name = fn.__name__ + suffix
    code = fn.__code__.replace(co_name=name, co_qualname=fn.__qualname__ + suffix)
    clone = types.FunctionType(code, fn.__globals__, name, fn.__defaults__, fn.__closure__)
    clone.__qualname__ = fn.__qualname__ + suffix
    clone.__module__ = fn.__module__
    return clone


def row_chunks(rows):
    """How many chunks of rows a kernel with per-chunk partial sums (a column sum
    over the rows: layer norm's dweight, a bias gradient) splits ``rows`` into:
    two per thread, so the threads share the work even when one is slowed.  It
    depends on the thread count only, not on which twin runs, so both give the
    same partials and the same sum."""
    return max(1, min(rows, numba.get_num_threads() * 2))
