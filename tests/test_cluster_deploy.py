"""deploy/cluster-compose.yaml and deploy/Dockerfile.cluster hold together (Docker itself
does not run here): Redis, a Ray head and workers of one image, the router and the cluster
driver, whose commands the real ``atc-stream cluster`` parser accepts."""

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
COMPOSE = yaml.safe_load((DEPLOY / "cluster-compose.yaml").read_text())
SERVICES = COMPOSE["services"]


def option(command: list[str], name: str) -> str:
    return command[command.index(name) + 1]


def parse(command: list[str]) -> dict:
    """The parameters the real ``atc-stream`` parser gives ``command``."""
    import typer

    from atc_stream.app.cli import app

    group = typer.main.get_command(app).commands["cluster"]
    assert command[0] == "cluster"
    args = command[1:]
    if args and args[0] in group.commands:
        with group.commands[args[0]].make_context(args[0], args[1:]) as ctx:
            return ctx.params
    with group.make_context("cluster", args) as ctx:
        return ctx.params


def test_services_share_one_image_built_with_the_ray_extra():
    assert set(SERVICES) == {"redis", "ray-head", "ray-worker", "router", "cluster"}
    assert SERVICES["redis"]["image"].startswith("redis:")
    images = {name: s.get("image") for name, s in SERVICES.items() if name != "redis"}
    assert len(set(images.values())) == 1  # same Python and Ray on every node
    for name in images:
        build = SERVICES[name]["build"]
        assert (DEPLOY / build["context"]).resolve() == REPO
        assert (REPO / build["dockerfile"]).is_file()
    dockerfile = (DEPLOY / "Dockerfile.cluster").read_text()
    (extras,) = re.findall(r'pip install "\.\[([a-z,]+)\]"', dockerfile)
    declared = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    assert extras == "ray" and "ray" in declared["optional-dependencies"]
    assert "atc-stream compile" in dockerfile and 'ENTRYPOINT ["atc-stream"]' in dockerfile


def test_the_workers_join_the_head_and_the_driver_connects_to_it():
    head, worker = SERVICES["ray-head"], SERVICES["ray-worker"]
    assert head["entrypoint"] == ["ray"] and worker["entrypoint"] == ["ray"]
    assert head["command"][:2] == ["start", "--head"] and "--block" in head["command"]
    (port,) = [a.split("=")[1] for a in head["command"] if a.startswith("--port=")]
    assert f"--address=ray-head:{port}" in worker["command"] and "--block" in worker["command"]
    assert worker["depends_on"]["ray-head"]["condition"] == "service_healthy"
    assert f"127.0.0.1:{port}" in " ".join(head["healthcheck"]["test"])
    params = parse(SERVICES["cluster"]["command"])
    assert params["ray_address"] == f"ray-head:{port}"
    assert params["redis"].startswith("redis://redis:") and params["shards"] >= 1
    assert params["output_stream"] and params["publish"]
    assert SERVICES["cluster"]["stop_signal"] == "SIGTERM"
    for needed in ("redis", "ray-head"):
        assert SERVICES["cluster"]["depends_on"][needed]["condition"] == "service_healthy"


def test_the_router_feeds_the_shard_count_the_cluster_runs():
    route = parse(SERVICES["router"]["command"])
    cluster = parse(SERVICES["cluster"]["command"])
    assert route["shards"] == cluster["shards"] and route["redis"] == cluster["redis"]
    assert route["input_stream"] and route["redis_prefix"] == cluster["redis_prefix"]
    assert "--appendonly" in SERVICES["redis"]["command"]  # streams outlive a restart
