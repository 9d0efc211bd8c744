"""The hook table (pyflow/_hooks.py): the only way the core calls up a layer."""
import pytest

import pyflow as pf
from pyflow._hooks import HOOKS, _Hooks


def test_every_slot_is_filled_by_its_layer_once_pyflow_is_imported():
    for name, owner in _Hooks._OWNERS.items():
        fn = getattr(HOOKS, name)
        assert callable(fn), name
        assert fn.__module__.startswith(owner) or owner in repr(fn), (name, owner, fn)


def test_an_unknown_slot_is_refused_and_an_empty_one_names_its_owner():
    table = _Hooks()
    with pytest.raises(KeyError, match="no slot 'zeroes'"):
        table.provide(zeroes=lambda: None)
    with pytest.raises(RuntimeError, match="apply_global is provided by "
                                           "pyflow.distributed.dispatch"):
        table.apply_global


def test_the_core_works_through_the_table():
    """Tensor.backward and .to (tensor.py) and autograd's seed gradient reach
    autograd and the ops through the table."""
    x = pf.tensor([1.0, 2.0], requires_grad=True)
    (x * x).sum().backward()
    assert x.grad.tolist() == [2.0, 4.0]
    assert x.to(pf.float64).dtype is pf.float64
