"""The one retry/backoff policy of every reconnect and retry loop: exponential, capped, jittered."""

from __future__ import annotations

import random
from collections.abc import Callable
from dataclasses import dataclass

import tenacity


@dataclass(frozen=True)
class Backoff:
    """Delay before retry ``attempt`` (0 for the first retry): ``min(maximum, initial *
    factor**attempt)``, shortened by a random 0..``jitter`` of itself so that clients
    that lost the same server do not come back in step.

    Every loop that reconnects or retries (the exchange feed and its REST requests, the
    Redis publishers, subscriber and stream runner) uses ``DEFAULT_BACKOFF`` unless its
    caller passes another ``Backoff``. Invalid values raise ``ValueError``.
    """

    initial: float = 0.1
    maximum: float = 5.0
    factor: float = 2.0
    jitter: float = 0.5

    def __post_init__(self) -> None:
        if not (isinstance(self.initial, (int, float)) and self.initial > 0):
            raise ValueError(f"backoff initial delay must be > 0 s, got {self.initial!r}")
        if not (isinstance(self.maximum, (int, float)) and self.maximum >= self.initial):
            raise ValueError(
                f"backoff maximum must be >= the initial delay {self.initial}, got {self.maximum!r}"
            )
        if not (isinstance(self.factor, (int, float)) and self.factor >= 1):
            raise ValueError(f"backoff factor must be >= 1, got {self.factor!r}")
        if not (isinstance(self.jitter, (int, float)) and 0 <= self.jitter <= 1):
            raise ValueError(f"backoff jitter must be in [0, 1], got {self.jitter!r}")

    def delay(self, attempt: int, rng: Callable[[], float] = random.random) -> float:
        """Seconds to wait before retry ``attempt`` (0, 1, 2, ...); ``rng`` in [0, 1)."""
        base = min(self.maximum, self.initial * self.factor ** min(attempt, 64))
        return base * (1.0 - self.jitter * rng())

    def wait(self, rng: Callable[[], float] = random.random) -> tenacity.wait.wait_base:
        """This schedule as a tenacity wait strategy (``tenacity.Retrying(wait=...)``)."""
        return _TenacityWait(self, rng)

    def schedule(self, rng: Callable[[], float] = random.random) -> BackoffSchedule:
        """A running schedule for a reconnect loop: ``next()`` after each failure,
        ``reset()`` once the connection works again."""
        return BackoffSchedule(self, rng)


DEFAULT_BACKOFF = Backoff()


class BackoffSchedule:
    """The delays of one reconnect loop: they grow while attempts fail and start again
    from ``initial`` after ``reset()``."""

    def __init__(self, policy: Backoff, rng: Callable[[], float] = random.random) -> None:
        self.policy = policy
        self.attempt = 0
        self._rng = rng

    def next(self) -> float:
        """The delay before the next attempt; the one after it is longer."""
        delay = self.policy.delay(self.attempt, self._rng)
        self.attempt += 1
        return delay

    def reset(self) -> None:
        self.attempt = 0


class _TenacityWait(tenacity.wait.wait_base):
    def __init__(self, policy: Backoff, rng: Callable[[], float]) -> None:
        self.policy = policy
        self.rng = rng

    def __call__(self, retry_state: tenacity.RetryCallState) -> float:
        return self.policy.delay(retry_state.attempt_number - 1, self.rng)
