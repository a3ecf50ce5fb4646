"""A warning logged while a progress bar is shown gets a line of its own, not the middle
of the bar's line (the bar is drawn again below it)."""

from __future__ import annotations

import logging
import subprocess
import sys
from contextlib import contextmanager

from atc_stream.core.progress import NoBar, progress_bar


def _shown_lines(stderr: str) -> list[str]:
    """What a terminal shows of each line: the text after its last carriage return."""
    return [line.split("\r")[-1] for line in stderr.split("\n")]


@contextmanager
def _console_logging():
    """The root logger writing to (the captured) stderr, as a command sets it up."""
    root = logging.getLogger()
    saved = root.handlers[:], root.level
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(logging.Formatter("atc-stream: %(levelname)s %(message)s"))
    root.handlers[:] = [handler]
    root.setLevel(logging.WARNING)
    try:
        yield
    finally:
        root.handlers[:], level = saved
        root.setLevel(level)


def test_a_warning_inside_a_bar_gets_its_own_line_and_logging_is_restored(capsys):
    with _console_logging():
        handlers = logging.getLogger().handlers[:]
        with progress_bar(True, total=3, desc="work", mininterval=0) as bar:
            bar.update()
            logging.getLogger("atc_stream").warning("something was rejected")
            bar.update(2)
        assert logging.getLogger().handlers == handlers
    err = capsys.readouterr().err
    assert "atc-stream: WARNING something was rejected" in _shown_lines(err)
    assert "work:" in err  # the bar was shown


def test_no_bar_when_progress_is_off(capsys):
    with _console_logging(), progress_bar(False, total=3) as bar:
        assert isinstance(bar, NoBar)
        bar.update()
        bar.update(5)
        logging.getLogger("atc_stream").warning("plain")
    assert capsys.readouterr().err == "atc-stream: WARNING plain\n"


def test_replay_warns_about_a_rejected_close_on_a_line_of_its_own(tmp_path):
    rows = ["symbol,time,close"]
    for i in range(40):
        close = "-5" if i == 25 else f"{100 + i * 0.1:.2f}"
        rows.append(f"AAA,{1_700_000_000_000 + i * 60_000},{close}")
    data = tmp_path / "bars.csv"
    data.write_text("\n".join(rows) + "\n")
    done = subprocess.run(
        [sys.executable, "-m", "atc_stream", "replay", str(data), "--warmup", "10",
         "-o", str(tmp_path / "out.jsonl"), "--progress", "--backend", "cpu"],
        capture_output=True, text=True, timeout=600,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert "replay:" in done.stderr  # the bar was shown
    warnings = [line for line in _shown_lines(done.stderr) if "WARNING" in line]
    assert warnings and all(line.startswith("atc-stream: WARNING") for line in warnings), (
        done.stderr
    )
    assert any("non_positive_close" in line and "bars.csv:27" in line for line in warnings)


def test_a_replay_shows_the_rows_read_before_the_first_bar_is_played(tmp_path, run_main):
    """The first pass reads the whole file before any bar is played: minutes of a large
    file, shown by a bar of its own (rows read), then the replay's."""
    rows = ["symbol,time,close"]
    rows += [f"AAA,{1_700_000_000_000 + i * 60_000},{100 + i * 0.1:.2f}" for i in range(50)]
    data = tmp_path / "bars.csv"
    data.write_text("\n".join(rows) + "\n")
    out = str(tmp_path / "out.jsonl")
    code, stderr = run_main(["replay", str(data), "-o", out, "--progress", "--backend", "cpu"])
    assert code == 0, stderr
    reading, replay = stderr.find("reading: "), stderr.find("replay: ")
    assert 0 <= reading < replay, stderr
    code, stderr = run_main(["replay", str(data), "-o", out, "--no-progress"])
    assert code == 0 and "reading:" not in stderr, stderr
