"""Command help reads as prose at any terminal width: no line broken where the source was."""

from __future__ import annotations

import pytest

from atc_stream.app.cli import main
from atc_stream.app.help_text import reflow

WIDE = 200
COMMANDS = [
    ["replay"], ["demo"], ["live"], ["subscribe"], ["run-stream"], ["sweep"], ["plot"],
    ["compile"], ["cluster"], ["cluster", "status"], ["cluster", "route"],
    ["cluster", "reshard"],
]  # fmt: skip


def test_reflow_joins_a_paragraph_and_keeps_a_verbatim_one():
    text = """First line
    of the summary.

    A paragraph broken
    where the source was.

    \b
        [atc]
        ema_len = [20, 28]
    """
    assert reflow(text) == (
        "First line of the summary.\n\nA paragraph broken where the source was.\n\n"
        "\b\n    [atc]\n    ema_len = [20, 28]"
    )
    assert reflow(None) is None and reflow("") == ""


def _description(out: str) -> list[list[str]]:
    """The paragraphs of a rendered help between its usage line and its first box."""
    lines = out.splitlines()
    start = next(i for i, line in enumerate(lines) if "Usage:" in line) + 1
    stop = next((i for i, line in enumerate(lines) if line.startswith("╭")), len(lines))
    paragraphs: list[list[str]] = [[]]
    for line in lines[start:stop]:
        if line.strip():
            paragraphs[-1].append(line.rstrip())
        elif paragraphs[-1]:
            paragraphs.append([])
    return [p for p in paragraphs if p]


@pytest.mark.parametrize("command", COMMANDS, ids=" ".join)
def test_help_paragraphs_wrap_at_the_terminal_width_only(command, capsys, monkeypatch):
    monkeypatch.setenv("COLUMNS", str(WIDE))
    with pytest.raises(SystemExit) as info:
        main([*command, "--help"])
    assert info.value.code == 0
    paragraphs = _description(capsys.readouterr().out)
    assert paragraphs, "the command has a description"
    for paragraph in paragraphs:
        if any(line.startswith("     ") for line in paragraph):  # an example, as written
            continue
        for line in paragraph[:-1]:  # a line followed by more of its paragraph is full
            assert len(line.strip()) > WIDE - 40, f"ragged help line: {line.strip()!r}"
