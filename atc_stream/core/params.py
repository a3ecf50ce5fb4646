"""ATCParams: the validated parameters of one ATC configuration (docs/spec.md, "Parameters").

Pure Python with no I/O dependencies, so every layer (kernels, engine, snapshots,
CLI) can import it. Construction validates every field and raises a ``ValueError``
that names the offending field. ``load_param_sets`` reads a JSON file of them (the
``--params`` option).
"""

from __future__ import annotations

import json
import math
import numbers
import os
from dataclasses import asdict, dataclass, fields
from typing import Any

#: MA families in canonical (layer-2 summation) order.
FAMILIES: tuple[str, ...] = ("EMA", "HMA", "WMA", "DEMA", "LSMA", "KAMA")
N_FAMILIES = len(FAMILIES)
#: Each family has 9 lengths: L, L+o1..L+o4, L-o1..L-o4.
LENGTHS_PER_FAMILY = 9
N_MAS = N_FAMILIES * LENGTHS_PER_FAMILY

#: Offsets (o1, o2, o3, o4) per robustness setting.
ROBUSTNESS_OFFSETS: dict[str, tuple[int, int, int, int]] = {
    "Narrow": (1, 2, 3, 4),
    "Medium": (1, 2, 4, 6),
    "Wide": (1, 3, 5, 7),
}
#: The largest base length of a family (docs/spec.md, "Parameters"): each stream keeps a
#: ring of its last ``max_length + 1`` closes, twice, so a length is memory per stream;
#: 10,000 is over a year of hourly bars, and a typo like 1e12 is refused, not allocated.
MAX_LENGTH = 10_000
#: The largest count field (``cutout``, a strategy's ``max_hold``): the kernels hold counts
#: as int64, and a larger Python int would fail there instead of being refused here.
MAX_COUNT = 2**63 - 1


def _is_int(value: Any) -> bool:
    """Python or NumPy integer (``np.int64(28)``), not a bool."""
    return isinstance(value, numbers.Integral) and not _is_bool(value)


def _is_real(value: Any) -> bool:
    """Python or NumPy integer/float scalar, not a bool."""
    return isinstance(value, numbers.Real) and not _is_bool(value)


def _is_bool(value: Any) -> bool:
    return isinstance(value, bool) or type(value).__name__ == "bool_"


#: Fields holding ints / floats: NumPy scalars are normalised to Python ``int``/``float``
#: so equality, hashing, JSON and snapshots see one representation.
_INT_FIELDS = ("ema_len", "hma_len", "wma_len", "dema_len", "lsma_len", "kama_len", "cutout")
_FLOAT_FIELDS = (
    "ema_w", "hma_w", "wma_w", "dema_w", "lsma_w", "kama_w",
    "La", "De", "cut", "long_threshold", "short_threshold",
)  # fmt: skip


@dataclass(frozen=True)
class ATCParams:
    """One ATC parameter set, with the defaults of docs/spec.md.

    ``La`` and ``De`` are in the indicator's user units; the engine uses
    ``lam = La / 1000`` and ``decay = 1 - De / 100`` (see :attr:`lam`, :attr:`decay`).
    """

    ema_len: int = 28
    hma_len: int = 28
    wma_len: int = 28
    dema_len: int = 28
    lsma_len: int = 28
    kama_len: int = 28
    ema_w: float = 1.0
    hma_w: float = 1.0
    wma_w: float = 1.0
    dema_w: float = 1.0
    lsma_w: float = 1.0
    kama_w: float = 1.0
    robustness: str = "Medium"
    La: float = 0.02
    De: float = 0.03
    cutout: int = 0
    cut: float = 0.49
    long_threshold: float = 0.1
    short_threshold: float = -0.1

    def __post_init__(self) -> None:
        self._normalise_scalars()
        if self.robustness not in ROBUSTNESS_OFFSETS:
            raise ValueError(
                f"robustness must be one of {sorted(ROBUSTNESS_OFFSETS)}, got {self.robustness!r}"
            )
        widest = ROBUSTNESS_OFFSETS[self.robustness][-1]
        for family in FAMILIES:
            name = f"{family.lower()}_len"
            length = getattr(self, name)
            if not _is_int(length):
                raise ValueError(f"{name} must be an int, got {length!r}")
            if length > MAX_LENGTH:
                raise ValueError(f"{name} must be <= {MAX_LENGTH}, got {length}")
            if length - widest < 1:
                raise ValueError(
                    f"{name}={length} with robustness {self.robustness!r} gives length "
                    f"{length - widest} (< 1); every derived length must be >= 1, "
                    f"so {name} must be >= {widest + 1}"
                )
            weight_name = f"{family.lower()}_w"
            self._require_finite(weight_name)
            if getattr(self, weight_name) <= 0:
                raise ValueError(f"{weight_name} must be > 0, got {getattr(self, weight_name)!r}")
        for name in ("La", "De", "cut", "long_threshold", "short_threshold"):
            self._require_finite(name)
        if not 0 <= self.De < 100:
            raise ValueError(f"De must be in [0, 100) (decay per bar in percent), got {self.De!r}")
        if self.cut < 0:
            raise ValueError(f"cut must be >= 0, got {self.cut!r}")
        if not _is_int(self.cutout) or not 0 <= self.cutout <= MAX_COUNT:
            raise ValueError(f"cutout must be an int in [0, {MAX_COUNT}], got {self.cutout!r}")
        if not self.short_threshold < self.long_threshold:
            raise ValueError(
                f"short_threshold ({self.short_threshold!r}) must be < "
                f"long_threshold ({self.long_threshold!r})"
            )

    def _normalise_scalars(self) -> None:
        """NumPy integer/float scalars become ``int``/``float``; anything else is left for
        the checks below to name."""
        for name in _INT_FIELDS:
            value = getattr(self, name)
            if _is_int(value) and type(value) is not int:
                object.__setattr__(self, name, int(value))
        for name in _FLOAT_FIELDS:
            value = getattr(self, name)
            if _is_real(value) and type(value) not in (int, float):
                object.__setattr__(self, name, float(value))
        if type(self.robustness).__name__ == "str_":  # np.str_
            object.__setattr__(self, "robustness", str(self.robustness))

    def _require_finite(self, name: str) -> None:
        value = getattr(self, name)
        if not _is_real(value) or not math.isfinite(value):
            raise ValueError(f"{name} must be a finite number, got {value!r}")

    # -- derived quantities ----------------------------------------------------

    @property
    def offsets(self) -> tuple[int, int, int, int]:
        return ROBUSTNESS_OFFSETS[self.robustness]

    def family_lengths(self, family: str) -> tuple[int, ...]:
        """The 9 lengths of one family in canonical order: L, L+o1..L+o4, L-o1..L-o4."""
        base = getattr(self, f"{family.lower()}_len")
        o = self.offsets
        return (base, *(base + k for k in o), *(base - k for k in o))

    @property
    def lengths(self) -> tuple[tuple[int, ...], ...]:
        """All 6 x 9 lengths, families in canonical order."""
        return tuple(self.family_lengths(f) for f in FAMILIES)

    @property
    def weights(self) -> tuple[float, ...]:
        """Layer-2 starting equities, families in canonical order."""
        return tuple(float(getattr(self, f"{f.lower()}_w")) for f in FAMILIES)

    @property
    def max_length(self) -> int:
        return max(max(ls) for ls in self.lengths)

    @property
    def lam(self) -> float:
        """Internal growth rate: La / 1000."""
        return self.La / 1000.0

    @property
    def decay(self) -> float:
        """Per-bar equity factor d = 1 - De / 100."""
        return 1.0 - self.De / 100.0

    # -- (de)serialisation ---------------------------------------------------------

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> ATCParams:
        known = {f.name for f in fields(cls)}
        unknown = sorted(set(data) - known)
        if unknown:
            raise ValueError(f"unknown ATC parameter(s): {', '.join(unknown)}")
        return cls(**data)


def load_param_sets(path: str | os.PathLike | None) -> list[ATCParams]:
    """Parameter sets from a JSON file: one object, or a list of objects (a sweep);
    ``[ATCParams()]`` for None. ``ValueError`` (one line) for a file that cannot be read
    or holds invalid parameters."""
    if path is None:
        return [ATCParams()]
    try:
        with open(path) as f:
            data = json.load(f)
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise ValueError(f"cannot read parameters from {path}: {exc}") from None
    items = data if isinstance(data, list) else [data]
    if not items:  # an empty sweep is a mistake, not a wish for the defaults
        raise ValueError(f"{path}: no parameter set (give an object, or a list of them)")
    for item in items:
        if not isinstance(item, dict):
            raise ValueError(
                f"{path}: a parameter set is a JSON object of name: value, got {item!r}"
            )
    try:
        return [ATCParams.from_dict(item) for item in items]
    except (TypeError, ValueError) as exc:
        raise ValueError(f"{path}: {exc}") from None
