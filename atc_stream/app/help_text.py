"""Command help reflowed: a docstring's paragraphs as one line each, for the terminal to wrap."""

from __future__ import annotations

import inspect

import typer

#: click's mark for a paragraph shown as written (a TOML example, a table)
VERBATIM = "\b"


def reflow(text: str | None) -> str | None:
    """``text`` with each paragraph's line breaks made spaces, paragraphs that start with
    ``VERBATIM`` left as written. typer's rich help keeps a docstring's line breaks and
    wraps again at the terminal's width, so lines broken for the source's width came out
    ragged (a line, then one word, then a line)."""
    if not text:
        return text
    paragraphs = inspect.cleandoc(text).split("\n\n")
    return "\n\n".join(
        paragraph
        if paragraph.startswith(VERBATIM)
        else " ".join(line.strip() for line in paragraph.splitlines())
        for paragraph in paragraphs
    )


def reflow_commands(app: typer.Typer) -> None:
    """``reflow`` the help of ``app``, its commands and its groups' (in place, before
    typer builds the click commands)."""
    callback = app.registered_callback
    if isinstance(app.info.help, str):
        app.info.help = reflow(app.info.help)
        if callback is not None and isinstance(callback.help, str):
            callback.help = reflow(callback.help)
    elif callback is not None:  # typer's next choice: the callback's help or docstring
        callback.help = reflow(_help_of(callback.help, callback.callback))
    for command in app.registered_commands:
        command.help = reflow(_help_of(command.help, command.callback))
    for group in app.registered_groups:
        if group.typer_instance is not None:
            reflow_commands(group.typer_instance)


def _help_of(help_text: object, callback: object) -> str | None:
    """A command's help as typer would take it: its own, else its function's docstring."""
    if isinstance(help_text, str):
        return help_text
    return inspect.getdoc(callback) if callback is not None else None
