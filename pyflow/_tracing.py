"""The hooks graph tracing needs from the eager layers, and nothing else.

``pyflow.graph.tracer`` records a ``Graph.build`` by running it once.  Most
ops are recorded where they all pass, ``Function.apply`` (patched only while a
trace runs, so eager mode pays nothing).  The few ops that are not autograd
Functions (comparisons, creation ops, random draws) carry the ``recordable``
decorator, and in-place writes call ``note_inplace``; both cost eager mode one
global read.  ``tracer`` is the active ``pyflow.graph.tracer.Tracer`` or None.
"""
import functools

tracer = None


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
            active = tracer
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
    return tracer is not None and not tracer.depth


def note_inplace(dst, result):
    """Called by in-place ops before writing ``result`` into ``dst``.  Returns
    True when the tracer took over the write (so the op must not write)."""
    active = tracer
    if active is None or active.depth:
        return False
    return active.record_inplace(dst, result)


def refuse_data_dependent_shape(what):
    """Raise while tracing: ``what``'s output shape depends on tensor values,
    and a static graph has fixed shapes."""
    active = tracer
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
