"""The hooks graph tracing needs from the eager layers, and nothing else.

``pyflow.graph.tracer`` records a ``Graph.build`` by running it once.  Most
ops are recorded where they all pass, ``Function.apply`` (hooked only while a
trace runs, so eager mode pays nothing).  The few ops that are not autograd
Functions (comparisons, creation ops, random draws) carry the ``recordable``
decorator, and in-place writes call ``note_inplace``; both cost eager mode one
thread-local read.  ``active()`` is the calling thread's
``pyflow.graph.tracer.Tracer`` or None.

Tracing is per thread: a trace in one thread records only that thread's ops,
and every other thread (eager code, the stream threads of a running graph, a
second trace) sees plain eager behaviour meanwhile.
"""
import functools
import threading


class _State(threading.local):
    tracer = None           # the Tracer recording this thread's build(), or None


_state = _State()


def active():
    """The calling thread's active Tracer, or None."""
    return _state.tracer


def set_active(tracer):
    """Make ``tracer`` (or None) the calling thread's active Tracer."""
    _state.tracer = tracer


def __getattr__(name):
    # ``_tracing.tracer`` was a process-wide global; reading it still works and
    # now means this thread's tracer (setting it does not: use set_active).
    if name == "tracer":
        return _state.tracer
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def recordable(fn=None, *, random=False, differentiable=False, elementwise=False):
    """Make an op visible to the tracer as one ``fn`` node of the graph.

    For ops that are not autograd Functions (comparisons, creation ops), and
    for public ops that do data-dependent work around their Functions (indices
    checked on the host by ``embedding``): the whole call is one
    node, so nothing inside it is baked into the graph.  ``random=True`` marks
    ops that draw from a generator (run again on every call, never folded);
    ``differentiable=True`` makes the graph differentiate the node by running
    it with eager autograd (pyflow.graph.executor).  ``elementwise=True`` ops
    (comparisons) on global tensors go through the SBP dispatch as elementwise
    ops (pyflow/distributed/dispatch.py), instead of computing on the pieces."""
    def decorate(f):
        @functools.wraps(f)
        def wrapper(*args, **kwargs):
            if elementwise and _any_global(args):
                from .distributed.dispatch import GlobalElementwise
                return GlobalElementwise.apply(f, *args, **kwargs)
            active = _state.tracer
            if active is None or active.depth:
                return f(*args, **kwargs)
            return active.record_fn(f, args, kwargs, random, differentiable)
        return wrapper
    return decorate(fn) if fn is not None else decorate


def _any_global(args):
    for a in args:
        if getattr(a, "_placement", None) is not None:
            return True
    return False


def recording():
    """True while a graph trace records the ops called at the top of build()."""
    active = _state.tracer
    return active is not None and not active.depth


def note_inplace(dst, result):
    """Called by in-place ops before writing ``result`` into ``dst``.  Returns
    True when the tracer took over the write (so the op must not write)."""
    active = _state.tracer
    if active is None or active.depth:
        return False
    return active.record_inplace(dst, result)


def refuse_data_dependent_shape(what):
    """Raise while tracing: ``what``'s output shape depends on tensor values,
    and a static graph has fixed shapes."""
    active = _state.tracer
    if active is not None and not active.depth:
        from .graph.tracer import TracingError
        raise TracingError(f"{what} inside a graph: its output shape depends on the input "
                           f"values, and a static graph has fixed shapes")


def data_dependent_shape(fn):
    """Decorator form of ``refuse_data_dependent_shape`` (``nonzero``)."""
    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        refuse_data_dependent_shape(f"{fn.__name__}()")
        return fn(*args, **kwargs)
    return wrapper
