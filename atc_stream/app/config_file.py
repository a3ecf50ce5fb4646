"""``--config FILE``: a command's options from a TOML file, each key checked (an unknown key
or a bad value is one line naming the file and key, exit 2); options given on the command
line win, and every one of them can undo what the file sets.

The file's values become the click context's ``default_map``: click ranks them below the
command line and the environment (parameter source ``DEFAULT_MAP``) and converts and
range-checks them as it does typed flags. ``ConfigCommand`` gives each on/off flag its
off form (``--no-resume``) and turns an option whose default is none off when it is given
an empty value (``--redis ''``); paths in the file may start with ``~``.
"""

from __future__ import annotations

import inspect
import os
import types
import typing
from pathlib import Path
from typing import Any

import typer
from typer.core import TyperCommand, TyperOption

from atc_stream.app.logs import LogFormat
from atc_stream.core.toml_files import read_toml

#: Options whose value is a comma-separated list: the file may give a TOML array instead.
COMMA_LISTS = frozenset({"symbols"})
#: Text options whose value is a path (or a list of them): ``~`` is expanded in the file.
PATH_TEXTS = frozenset({"output", "strategy"})
#: Where ``ctx.meta`` keeps the ``--log-format`` asked for (command line, else the file),
#: so that a usage error of the command is written in it.
LOG_FORMAT = "atc_stream.log_format"
_LOG_FORMATS = frozenset(f.value for f in LogFormat)


class ConfigCommand(TyperCommand):
    """A command whose options may come from ``--config``: each on/off flag has its off
    form (``--no-resume``), and an empty value turns off an option whose default is none
    (``--redis ''``, ``--max-seconds=``), so that a flag can undo any setting of the file.
    The ``--log-format`` of the command line is known before any option is checked."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        for param in self.params:
            if not isinstance(param, TyperOption) or param.is_eager:
                continue
            if param.is_bool_flag and not param.secondary_opts:
                param.secondary_opts = [f"--no-{o[2:]}" for o in param.opts if o[:2] == "--"]
            elif param.default is None and not param.required and not param.is_flag:
                param.__class__ = _OffWhenEmpty

    def parse_args(self, ctx: Any, args: list[str]) -> list[str]:
        if any(p.name == "log_format" for p in self.params):
            given = _log_format_given(self, ctx, args)
            if given is not None:  # a value it refuses is refused in plain text
                ctx.meta[LOG_FORMAT] = given if given in _LOG_FORMATS else "text"
        return super().parse_args(ctx, args)


def _log_format_given(command: TyperCommand, ctx: Any, args: list[str]) -> Any:
    """The ``--log-format`` value of ``args`` (None when not given), before any option is
    checked: from the parser alone, or, where it fails (an unknown option), from the words."""
    try:  # the parser consumes its list: a copy
        return command.make_parser(ctx).parse_args(args=list(args))[0].get("log_format")
    except typer.TyperException:
        given = None
        for word, after in zip(args, [*args[1:], None], strict=False):
            if word == "--log-format":
                given = after
            elif word.startswith("--log-format="):
                given = word.partition("=")[2]
        return given


class _OffWhenEmpty(TyperOption):
    """An option whose default is none, for which an empty value is none (off); of a
    repeatable one, an empty value is left out."""

    def process_value(self, ctx: Any, value: Any) -> Any:
        if self.multiple and isinstance(value, (list, tuple)):
            value = tuple(v for v in value if v != "") or None
        elif value == "":
            value = None
        return super().process_value(ctx, value)


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
    form = document.get("log_format", document.get("log-format"))
    if form in _LOG_FORMATS:  # a later bad key is reported in it
        ctx.meta.setdefault(LOG_FORMAT, form)
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
        hint = hints.get(option.name)
        kind, multiple = _expected(hint)
        if option.name in PATH_TEXTS or _is_path(hint):  # ~ is the shell's on a command line
            item = _home_expanded(item)
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


def _is_path(hint: Any) -> bool:
    """Whether an option's annotation is a path (or an optional one, or a list of them)."""
    return hint is Path or any(_is_path(a) for a in typing.get_args(hint))


def _home_expanded(item: Any) -> Any:
    """A path of the file (or each of a list) with a leading ``~`` or ``~user`` expanded;
    a relative one stays relative to the working directory, as on a command line."""
    if isinstance(item, list):
        return [_home_expanded(x) for x in item]
    return os.path.expanduser(item) if isinstance(item, str) else item


def _fits(kind: type, value: Any) -> bool:
    """Whether a TOML value is of ``kind`` (an integer is a float too, a bool no number)."""
    if kind is bool or isinstance(value, bool):
        return kind is bool and isinstance(value, bool)
    return isinstance(value, (int, float) if kind is float else kind)
