"""Every public loss documents its error bound: the accuracy contract is part of each function's docstring,
in ULPs of the result, not only of the README."""

import importlib
import inspect
import re

import pytest

import xentfast


def _drop_in(name):
    """xentfast.torch or xentfast.jax where its framework is installed (CI requires both: conftest.py)."""
    try:
        return importlib.import_module(name)
    except ImportError:
        return None


xf_torch, xf_jax = _drop_in("xentfast.torch"), _drop_in("xentfast.jax")

# the two functions of the top level that compute nothing
NOT_LOSSES = {"show_config", "openmp_enabled"}


def _public_functions(module):
    return [(module.__name__, name, getattr(module, name)) for name in module.__all__
            if inspect.isfunction(getattr(module, name)) and name not in NOT_LOSSES]


LOSSES = [loss for module in (xentfast, xf_torch, xf_jax) if module for loss in _public_functions(module)]


def test_the_list_of_losses_is_not_empty():
    assert len(_public_functions(xentfast)) >= 18


@pytest.mark.parametrize("module, name, fn", LOSSES, ids=[f"{m}.{n}" for m, n, _ in LOSSES])
def test_every_public_loss_documents_its_error_bound(module, name, fn):
    doc = inspect.getdoc(fn) or ""
    assert "Error bound" in doc, f"{module}.{name}: no error bound in its docstring"
    # the section alone, up to the next numpydoc heading: in ULPs, directly or as the functions it defers to
    section = re.split(r"\n\n(?=[^\n]+\n-{3,}\n)", doc.split("Error bound", 1)[1])[0]
    assert "ULP" in section or ":func:`" in section, f"{module}.{name}: {section!r}"


@pytest.mark.skipif(xf_torch is None, reason="torch is not installed")
def test_the_torch_modules_defer_to_a_documented_function():
    classes = [getattr(xf_torch, n) for n in xf_torch.__all__ if inspect.isclass(getattr(xf_torch, n))]
    assert classes
    for cls in classes:
        named = [n for n in xf_torch.__all__ if f":func:`{n}`" in inspect.getdoc(cls)]
        assert named, cls.__name__
        assert all("Error bound" in inspect.getdoc(getattr(xf_torch, n)) for n in named), cls.__name__
