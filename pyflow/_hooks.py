"""The core's upward calls, in one table, and the graph tracer's hooks.

The core is one-way: ``dtypes``/``device`` -> ``tensor`` -> ``autograd`` ->
``ops`` -> {``distributed``, ``graph``, ``nn``}.  A lower layer never imports
a higher one (``tests/test_import_layers.py`` checks it).  A few things a
lower layer does still need a higher layer's code, and each goes through one
slot of ``HOOKS`` below, which the higher layer fills in when it is imported
(``pyflow/__init__.py`` imports every layer, so the table is full before any
user code runs):

* autograd makes gradients of zeros and ones (``zeros``, ``ones_like``),
  and ``Tensor.to`` converts (``cast``, ``to_device``, ``clone``): the ops;
* ``Tensor.backward`` runs the tape (``backward``, ``grad``): autograd;
* a call with a global tensor goes to the SBP dispatch (``apply_global``),
  and a global leaf's gradient is boxed to its SBP (``box_gradient``):
  ``pyflow.distributed.dispatch``.

Reading the table tells a newcomer every place where the core calls up, and
who answers.  The slots are plain attributes: a call costs one attribute read.

The second half is the graph tracer's side (``pyflow.graph.tracer`` records a
``Graph.build`` by running it once).  Most ops are recorded where they all
pass, ``Function.apply`` (hooked only while a trace runs, so eager mode pays
nothing).  The few ops that are not autograd Functions (comparisons, creation
ops, random draws) carry the ``recordable`` decorator, and in-place writes
call ``note_inplace``; both cost eager mode one thread-local read.
``active()`` is the calling thread's ``pyflow.graph.tracer.Tracer`` or None.

Tracing is per thread: a trace in one thread records only that thread's ops,
and every other thread (eager code, the stream threads of a running graph, a
second trace) sees plain eager behaviour meanwhile.
"""
import functools
import threading


class _State(threading.local):
    tracer = None           # the Tracer recording this thread's build(), or None


_state = _State()


class _Hooks:
    """The slots; ``provide`` fills them.  An empty slot is a bug in the import
    order, so it raises saying which layer should have filled it."""
    _OWNERS = {"zeros": "pyflow.ops", "ones_like": "pyflow.ops", "cast": "pyflow.ops",
               "to_device": "pyflow.ops", "clone": "pyflow.ops",
               "backward": "pyflow.autograd", "grad": "pyflow.autograd",
               "apply_global": "pyflow.distributed.dispatch",
               "box_gradient": "pyflow.distributed.dispatch",
               "global_elementwise": "pyflow.distributed.dispatch"}

    def __getattr__(self, name):          # only reached while a slot is empty
        if name in self._OWNERS:
            raise RuntimeError(f"pyflow: {name} is provided by {self._OWNERS[name]}, which "
                               f"is not imported; import pyflow")
        raise AttributeError(name)

    def provide(self, **slots):
        for name, fn in slots.items():
            if name not in self._OWNERS:
                raise KeyError(f"pyflow._hooks: no slot {name!r}; the slots are "
                               f"{sorted(self._OWNERS)}")
            setattr(self, name, fn)


HOOKS = _Hooks()


class TracingError(RuntimeError):
    """build() did something a static graph cannot capture (raised by the ops
    and by ``pyflow.graph.tracer``, which exports it)."""


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
    ops (``HOOKS.global_elementwise``), instead of computing on the pieces."""
    def decorate(f):
        @functools.wraps(f)
        def wrapper(*args, **kwargs):
            if elementwise and _any_global(args):
                return HOOKS.global_elementwise(f, *args, **kwargs)
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
        raise TracingError(f"{what} inside a graph: its output shape depends on the input "
                           f"values, and a static graph has fixed shapes")


def data_dependent_shape(fn):
    """Decorator form of ``refuse_data_dependent_shape`` (``nonzero``)."""
    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        refuse_data_dependent_shape(f"{fn.__name__}()")
        return fn(*args, **kwargs)
    return wrapper
