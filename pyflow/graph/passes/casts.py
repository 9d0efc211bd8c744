"""Remove the casts of an autocast trace that change nothing.

A build() traced under autocast (``graph.config.enable_amp``) records every
cast autocast makes as a ``call`` of ``ops.shape.Cast``.  Op by op, eager
autocast cannot see two things a whole graph shows:

* **the same cast twice**: one tensor cast to one dtype by several ops (a
  weight shared by two products, an activation read by two matrix products)
  is cast once, and every reader takes that one result;
* **a cast pair that cancels**: ``x.to(wide).to(narrow)`` where ``x`` already
  was ``narrow`` and ``wide`` holds every ``narrow`` value exactly (bfloat16
  or float16 through float32 or float64, float32 through float64) is ``x``.
  (The other order, narrowing then widening, rounds: it is kept.)

The pass runs on the forward graph before the autograd pass, so the backward
is built for what is left, and a cast whose output is no longer read is
dropped by dead-code elimination.  It looks only at Cast nodes and touches no
other op, so graphs traced without autocast come out unchanged.
"""
from ... import dtypes as _dt
from ...ops.shape import Cast
from ..ir import Value, substitute
from .simplify import _forwards_with_backward, _with_args, rebuilt

__all__ = ["remove_redundant_casts"]

# dtype -> the wider dtypes that hold each of its values exactly
_EXACT_IN = {_dt.bfloat16: (_dt.float32, _dt.float64), _dt.float16: (_dt.float32, _dt.float64),
             _dt.float32: (_dt.float64,)}


def _cast_of(node):
    """(source Value, target dtype) of a Cast node, else None."""
    if node.kind != "call" or node.target is not Cast or node.kwargs or len(node.args) != 2:
        return None
    src, dtype = node.args
    return (src, dtype) if isinstance(src, Value) else None


def remove_redundant_casts(graph):
    with_backward = _forwards_with_backward(graph)
    made_by = {}          # value id -> (source Value, dtype) of the Cast making it
    done = {}             # (source id, dtype) -> the first cast's output Value
    replaced = {}
    removed = []

    def lookup(v):
        return replaced.get(v.id, v)

    kept = []
    for node in graph.nodes:
        if any(v.id in replaced for v in node.inputs):
            node = _with_args(node, substitute(node.args, lookup),
                              substitute(node.kwargs, lookup))
        cast = _cast_of(node)
        if cast is not None and node.id not in with_backward:
            src, dtype = cast
            (out,) = node.outputs
            inner = made_by.get(src.id)
            if inner is not None and inner[0].dtype is dtype \
                    and src.dtype in _EXACT_IN.get(dtype, ()):
                replaced[out.id] = inner[0]             # narrow -> wide -> narrow: x
                removed.append(f"{node.name} (cancels {inner[0]!r}'s cast)")
                continue
            first = done.get((src.id, dtype))
            if first is not None:
                replaced[out.id] = first                # the same cast again
                removed.append(f"{node.name} (repeats {first!r})")
                continue
            done[(src.id, dtype)] = out
            made_by[out.id] = (src, dtype)
        kept.append(node)
    g = rebuilt(graph, kept, lookup)
    g.history.append(("remove_redundant_casts", f"removed {len(removed)} casts"
                      + (f": {', '.join(removed[:6])}" + (" ..." if len(removed) > 6 else "")
                         if removed else "")))
    return g
