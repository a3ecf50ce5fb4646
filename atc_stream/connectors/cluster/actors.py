"""Shard engines as Ray actors: one restartable actor per shard, placed on a GPU when the
Ray cluster has them (the only module of the package that imports Ray)."""

from __future__ import annotations

from typing import Any

import ray

from atc_stream.connectors.cluster.shard import ShardConfig, ShardWorker

#: Restarts of a shard actor (and retries of its ``run``) before Ray gives up: -1 = never.
MAX_RESTARTS = -1


class ShardActor:
    """A ``ShardWorker`` in a Ray actor: ``run`` is retried on the restarted actor after
    a crash, a ``SIGKILL`` or a lost node, and resumes from the shard's snapshot."""

    def __init__(self, config: ShardConfig) -> None:
        self.worker = ShardWorker(config, node=ray.get_runtime_context().get_node_id())

    def run(self, stop_when_idle: float | None = None) -> dict[str, Any]:
        return self.worker.run(stop_when_idle=stop_when_idle)

    def stop(self) -> None:
        self.worker.stop()

    def pid(self) -> int:
        return self.worker.pid()


def gpus_available() -> bool:
    """Whether the connected Ray cluster offers at least one GPU."""
    return float(ray.cluster_resources().get("GPU", 0)) >= 1


def start_shard_actors(configs: list[ShardConfig], *, num_gpus: float = 0.0) -> list[Any]:
    """One actor per config (``num_gpus`` each; 1 CPU each without), restarted by Ray
    whenever it dies."""
    remote = ray.remote(ShardActor)
    return [
        remote.options(
            max_restarts=MAX_RESTARTS,
            max_task_retries=MAX_RESTARTS,
            max_concurrency=3,
            num_cpus=0 if num_gpus else 1,
            num_gpus=num_gpus,
        ).remote(config)  # fmt: skip
        for config in configs
    ]
