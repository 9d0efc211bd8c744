"""The core is one-way: imports point down the layers and never form a circle.

The import graph is read from the source with ``ast`` (so imports inside
function bodies count: a function-local import is still a dependency, only a
later one), over ``pyflow/``, ``kernels/`` and ``comm/``.  Two rules:

* no cycle among modules;
* no import from a lower layer to a higher one.

The layers, low to high, one line each.  A module belongs to the most specific
entry that names it or a package above it.  Modules of one layer may import
each other (without a cycle).  Upward calls that the design needs (autograd
handing a global tensor to the SBP dispatch, ops telling the graph tracer what
they do) go through the hook table in ``pyflow/_hooks.py``, which the higher
layers fill in when they are imported.

As import-linter does, an import of ``a.b.c`` is an edge to ``a.b.c`` only, not
to the packages ``a`` and ``a.b`` that Python runs first: a package's
``__init__`` re-exports from its modules and sits at the top of its own
subtree, so counting it would make every module depend on everything.
"""
import ast
import pathlib

ROOT = pathlib.Path(__file__).resolve().parents[1]
FOLDERS = {"pyflow": "pyflow", "kernels": "pyflow.kernels", "comm": "pyflow.comm"}

LAYERS = """
pyflow.dtypes pyflow._threads pyflow._malloc pyflow._print pyflow._simarray pyflow._simcapture pyflow.device
pyflow.kernels
pyflow.comm
pyflow.distributed.sbp pyflow.distributed.signatures
pyflow._hooks
pyflow.tensor
pyflow.autograd
pyflow.random pyflow.ops
pyflow.distributed pyflow.runtime
pyflow.optim pyflow.amp
pyflow.graph
pyflow.nn pyflow.utils
pyflow pyflow.backends pyflow.cuda
""".strip().splitlines()


def modules():
    """{module name: (path, is_package)} for every .py file of the three folders."""
    found = {}
    for folder, name in FOLDERS.items():
        base = ROOT / folder
        for path in base.rglob("*.py"):
            parts = list(path.relative_to(base).with_suffix("").parts)
            is_package = parts[-1] == "__init__"
            if is_package:
                parts = parts[:-1]
            found[".".join([name, *parts])] = (path, is_package)
    return found


def imports_of(name, path, is_package, known):
    """The known modules ``name`` imports anywhere in its source: {target: line}."""
    package = name if is_package else name.rpartition(".")[0]
    out = {}
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            targets = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")
                base = ".".join(base[:len(base) - node.level + 1])
                module = f"{base}.{node.module}" if node.module else base
            else:
                module = node.module
            targets = [f"{module}.{a.name}" if f"{module}.{a.name}" in known else module
                       for a in node.names]
        else:
            continue
        for t in targets:
            while t and t not in known:          # numpy, numba, os...: not ours
                t = t.rpartition(".")[0]
            if t and t != name:
                out.setdefault(t, node.lineno)
    return out


def graph():
    known = modules()
    return {name: imports_of(name, path, is_package, known)
            for name, (path, is_package) in known.items()}


def layer_of(name):
    """Index of the most specific LAYERS entry naming ``name`` or a package above it."""
    best, best_len = None, -1
    for i, line in enumerate(LAYERS):
        for entry in line.split():
            if (name == entry or name.startswith(entry + ".")) and len(entry) > best_len:
                best, best_len = i, len(entry)
    return best


def test_every_module_has_a_layer():
    missing = sorted(m for m in modules() if layer_of(m) is None)
    assert not missing, f"modules with no layer in LAYERS: {missing}"


def test_imports_point_down():
    up = []
    for name, targets in graph().items():
        for t, line in targets.items():
            if layer_of(t) > layer_of(name):
                up.append(f"{name}:{line} imports {t} "
                          f"(layer '{LAYERS[layer_of(name)]}' -> '{LAYERS[layer_of(t)]}')")
    assert not up, "imports that point up:\n" + "\n".join(sorted(up))


def test_no_import_cycle():
    edges = graph()
    cycles = strongly_connected(edges)
    assert not cycles, "import cycles:\n" + "\n".join(
        " <-> ".join(sorted(c)) for c in cycles)


def test_core_modules_import_at_the_top():
    """tensor, autograd and the hook table import only at module level: what
    they depend on is visible in their first lines."""
    for rel in ("pyflow/tensor.py", "pyflow/autograd.py", "pyflow/_hooks.py"):
        tree = ast.parse((ROOT / rel).read_text())
        local = [n.lineno for f in ast.walk(tree)
                 if isinstance(f, (ast.FunctionDef, ast.AsyncFunctionDef))
                 for n in ast.walk(f) if isinstance(n, (ast.Import, ast.ImportFrom))]
        assert not local, f"{rel}: imports inside functions at lines {local}"


def strongly_connected(edges):
    """Tarjan's algorithm: the components with more than one module."""
    index, low, stack, on_stack, found = {}, {}, [], set(), []

    def visit(v):
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in edges.get(v, ()):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(component)

    for v in edges:
        if v not in index:
            visit(v)
    return found


def test_the_checker_sees_cycles_and_upward_imports():
    """The two rules catch what they should (so a passing run means something)."""
    assert strongly_connected({"a": {"b": 1}, "b": {"a": 1}, "c": {"a": 1}}) in \
        ([["b", "a"]], [["a", "b"]])
    assert layer_of("pyflow.tensor") < layer_of("pyflow.ops.elementwise") < \
        layer_of("pyflow.nn.modules.linear")
    assert layer_of("pyflow.distributed.sbp") < layer_of("pyflow.tensor") < \
        layer_of("pyflow.distributed.dispatch")


def test_import_pyflow_starts_neither_mpi_nor_numba():
    """``import pyflow`` stays cheap: MPI (``mpi4py.MPI`` runs MPI_Init, ~1 s)
    and numba (~0.5 s) load on first use, so a module that needs them imports
    them inside the function that does (the layer rules still hold there)."""
    import subprocess
    import sys
    code = ("import sys, pyflow; "
            "print(sorted(m for m in ('mpi4py.MPI', 'numba', 'cupy') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True, cwd=ROOT).stdout.strip()
    assert out == "[]", f"import pyflow loaded {out}"


def private_reaches(source):
    """Private names a kernel module takes from another family module: ``from .x
    import _name`` / ``from ..cpu.x import _name``, and ``mod._name`` where ``mod``
    is a family module bound by ``from . import mod``.  The ``_``-prefixed
    modules (``_memory``, ``_simulator``) are the package's shared plumbing and
    exempt."""
    tree = ast.parse(source)
    found, modules = [], set()
    for node in ast.walk(tree):
        if not isinstance(node, ast.ImportFrom) or not node.level:
            continue
        shared = node.level == 1 and (node.module or "").startswith("_")
        for alias in node.names:
            if node.module is None and node.level == 1:           # from . import mod
                if not alias.name.startswith("_"):
                    modules.add(alias.asname or alias.name)
            elif alias.name.startswith("_") and not shared:
                found.append(f"from {'.' * node.level}{node.module} import {alias.name}")
    for node in ast.walk(tree):
        if (isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name)
                and node.value.id in modules and node.attr.startswith("_")):
            found.append(f"{node.value.id}.{node.attr}")
    return found


def test_kernel_modules_take_no_private_name_of_another_family():
    """Each kernels/ family module is used through its public names (issue 19's
    toolkit rule); what several families share lives in its own module
    (kernels/cuda/layout.py, rows.py, _memory.py)."""
    for path in sorted((ROOT / "kernels").rglob("*.py")):
        reaches = private_reaches(path.read_text())
        assert not reaches, f"{path.relative_to(ROOT)} reaches into private names: {reaches}"


def test_the_private_name_checker_sees_both_forms():
    assert private_reaches("from .elementwise import _span\n") == \
        ["from .elementwise import _span"]
    assert private_reaches("from . import elementwise as ew\new._describe(x)\n") == \
        ["ew._describe"]
    assert private_reaches("from ._memory import _CUDA\nfrom .layout import span\n") == []
