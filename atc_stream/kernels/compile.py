"""Compile ``kernels/core.py`` for one target: the trick behind "one source, three drivers".

Design: docs/design/kernels.md, "One source".
"""

from __future__ import annotations

import types
from collections.abc import Callable
from typing import Any

from atc_stream.kernels import core


def compile_core(decorator: Callable[[Callable[..., Any]], Any]) -> types.SimpleNamespace:
    """Return a namespace with every function of ``core`` compiled by ``decorator``."""
    namespace = dict(vars(core))
    compiled = {}
    for name, function in vars(core).items():
        if isinstance(function, types.FunctionType) and function.__module__ == core.__name__:
            clone = types.FunctionType(
                function.__code__, namespace, name, function.__defaults__, function.__closure__
            )
            clone.__doc__ = function.__doc__
            compiled[name] = decorator(clone)
    namespace.update(compiled)
    return types.SimpleNamespace(**compiled)
