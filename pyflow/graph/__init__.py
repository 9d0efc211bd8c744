"""pyflow's graph compiler: trace ``build()`` into a logical IR, run passes,
lower to actors.

Read in this order: ``ir.py`` (Values and Nodes), ``tracer.py`` (how a build()
becomes a Graph), ``passes/`` (each a pure function Graph -> Graph: autograd,
constant folding, dead-code elimination, memory planning), ``executor.py``
(a Node as a runnable Step), ``lowering.py`` (Steps as actors of
``pyflow.runtime``), ``plan.py`` (all of it for one input signature).
``pyflow.nn.Graph`` is the user-facing class.
"""
from .ir import Graph, Node, Value
from .tracer import TracingError, trace

__all__ = ["Graph", "Node", "Value", "TracingError", "trace"]
