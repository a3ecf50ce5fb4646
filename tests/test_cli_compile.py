"""``atc-stream compile`` and the global ``--threads`` option, run as real processes."""

from __future__ import annotations

import json
import subprocess
import sys
import time

import numpy as np
import pytest

from atc_stream import compute


def _cli(*args: str, env: dict | None = None) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "atc_stream", *args], capture_output=True, text=True,
        timeout=600, env=env,
    )  # fmt: skip


def test_compile_command_fills_the_cache_and_says_so():
    done = _cli("compile")
    assert done.returncode == 0, done.stderr
    assert "kernels in" in done.stderr and "cache:" in done.stderr
    again = _cli("compile")
    assert again.returncode == 0 and "loaded compiled kernels" in again.stderr


def test_threads_option_gives_the_same_rows(tmp_path):
    rng = np.random.default_rng(5)
    closes = 100 * np.exp(np.cumsum(rng.normal(0, 0.01, 200)))
    path = tmp_path / "bars.csv"
    path.write_text(
        "symbol,time,close\n" + "".join(f"A,{t},{float(c)!r}\n" for t, c in enumerate(closes))
    )
    rows = {}
    for threads in ("1", "2"):
        done = _cli(
            "--threads", threads, "replay", str(path), "--backend", "cpu", "--time-unit", "ms"
        )
        assert done.returncode == 0, done.stderr
        rows[threads] = [json.loads(line) for line in done.stdout.splitlines()]
    assert rows["1"] == rows["2"]
    expected = compute(closes)["signal"]
    got = np.array([r["signal"] for r in rows["1"]], dtype=float)
    np.testing.assert_allclose(got, expected, rtol=0, atol=1e-9, equal_nan=True)


def test_ctrl_c_during_a_first_compile_is_one_line_and_exit_130(tmp_path):
    """SIGINT while the kernels compile (an empty cache: minutes of work) ends the command
    as every other one ends on Ctrl-C, with one line and status 130; what the compile
    left half built is dropped quietly, not reported as a traceback on the way out."""
    import os
    import signal

    env = {**os.environ, "ATC_STREAM_CACHE_DIR": str(tmp_path)}
    process = subprocess.Popen(
        [sys.executable, "-m", "atc_stream", "compile"], stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env,
    )  # fmt: skip
    try:
        first = process.stderr.readline()
        assert "compiling kernels (first run only)" in first, first
        time.sleep(1.0)  # inside the compiler, not before it
        process.send_signal(signal.SIGINT)
        _, rest = process.communicate(timeout=120)
    finally:
        if process.poll() is None:
            process.kill()
    assert process.returncode == 130, first + rest
    assert rest == "atc-stream: interrupted\n", first + rest


# Runs the command as the ``atc-stream`` console script does, after saying on stdout that
# the interpreter and the entry point (a few ms of imports, before which a Ctrl-C is
# Python's own) are loaded: a SIGINT sent from then on lands in the command's start-up
# (its imports, typer's parsing, loading the job and the kernels).
_STARTED_THEN_COMMAND = """
import sys
from atc_stream.app.entry import main
print("started", flush=True)
sys.argv = ["atc-stream", *sys.argv[1:]]
sys.exit(main())
"""


@pytest.mark.parametrize("delay", [0.0, 0.03, 0.08, 0.15, 0.3, 0.6])
def test_ctrl_c_while_the_command_starts_is_one_line_and_exit_130(tmp_path, delay):
    """A Ctrl-C at any moment of the start-up (most of a second of imports before a job
    handles it) ends the command with one line and status 130: never a traceback, never
    a silent exit."""
    import signal

    process = subprocess.Popen(
        [sys.executable, "-c", _STARTED_THEN_COMMAND, "demo", "--symbols", "20",
         "--bars", "3000", "--output", str(tmp_path / "o.jsonl"), "--no-progress"],
        stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        assert process.stdout.readline() == "started\n"
        time.sleep(delay)
        process.send_signal(signal.SIGINT)
        _, err = process.communicate(timeout=120)
    finally:
        if process.poll() is None:
            process.kill()
    assert process.returncode == 130, err
    assert "Traceback" not in err, err
    # before the run takes the signal over: one line; after: its own stop and summary
    assert err.endswith("atc-stream: interrupted\n") or "stopping after the current batch" in err, (
        err
    )
    assert err.count("atc-stream: interrupted") <= 1, err


def test_bad_threads_value_is_a_usage_error():
    done = _cli("--threads", "-2", "compile")
    assert done.returncode == 2 and "Traceback" not in done.stderr


def test_live_max_seconds_is_honoured_with_kernels_loaded_first(tmp_path):
    """Kernels are compiled/loaded before connecting, so --max-seconds bounds the session."""
    import time

    pytest.importorskip("aiohttp")
    from test_binance_live import IMS, FakeExchange, make_bars

    closes = make_bars(["BTCUSDT"], 400)
    t0 = int(time.time() * 1000) - 300 * IMS - 1000
    with FakeExchange(closes, 300, t0=t0, bar_pause=0.5) as ex:
        started = time.monotonic()
        done = _cli(
            "live", "--symbols", "BTCUSDT", "--history", "50", "--ws-url", ex.ws_url,
            "--rest-url", ex.rest_url, "--output", str(tmp_path / "o.jsonl"),
            "--max-seconds", "2", "--backend", "cpu", "--status-every", "0",
        )  # fmt: skip
        elapsed = time.monotonic() - started
    assert done.returncode == 0, done.stderr
    assert "Traceback" not in done.stderr
    assert elapsed < 2 + 12  # interpreter start, imports and the cached-kernel load


WARMUP_WITH_PROGRESS = """
import numpy as np
from atc_stream import Engine
engine = Engine(backend="cpu")
times = np.arange(200, dtype=np.int64) * 60_000
history = {f"S{i}": (times, 100 + np.cumsum(np.ones(200))) for i in range(3)}
engine.warmup(history, progress=True)
engine.warmup({"T": (times, 100 + np.cumsum(np.ones(200)))}, progress=True)
"""


def test_warmup_progress_shows_the_kernel_phase_before_its_own_bar():
    """In a new process the kernels are loaded (or compiled) as a phase of their own, so the
    warmup bar's rate and ETA leave it out; a second warmup has nothing left to load."""
    done = subprocess.run(
        [sys.executable, "-c", WARMUP_WITH_PROGRESS], capture_output=True, text=True, timeout=600
    )
    assert done.returncode == 0, done.stderr
    err = done.stderr
    phase = min(i for i in (err.find("loading kernels"), err.find("compiling kernels")) if i >= 0)
    assert 0 <= phase < err.index("warmup")
    # the phase ran once: the second warmup found every kernel loaded
    # (one start of the bar, ``0/``; tqdm may redraw it on the way)
    assert err.count("loading kernels: 0/") + err.count("(first run only): 0/") == 1


STEPS_AFTER_PREPARE = """
import numpy as np
from atc_stream import Engine
from atc_stream.kernels import prepare
Engine.compile({compile_args})
before = [len(d.signatures) for d in prepare._dispatchers()]
engine = Engine(backend="cpu")
times = np.arange(3, dtype=np.int64) * 60_000
engine.warmup({{f"S{{i}}": (times, np.full(3, 100.0 + i)) for i in range(4000)}})
slots = np.concatenate([engine.slots_of(f"S{{i}}") for i in range(4000)])
engine.step_arrays(slots, np.full(4000, 3 * 60_000), np.full(4000, 101.0))
engine.preview_arrays(slots, np.full(4000, 4 * 60_000), np.full(4000, 102.0))
engine.step_arrays(slots, np.full(4000, 4 * 60_000), np.full(4000, 102.0))  # steady
engine.step_arrays(slots[:1], [5 * 60_000], [103.0])
after = [len(d.signatures) for d in prepare._dispatchers()]
print(before == after, {loaded})
"""
BIG_STEPS_AFTER_PREPARE = STEPS_AFTER_PREPARE.format(
    compile_args="", loaded="prepare.kernels_loaded()"
)


def test_prepared_kernels_cover_big_parallel_and_small_serial_calls():
    """After ``prepare_kernels`` (what ``atc-stream compile``, ``Engine.compile`` and the
    CLI run first) no call compiles or loads another driver: the parallel step and
    preview drivers are among those loaded, not left to the first big live step."""
    done = subprocess.run(
        [sys.executable, "-c", BIG_STEPS_AFTER_PREPARE], capture_output=True, text=True,
        timeout=600,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["True", "True"]


ATC_ONLY_AFTER_PREPARE = STEPS_AFTER_PREPARE.format(
    compile_args="strategies=False",
    loaded="prepare.kernels_loaded(strategies=False), prepare.kernels_loaded()",
)


def test_an_engine_without_strategies_prepares_only_its_own_kernels():
    """``compile(strategies=False)`` (what the CLI runs for an engine without strategies)
    loads every kernel such an engine calls, and leaves paper trading's and the
    backtest's out: a first run compiles about 40 % less."""
    done = subprocess.run(
        [sys.executable, "-c", ATC_ONLY_AFTER_PREPARE], capture_output=True, text=True,
        timeout=600,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["True", "True", "False"]


def test_the_loading_ctrl_c_handler_is_put_away_once_the_job_is_loaded(monkeypatch):
    """While the command loads, a Ctrl-C inside an import ends the process at once (an
    interrupted import cannot be unwound); once its job is loaded, a Ctrl-C unwinds as
    Python's does, so that the job's ``finally`` clauses run, inside a later import too."""
    import signal

    from atc_stream.app import entry
    from atc_stream.app import run_job as run_job_module

    handlers = []
    monkeypatch.setattr(run_job_module, "load_job", lambda job: lambda: handlers.append(
        signal.getsignal(signal.SIGINT)))  # fmt: skip
    previous = entry._take_ctrl_c()
    try:
        assert previous is signal.default_int_handler, "pytest left Python's handler"
        assert getattr(signal.getsignal(signal.SIGINT), "while_loading", False)
        run_job_module.run_job("a:job")
        assert handlers == [signal.default_int_handler]
    finally:
        signal.signal(signal.SIGINT, signal.default_int_handler)
