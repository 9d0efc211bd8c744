"""The optimizer in a graph: one update node per parameter, and the pass that
fuses them into one multi-tensor update per (optimizer, dtype, device).

``add_update`` (the ``optimizer`` pass) appends, for every optimizer of
``add_optimizer``, one ``update`` node per parameter, as OneFlow has one
model-update op per variable.  Each node runs that parameter's step exactly as
``optimizer.step()`` would (``Optimizer._update_param``: state created on
first use, one fused kernel, skipped when ``.grad`` is None), followed by one
node stepping the LR scheduler.  An optimizer class that does not provide the
per-parameter step (a user subclass overriding ``step``) gets one node calling
its ``step()``.

``fuse_model_update`` (``graph.config.allow_fuse_model_update_ops``, on by
default) replaces the per-parameter nodes of each (optimizer, dtype, device)
group by ONE node calling ``Optimizer._update_params``: one multi-tensor
kernel (``adam_multi_step`` / ``sgd_multi_step`` in ``kernels/*/optim.py``)
over the whole group, as eager ``optimizer.step()`` does.  It does the same
arithmetic as the unfused nodes, bit for bit, and saves a node (an actor
firing, a kernel dispatch and the Python around it) per parameter.

Update nodes have no data inputs: they read ``.grad``, which the ``set_grad``
nodes wrote, and the lowering makes every ``update`` wait for all actors
before it, so they run after the whole backward, in program order.
"""
from ...optim.optimizer import same_kind_batches as _split_by_key, update_key as _group_key
from ..ir import Node

__all__ = ["add_update", "fuse_model_update", "ParamUpdate", "MultiTensorUpdate",
           "ScaledStep", "steps_per_parameter"]


def steps_per_parameter(optimizer):
    """True when ``optimizer``'s ``step`` is the per-parameter loop of its class
    (SGD, Adam, AdamW): then a graph may step its parameters one node each, or
    fused.  A subclass that overrides ``step`` keeps its own ``step``."""
    from ...optim import Optimizer
    mro = type(optimizer).__mro__
    owner_step = next(c for c in mro if "step" in c.__dict__)
    owner_update = next((c for c in mro if "_update_params" in c.__dict__), None)
    return owner_update is not None and owner_update is owner_step and owner_step is not Optimizer


class ParamUpdate:
    """An ``update`` node's target: one parameter's optimizer step.  The group
    and parameter are looked up by index at run time (``load_state_dict``
    replaces the group dicts, keeping the parameters)."""

    def __init__(self, optimizer, group, index):
        self.optimizer, self.group, self.index = optimizer, group, index

    def __call__(self):
        group = self.optimizer.param_groups[self.group]
        self.optimizer._update_param(group, group["params"][self.index])

    def param(self):
        return self.optimizer.param_groups[self.group]["params"][self.index]


class MultiTensorUpdate:
    """A fused ``update`` node's target: the steps of many parameters of one
    optimizer, dtype and device in one multi-tensor kernel."""

    def __init__(self, optimizer, slots):
        self.optimizer, self.slots = optimizer, tuple(slots)     # (group, index) pairs

    def __call__(self):
        groups = self.optimizer.param_groups
        pairs = [(groups[g], groups[g]["params"][i]) for g, i in self.slots]
        key = _group_key(pairs[0][1])
        if any(_group_key(p) != key for _, p in pairs):   # a parameter moved since compile
            for one in _split_by_key(pairs):
                self.optimizer._update_params(one)
            return
        self.optimizer._update_params(pairs)


class SchedulerStep:
    """The node after an optimizer's updates: the LR scheduler's step."""

    def __init__(self, optimizer, scheduler):
        self.optimizer, self.scheduler = optimizer, scheduler

    def __call__(self):
        if hasattr(self.optimizer.step, "_wrapped_by_lr_sched"):
            self.optimizer._opt_called = True    # the optimizer did step (its nodes ran)
        self.scheduler.step()



class ScaledStep:
    """With a loss scaler, an optimizer's one update node: ``scaler.step(opt)``
    (unscale and inf/nan check of its gradients, the step skipped on overflow),
    then its LR scheduler's step, as the eager loop runs them."""

    def __init__(self, scaler, optimizer, scheduler):
        self.scaler, self.optimizer, self.scheduler = scaler, optimizer, scheduler

    def __call__(self):
        self.scaler.step(self.optimizer)
        if self.scheduler is not None:
            self.scheduler.step()


def add_update(graph, optimizers, grad_scaler=None):
    """IR -> IR: the update nodes of every optimizer of ``add_optimizer``; with
    a ``grad_scaler`` one ``ScaledStep`` node per optimizer and a last node
    running ``grad_scaler.update()``."""
    if not optimizers:
        return graph
    names = {id(v.tensor): v.name for v in graph.state}
    g = graph.copy()
    n_param = n_whole = 0
    if grad_scaler is not None:
        for k, (opt, sched) in enumerate(optimizers):
            g.nodes.append(Node("update", ScaledStep(grad_scaler, opt, sched), (), {}, [],
                                {"optimizer": k}, name=f"scaled_update_{k}"))
        g.nodes.append(Node("update", grad_scaler.update, (), {}, [], {"optimizer": None},
                            name="grad_scaler_update"))
        g.history.append(("optimizer", f"+{len(optimizers)} loss-scaled update nodes "
                                       f"(unscale, inf check, step) and a scale update for "
                                       f"{len(optimizers)} optimizer(s)"))
        return g
    for k, (opt, sched) in enumerate(optimizers):
        if steps_per_parameter(opt):
            for gi, group in enumerate(opt.param_groups):
                for pi, p in enumerate(group["params"]):
                    name = names.get(id(p), f"opt{k}.group{gi}.{pi}")
                    g.nodes.append(Node("update", ParamUpdate(opt, gi, pi), (), {}, [],
                                        {"optimizer": k, "param": p,
                                         "group_key": _group_key(p)},
                                        name=f"update_{name}"))
                    n_param += 1
            if sched is not None:
                g.nodes.append(Node("update", SchedulerStep(opt, sched), (), {}, [],
                                    {"optimizer": k}, name=f"lr_scheduler_{k}"))
        else:
            def step(opt=opt, sched=sched):
                opt.step()
                if sched is not None:
                    sched.step()
            g.nodes.append(Node("update", step, (), {}, [], {"optimizer": k},
                                name=f"optimizer_update_{k}"))
            n_whole += 1
    parts = []
    if n_param:
        parts.append(f"+{n_param} update nodes (one per parameter)")
    if n_whole:
        parts.append(f"+{n_whole} whole-step update nodes")
    g.history.append(("optimizer", f"{', '.join(parts)} for {len(optimizers)} optimizer(s)"))
    return g


def fuse_model_update(graph):
    """IR -> IR: the per-parameter update nodes of each (optimizer, dtype,
    device) become one ``MultiTensorUpdate`` node, where the group's last
    per-parameter node was (the LR scheduler node stays after it)."""
    groups = {}
    for node in graph.nodes:
        if node.kind == "update" and isinstance(node.target, ParamUpdate):
            groups.setdefault((node.attrs["optimizer"],) + node.attrs["group_key"],
                              []).append(node)
    last = {members[-1].id: key for key, members in groups.items()}
    nodes, lines = [], []
    for node in graph.nodes:
        if node.kind == "update" and isinstance(node.target, ParamUpdate):
            key = (node.attrs["optimizer"],) + node.attrs["group_key"]
            if last.get(node.id) != key:
                continue
            members = groups[key]
            opt = node.target.optimizer
            target = MultiTensorUpdate(opt, [(m.target.group, m.target.index) for m in members])
            dtype, device = node.attrs["group_key"]
            name = f"update_{type(opt).__name__.lower()}{key[0]}_{dtype.name}_{device}"
            nodes.append(Node("update", target, (), {}, [],
                              {"optimizer": key[0], "fused": tuple(m.name for m in members)},
                              name=name))
            lines.append(f"{name} <- {len(members)}")
            continue
        nodes.append(node)
    g = graph.copy()
    g.nodes = nodes
    n = sum(len(m) for m in groups.values())
    g.history.append(("fuse_model_update",
                      f"fused {n} update nodes into {len(groups)} multi-tensor update node(s)"
                      + (": " + ", ".join(lines) if lines else "")))
    return g
