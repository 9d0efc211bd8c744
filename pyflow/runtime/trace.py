"""Chrome trace of actor firings: watch streams overlap in Perfetto.

    tracer = Tracer()
    Runtime(graph).run(tracer=tracer)
    tracer.write("trace.json")      # open in https://ui.perfetto.dev or chrome://tracing

or, without touching the code, `PYFLOW_TRACE=trace.json python train.py`:
`Runtime.run` honours the variable whenever no tracer is passed.

Each firing becomes one complete event ("ph": "X") named after the actor, on
the row (thread) of its stream, with its iteration in `args`.  Times are
`perf_counter_ns` readings, written in microseconds as the format wants.
"""
import json
import os

TRACE_ENV = "PYFLOW_TRACE"


class Tracer:
    def __init__(self):
        self.events = []          # (actor, stream, start_ns, end_ns, iteration)

    def record(self, actor, stream, start_ns, end_ns, iteration):
        # list.append is atomic under the GIL: stream threads need no lock here.
        self.events.append((actor, stream, start_ns, end_ns, iteration))

    def firings(self, actor=None):
        """Recorded firings as dicts, optionally of one actor only."""
        return [dict(actor=a, stream=s, start_ns=t0, end_ns=t1, iteration=i)
                for a, s, t0, t1, i in self.events if actor is None or a == actor]

    def to_chrome(self):
        """The trace as a Chrome trace-event dict (the JSON object format)."""
        pid = os.getpid()
        streams = sorted({e[1] for e in self.events})
        tids = {name: i + 1 for i, name in enumerate(streams)}
        origin = min((e[2] for e in self.events), default=0)
        events = [{"name": "process_name", "ph": "M", "pid": pid,
                   "args": {"name": "pyflow runtime"}}]
        events += [{"name": "thread_name", "ph": "M", "pid": pid, "tid": tid,
                    "args": {"name": f"stream {name}"}} for name, tid in tids.items()]
        for actor, stream, t0, t1, iteration in self.events:
            events.append({"name": actor, "cat": "actor", "ph": "X", "pid": pid,
                           "tid": tids[stream], "ts": (t0 - origin) / 1e3,
                           "dur": (t1 - t0) / 1e3,
                           "args": {"iteration": iteration, "stream": stream}})
        return {"traceEvents": events, "displayTimeUnit": "ms"}

    def write(self, path):
        with open(path, "w") as f:
            json.dump(self.to_chrome(), f)
        return path
