"""pyflow's actor runtime: OneFlow's actors, registers and streams in plain Python.

    from pyflow.runtime import TaskGraph, Runtime
    g = TaskGraph()
    x = g.source("data", range(4), stream="data", registers=2)
    h = g.actor("double", lambda v: v * 2, inputs=[x], stream="compute", registers=2)
    s = g.actor("add", lambda a, b: a + b, inputs=[h, x], stream="compute")
    g.sink("out", s)
    Runtime(g).run()            # {"out": [0, 3, 6, 9]}

Read in this order: register.py (slots and back-pressure), messages.py (the
protocol), actor.py (when an actor fires), stream.py (one thread per stream),
taskgraph.py (building and checking a graph), runtime.py (running it),
trace.py (Chrome trace), chains.py (merging one stream's actors), device.py (CUDA
events between streams on a GPU).  docs/runtime.md walks through an example.
"""
from .actor import Actor, SinkActor, SourceActor
from .chains import Chain, merge_chains
from .device import CudaCompletion, completion_for
from .register import OutputRegisters, Register
from .runtime import ActorError, DeadlockError, Runtime, RunStats, RunTimeoutError
from .taskgraph import NO_INITIAL, Edge, GraphError, Port, TaskGraph
from .trace import TRACE_ENV, Tracer

__all__ = ["TaskGraph", "Runtime", "Port", "Edge", "Tracer", "RunStats", "Register",
           "OutputRegisters", "Actor", "SourceActor", "SinkActor", "ActorError",
           "DeadlockError", "RunTimeoutError", "GraphError", "NO_INITIAL", "TRACE_ENV", "Chain",
           "merge_chains", "CudaCompletion", "completion_for"]
