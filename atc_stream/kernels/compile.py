"""Compile a kernel source module (``core.py``, ``strategy.py``) for one target: the trick
behind "one source, three drivers".

Design: docs/design/kernels.md, "One source".
"""

from __future__ import annotations

import types
from collections.abc import Callable
from typing import Any

from atc_stream.kernels import core


def compile_module(
    module: types.ModuleType, decorator: Callable[[Callable[..., Any]], Any]
) -> types.SimpleNamespace:
    """Return a namespace with every function of ``module`` compiled by ``decorator``.

    Each function is cloned over a private copy of the module's globals in which its
    siblings are the compiled versions, so compiled functions call compiled functions.
    """
    namespace = dict(vars(module))
    compiled = {}
    for name, function in vars(module).items():
        if isinstance(function, types.FunctionType) and function.__module__ == module.__name__:
            clone = types.FunctionType(
                function.__code__, namespace, name, function.__defaults__, function.__closure__
            )
            clone.__doc__ = function.__doc__
            compiled[name] = decorator(clone)
    namespace.update(compiled)
    return types.SimpleNamespace(**compiled)


def compile_core(decorator: Callable[[Callable[..., Any]], Any]) -> types.SimpleNamespace:
    """Return a namespace with every function of ``core`` compiled by ``decorator``."""
    return compile_module(core, decorator)
