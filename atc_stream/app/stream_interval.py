"""The interval that a run on Redis Streams of bars labels its rows with: ``--interval``
checked against the bars' spacing, else that spacing, else the default."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Literal, NamedTuple

from atc_stream.app.console import RunError
from atc_stream.app.defaults import INTERVAL
from atc_stream.core.intervals import validate_interval
from atc_stream.core.spacing import spacing_fits

if TYPE_CHECKING:  # redis is an extra: the commands that read streams ask for it first
    import redis


#: where a ``StreamInterval`` came from: ``--interval``, the bars' spacing, the default, or
#: (a cluster's) the shard snapshots
Origin = Literal["option", "bars", "default", "snapshots"]


class StreamInterval(NamedTuple):
    """The interval to label rows with, and where it came from: ``source`` for the
    start line, ``origin`` for the code that decides by it."""

    interval: str
    source: str
    origin: Origin

    def said(self) -> str:
        """``1h, inferred from the spacing of the bars it holds``."""
        return f"{self.interval}, {self.source}"


def choose_stream_interval(
    client: redis.Redis,
    streams: Sequence[str],
    interval: str | None,
    *,
    named: str | None = None,
    time_unit: str | None = None,
) -> StreamInterval:
    """``interval``, else the spacing of the bars that ``streams`` hold now
    (``streams_interval``), else the default. Entries carry no interval, and a label that
    silently says ``1m`` of hourly bars would follow every row into the outputs and the
    snapshots. ``named`` is how the messages name the streams (default: their keys).
    ``interval`` that the bars' spacing contradicts is a ``RunError``."""
    from atc_stream.connectors.redis.stream_spacing import SAMPLE_ENTRIES, streams_interval

    inferred = streams_interval(client, streams, time_unit=time_unit)
    named = named or ", ".join(streams)
    one = len(streams) == 1
    if interval is not None:
        if inferred is not None and not spacing_fits(interval, inferred):
            raise RunError(
                f"--interval {interval} does not match the bars of {named}, which are "
                f"{inferred} apart (most common spacing of {'its' if one else 'their'} "
                f"first {SAMPLE_ENTRIES:,} entries); give --interval {inferred}"
            )
        return StreamInterval(interval, "from --interval", "option")
    if inferred is None:
        return StreamInterval(
            INTERVAL,
            f"the default: {named} {'holds' if one else 'hold'} no two bars of a symbol to "
            "infer it from; give --interval to label the rows",
            "default",
        )
    return StreamInterval(
        validate_interval(inferred),
        f"inferred from the spacing of the bars {'it holds' if one else 'they hold'}",
        "bars",
    )
