"""deploy/compose.yaml and deploy/Dockerfile hold together (Docker itself does not run
here): Redis and the live service, the live service's command accepted by the real
``atc-stream live`` parser with the mounted config file, its healthcheck on /healthz at
the metrics port it publishes, the snapshot volume, and an image with the extras it needs."""

from __future__ import annotations

import re
import sys
from pathlib import Path

import pytest

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - Python 3.10
    import tomli as tomllib

yaml = pytest.importorskip("yaml")

REPO = Path(__file__).resolve().parent.parent
DEPLOY = REPO / "deploy"
COMPOSE = yaml.safe_load((DEPLOY / "compose.yaml").read_text())


def option(command: list[str], name: str) -> str:
    return command[command.index(name) + 1]


def test_compose_runs_redis_and_the_live_service_built_from_the_dockerfile():
    services = COMPOSE["services"]
    assert set(services) == {"redis", "live"}
    assert services["redis"]["image"].startswith("redis:")
    assert "redis-cli" in services["redis"]["healthcheck"]["test"]
    live = services["live"]
    context = (DEPLOY / live["build"]["context"]).resolve()
    assert context == REPO and (context / live["build"]["dockerfile"]).is_file()
    assert live["depends_on"]["redis"]["condition"] == "service_healthy"
    assert live["stop_signal"] == "SIGTERM"
    command = live["command"]
    assert command[0] == "live"
    assert option(command, "--redis").startswith("redis://redis:")


def test_the_live_service_serves_health_metrics_and_keeps_snapshots_in_a_volume():
    live = COMPOSE["services"]["live"]
    command = live["command"]
    port = option(command, "--metrics-port")
    assert option(command, "--metrics-host") == "0.0.0.0"  # reachable through the mapping
    assert any(p.endswith(f":{port}:{port}") for p in live["ports"])
    health = " ".join(live["healthcheck"]["test"])
    assert f"127.0.0.1:{port}/healthz" in health and live["healthcheck"]["start_period"]
    mounts = dict(volume.split(":")[:2] for volume in live["volumes"])  # source: target
    data = next(source for source, target in mounts.items() if target == "/data")
    assert data in COMPOSE["volumes"]  # a named volume
    assert option(command, "--snapshot-dir").startswith("/data/") and "--resume" in command
    config = option(command, "--config")
    source = next(s for s, t in mounts.items() if t == config)
    assert (DEPLOY / source).resolve() == REPO / "examples" / "live.toml"


def test_the_live_service_command_parses_with_its_config_file():
    """The real parser takes the command (the mounted file read from the repository):
    every flag exists, every value and every key of the file is valid."""
    import typer

    from atc_stream.app.cli import app

    command = list(COMPOSE["services"]["live"]["command"])
    command[command.index("--config") + 1] = str(REPO / "examples" / "live.toml")
    live = typer.main.get_command(app).commands["live"]
    with live.make_context("live", command[1:]) as ctx:
        params = ctx.params
    assert params["metrics_port"] == 9108 and params["metrics_host"] == "0.0.0.0"
    assert params["symbols"].startswith("BTCUSDT,")  # from the file
    assert params["output"] == "/data/signals.jsonl"  # the flag won over the file


def test_the_image_installs_the_extras_it_runs_with():
    dockerfile = (DEPLOY / "Dockerfile").read_text()
    (extras,) = re.findall(r'pip install "\.\[([a-z,]+)\]"', dockerfile)
    declared = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    assert set(extras.split(",")) == {"live", "redis", "metrics"}
    assert set(extras.split(",")) <= set(declared["optional-dependencies"])
    assert "atc-stream compile" in dockerfile and re.search(r"^USER \w+", dockerfile, re.M)
    assert 'ENTRYPOINT ["atc-stream"]' in dockerfile
    ignored = (REPO / ".dockerignore").read_text().split()
    for needed in ("pyproject.toml", "README.md", "LICENSE", "atc_stream"):
        assert f"!{needed}" in ignored  # in the build context
