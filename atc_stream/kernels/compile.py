"""Compile a kernel source module (``core.py``, ``strategy.py``) for one target, and a CPU
driver serial and parallel: the trick behind "one source, three drivers".

Design: docs/design/kernels.md, "One source".
"""

from __future__ import annotations

import types
from collections.abc import Callable
from typing import Any

from numba import njit

from atc_stream.kernels import core
from atc_stream.kernels.cache import cached_jit


def compile_module(
    module: types.ModuleType,
    decorator: Callable[[Callable[..., Any]], Any],
    overrides: dict[str, Callable[[Callable[..., Any]], Any]] | None = None,
    compiled_imports: dict[str, Any] | None = None,
) -> types.SimpleNamespace:
    """Return a namespace with every function of ``module`` compiled by ``decorator``
    (or by ``overrides[name]`` for the functions named there).

    Each function is cloned over a private copy of the module's globals in which its
    siblings are the compiled versions, so compiled functions call compiled functions;
    ``compiled_imports`` replaces names the module imports (plain functions of another
    kernel source) with their compiled versions.
    """
    namespace = dict(vars(module))
    namespace.update(compiled_imports or {})
    compiled = {}
    for name, function in vars(module).items():
        if isinstance(function, types.FunctionType) and function.__module__ == module.__name__:
            clone = types.FunctionType(
                function.__code__, namespace, name, function.__defaults__, function.__closure__
            )
            clone.__doc__ = function.__doc__
            compiled[name] = (overrides or {}).get(name, decorator)(clone)
    namespace.update(compiled)
    return types.SimpleNamespace(**compiled)


def compile_core(decorator: Callable[[Callable[..., Any]], Any]) -> types.SimpleNamespace:
    """Return a namespace with every function of ``core`` compiled by ``decorator``."""
    return compile_module(core, decorator)


def compile_both(function):
    """(serial, parallel) dispatchers of ``function``, each cached under its own name.

    numba's cache index is named by ``__qualname__`` and its key ignores compile flags,
    so the two variants must carry different qualnames or they would share entries.
    """
    variants = []
    for suffix, parallel in (("serial", False), ("parallel", True)):
        clone = types.FunctionType(
            function.__code__, function.__globals__, f"{function.__name__}_{suffix}",
            function.__defaults__, function.__closure__,
        )  # fmt: skip
        clone.__qualname__ = clone.__name__
        clone.__doc__ = function.__doc__
        variants.append(cached_jit(njit(parallel=parallel, error_model="numpy", cache=True))(clone))
    return tuple(variants)
