"""``--config FILE``: a command's options from a TOML file, each key checked (an unknown key
or a wrong type is one line naming it, exit 2); options given on the command line win.

The file's values become the click context's ``default_map``: click ranks them below the
command line and the environment (parameter source ``DEFAULT_MAP``) and converts and
range-checks them as it does typed flags.
"""

from __future__ import annotations

import inspect
import types
import typing
from pathlib import Path
from typing import Any

import typer

from atc_stream.core.toml_files import read_toml

#: Options whose value is a comma-separated list: the file may give a TOML array instead.
COMMA_LISTS = frozenset({"symbols"})


def load_config_file(
    ctx: typer.Context, param: typer.CallbackParam, values: list[Path] | None
) -> Any:
    """The callback of an eager ``--config`` option: reads the file and sets the context's
    ``default_map`` from it (``typer.BadParameter`` naming the key for a bad one). The
    option takes one file; it is declared repeatable only so that a second one is refused
    rather than silently replacing the first."""
    if not values:
        return values
    if len(values) > 1:
        raise typer.BadParameter(
            f"given {len(values)} times ({', '.join(map(str, values))}): give one file "
            "(options on the command line win over it)"
        )
    (value,) = values
    try:
        document = read_toml(value, "config file")
    except ValueError as exc:
        raise typer.BadParameter(str(exc)) from None
    options = {
        p.name: p
        for p in ctx.command.params
        if p.param_type_name == "option" and p.name and p.name != param.name
    }
    callback = ctx.command.callback
    hints = typing.get_type_hints(inspect.unwrap(callback)) if callback is not None else {}
    defaults = {}
    for key, item in document.items():
        option = options.get(key.replace("-", "_"))
        if option is None or option.name is None:
            raise typer.BadParameter(
                f"{value}: unknown key {key!r} (the keys are the options of "
                f"'{ctx.command_path}', e.g. max_bars or max-bars)"
            )
        if option.name in defaults:
            raise typer.BadParameter(
                f"{value}: {key!r} gives the option {option.name!r} a second time (its two "
                f"spellings are one key: keep one)"
            )
        kind, multiple = _expected(hints.get(option.name))
        defaults[option.name] = _checked(ctx, option, key, item, value, kind, multiple)
    ctx.default_map = {**(ctx.default_map or {}), **defaults}
    return values


def _checked(
    ctx: typer.Context, option: Any, key: str, item: Any, path: Path, kind: type, multiple: bool
) -> Any:
    """``item`` as the option's value, or ``typer.BadParameter`` naming ``key``."""
    if option.name in COMMA_LISTS and isinstance(item, list):
        if not all(isinstance(x, str) for x in item):
            raise typer.BadParameter(f"{path}: key {key!r} must be a list of strings")
        item = ",".join(item)
    said = {bool: "true or false", int: "an integer", float: "a number"}.get(kind, "a string")
    if isinstance(item, list) and not multiple:
        raise typer.BadParameter(f"{path}: key {key!r} must be {said}, got a list")
    items = item if isinstance(item, list) else [item]
    for one in items:
        if not _fits(kind, one):
            said += " (or a list of them)" if multiple else ""
            raise typer.BadParameter(f"{path}: key {key!r} must be {said}, got {one!r}")
    value = items if multiple else item
    try:  # the option's own conversion, range and choice checks, and callback
        option.process_value(ctx, value)
    except typer.BadParameter as exc:
        raise typer.BadParameter(f"{path}: key {key!r}: {exc.message}") from None
    return value


def _expected(hint: Any) -> tuple[type, bool]:
    """(the Python type of the values, whether a list) of an option's annotation;
    ``str`` for text, paths and choices."""
    args = [a for a in typing.get_args(hint) if a is not type(None)]
    if typing.get_origin(hint) in (typing.Union, types.UnionType) and len(args) == 1:
        hint, args = args[0], list(typing.get_args(args[0]))
    if typing.get_origin(hint) is list:
        return _expected(args[0])[0], True
    return (hint if hint in (bool, int, float) else str), False


def _fits(kind: type, value: Any) -> bool:
    """Whether a TOML value is of ``kind`` (an integer is a float too, a bool no number)."""
    if kind is bool or isinstance(value, bool):
        return kind is bool and isinstance(value, bool)
    return isinstance(value, (int, float) if kind is float else kind)
