"""The base install (no extras) runs every command's default path, and a command that needs
a missing extra says so in one line naming it (exit 2), never with a traceback.

The first tests hide one optional module from the running interpreter; the others build
the wheel, install it into a fresh virtual environment without extras (from the package
registry, through pip's cache) and run the commands there as a user would.
"""

from __future__ import annotations

import importlib.util
import json
import os
import shutil
import subprocess
import sys
import venv
from pathlib import Path

import numpy as np
import pytest

from atc_stream import compute
from atc_stream.app import extras
from atc_stream.app.plot import plot_signals

REPO = Path(__file__).resolve().parent.parent
pytestmark = pytest.mark.timeout(1800)  # pip downloads, then one first kernel compile
T0 = 1_700_000_040_000  # epoch ms, on the minute

#: pip output that means the registry (or the network to it) cannot be reached
NETWORK_FAILURES = (
    "NewConnectionError",
    "NameResolutionError",
    "Failed to establish a new connection",
    "Temporary failure in name resolution",
    "Name or service not known",
    "Network is unreachable",
    "ConnectTimeoutError",
    "ReadTimeoutError",
    "Max retries exceeded",
    "ProxyError",
)

#: A command needing each extra: its arguments, a module the extra brings, the extra named.
REDIS = "redis://127.0.0.1:1"
NEEDS_AN_EXTRA = {
    "live": ("live --symbols BTCUSDT --max-seconds 1", "aiohttp", "live"),
    "ccxt": ("live --exchange ccxt:okx --symbols BTC/USDT --max-seconds 1", "ccxt", "ccxt"),
    "redis": (f"replay {{bars}} --redis {REDIS}", "redis", "redis"),
    "subscribe": (f"subscribe --redis {REDIS} --count 1", "redis", "redis"),
    "run-stream": (f"run-stream --redis {REDIS} --input-stream bars", "redis", "redis"),
    "plot": ("plot {bars} -o {tmp}/chart.png", "matplotlib", "plot"),
    "cluster": (f"cluster --shards 2 --redis {REDIS}", "ray", "ray"),
    "cuda": ("demo --backend cuda --bars 100 -o {tmp}/d.jsonl", "numba_cuda", "cuda12"),
    "sweep-ray": ("sweep {bars} --grid {tmp}/grid.toml --ray", "ray", "ray"),
}


def write_bars(path: Path, symbols: int = 2, bars: int = 200) -> dict[str, np.ndarray]:
    """A CSV of ``symbols`` random walks of ``bars`` one-minute bars; their closes."""
    rng = np.random.default_rng(11)
    closes = {
        f"S{k}": np.round(100 * np.exp(np.cumsum(rng.normal(0, 0.01, bars))), 4)
        for k in range(symbols)
    }
    lines = ["symbol,time,close"]
    for i in range(bars):
        lines += [f"{s},{T0 + i * 60_000},{float(c[i])!r}" for s, c in closes.items()]
    path.write_text("\n".join(lines) + "\n")
    return closes


def command_line(name: str, bars: Path, tmp: Path) -> list[str]:
    args, _, _ = NEEDS_AN_EXTRA[name]
    return args.format(bars=bars, tmp=tmp).split()


def assert_one_line_naming(stderr: str, extra: str) -> None:
    assert "Traceback" not in stderr, stderr
    lines = stderr.strip().splitlines()
    assert len(lines) == 1, stderr
    assert lines[0].startswith("atc-stream: error: "), stderr
    assert f"atc-stream[{extra}]" in lines[0], stderr


# -- a module hidden from this interpreter ---------------------------------------------------


def hide(monkeypatch, module: str) -> None:
    real = importlib.util.find_spec
    monkeypatch.setattr(extras, "find_spec", lambda name: None if name == module else real(name))


@pytest.mark.parametrize("name", sorted(NEEDS_AN_EXTRA))
def test_command_without_its_extra_is_one_line_naming_it(name, tmp_path, monkeypatch, run_main):
    bars = tmp_path / "bars.csv"
    write_bars(bars)
    hide(monkeypatch, NEEDS_AN_EXTRA[name][1])
    code, stderr = run_main(command_line(name, bars, tmp_path))
    assert code == 2
    assert_one_line_naming(stderr, NEEDS_AN_EXTRA[name][2])
    assert not (tmp_path / "chart.png").exists() and not (tmp_path / "d.jsonl").exists()


def test_plot_function_without_matplotlib_raises_import_error_naming_the_extra(monkeypatch):
    hide(monkeypatch, "matplotlib")
    with pytest.raises(ImportError, match=r"atc-stream\[plot\]"):
        plot_signals(compute(np.linspace(100.0, 110.0, 80)))


# -- a fresh virtual environment with the wheel and no extras --------------------------------


def run(args: list[str], *, cwd: Path, timeout: float = 900) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
    env.pop("NUMBA_ENABLE_CUDASIM", None)
    return subprocess.run(args, cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout)


def pip(args: list[str], *, cwd: Path) -> None:
    """Run pip; skip when it failed because the package registry cannot be reached."""
    done = run([*args, "--retries", "2", "--timeout", "60"], cwd=cwd)
    if done.returncode == 0:
        return
    output = done.stdout + done.stderr
    reason = next((line for line in output.splitlines() if any(
        failure in line for failure in NETWORK_FAILURES)), None)  # fmt: skip
    if reason is not None:
        pytest.skip(f"the package registry cannot be reached: {reason.strip()[:300]}")
    pytest.fail(f"{' '.join(args[:4])} ... failed:\n{output[-4000:]}")


@pytest.fixture(scope="module")
def base_venv(tmp_path_factory) -> Path:
    """The ``bin`` directory of a new virtual environment holding the wheel, no extras."""
    work = tmp_path_factory.mktemp("base-install")
    source = work / "source"  # built from a copy: the build leaves build/ behind
    source.mkdir()
    for name in ("pyproject.toml", "README.md", "LICENSE"):
        shutil.copy2(REPO / name, source / name)
    ignore = shutil.ignore_patterns("__pycache__", "*.pyc")
    shutil.copytree(REPO / "atc_stream", source / "atc_stream", ignore=ignore)
    wheels = work / "wheels"
    pip([sys.executable, "-m", "pip", "wheel", "--no-deps", "-q", "-w", str(wheels), "."],
        cwd=source)  # fmt: skip
    (wheel,) = wheels.glob("atc_stream-*.whl")
    env_dir = work / "venv"
    venv.EnvBuilder(with_pip=True, clear=True).create(env_dir)
    bin_dir = env_dir / ("Scripts" if os.name == "nt" else "bin")
    pip([str(bin_dir / "python"), "-m", "pip", "install", "-q", str(wheel)], cwd=work)
    listed = run([str(bin_dir / "python"), "-m", "pip", "list", "--format=json"], cwd=work)
    installed = {p["name"].lower() for p in json.loads(listed.stdout)}
    assert not installed & {"aiohttp", "redis", "pandas", "matplotlib", "numba-cuda", "cupy"}
    where = run([str(bin_dir / "python"), "-c", "import atc_stream; print(atc_stream.__file__)"],
                cwd=work)  # fmt: skip
    assert Path(where.stdout.strip()).resolve().is_relative_to(env_dir.resolve()), where
    return bin_dir


def atc(bin_dir: Path, *args: str, cwd: Path) -> subprocess.CompletedProcess:
    return run([str(bin_dir / "atc-stream"), *args], cwd=cwd)


def test_base_install_compiles_the_kernels(base_venv, tmp_path):
    done = atc(base_venv, "compile", cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    assert "kernels in" in done.stderr and "cache:" in done.stderr


def test_base_install_runs_the_demo(base_venv, tmp_path):
    out = tmp_path / "demo.jsonl"
    done = atc(base_venv, "demo", "--symbols", "3", "--bars", "300", "--warmup", "100",
               "-o", str(out), "--no-progress", cwd=tmp_path)  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert "Traceback" not in done.stderr
    assert "full recomputation check: last signal of 3 symbols identical" in done.stderr
    rows = [json.loads(line) for line in out.read_text().splitlines()]
    assert len({r["symbol"] for r in rows}) == 3
    assert len(rows) >= 3 * 200 and all("signal" in r for r in rows)


def test_base_install_replays_a_csv_like_compute(base_venv, tmp_path):
    bars = tmp_path / "bars.csv"
    closes = write_bars(bars)
    done = atc(base_venv, "replay", str(bars), "--strict", "--no-progress", cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    assert "Traceback" not in done.stderr and "replay done (cpu backend)" in done.stderr
    rows = [json.loads(line) for line in done.stdout.splitlines()]
    assert len(rows) == sum(len(c) for c in closes.values())
    for symbol, series in closes.items():
        got = np.array([r["signal"] for r in rows if r["symbol"] == symbol], dtype=float)
        np.testing.assert_array_equal(got, compute(series)["signal"])


def test_base_install_computes_a_series_like_this_checkout(base_venv, tmp_path):
    closes = np.round(100 + np.cumsum(np.random.default_rng(7).normal(0, 0.5, 400)), 2)
    source = tmp_path / "closes.npy"
    np.save(source, closes)
    script = (
        "import sys, json, numpy as np\n"
        "from atc_stream import ATCParams, compute\n"
        "out = compute(np.load(sys.argv[1]), ATCParams())\n"
        "print(json.dumps([float(x) for x in out['signal']]))\n"
    )
    done = run([str(base_venv / "python"), "-c", script, str(source)], cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    got = np.array(json.loads(done.stdout), dtype=float)
    np.testing.assert_array_equal(got, compute(closes)["signal"])


@pytest.mark.parametrize("name", sorted(NEEDS_AN_EXTRA))
def test_base_install_names_the_missing_extra(base_venv, tmp_path, name):
    bars = tmp_path / "bars.csv"
    write_bars(bars, bars=20)
    done = atc(base_venv, *command_line(name, bars, tmp_path), cwd=tmp_path)
    assert done.returncode == 2, done.stderr
    assert_one_line_naming(done.stderr, NEEDS_AN_EXTRA[name][2])
