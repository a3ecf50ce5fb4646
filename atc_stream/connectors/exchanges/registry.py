"""The exchanges ``atc-stream live --exchange`` names, and the adapter of each name."""

from __future__ import annotations

from atc_stream.connectors.exchanges.exchange import Exchange
from atc_stream.connectors.exchanges.venues.binance import BinanceSpot, BinanceUsdm
from atc_stream.connectors.exchanges.venues.bybit import BybitLinear, BybitSpot
from atc_stream.connectors.exchanges.venues.okx import Okx

#: The native adapters by name.
NATIVE: dict[str, type[Exchange]] = {
    cls.name: cls for cls in (BinanceSpot, BinanceUsdm, BybitSpot, BybitLinear, Okx)
}
#: ``ccxt:<id>``: any exchange of ccxt.pro (the ``ccxt`` extra).
CCXT_PREFIX = "ccxt:"
DEFAULT_EXCHANGE = "binance"


def exchange_names() -> str:
    """The names ``--exchange`` takes, for help and error lines."""
    return ", ".join([*NATIVE, f"{CCXT_PREFIX}<id>"])


def is_ccxt(name: str) -> bool:
    return name.startswith(CCXT_PREFIX)


def make_exchange(name: str) -> Exchange:
    """The adapter named ``name``; ``ValueError`` (one line) for an unknown name. A
    ``ccxt:<id>`` needs ccxt installed (the caller checks the extra first)."""
    if is_ccxt(name):
        from atc_stream.connectors.exchanges.venues.ccxt_pro import CcxtExchange

        return CcxtExchange(name[len(CCXT_PREFIX) :])
    try:
        return NATIVE[name]()
    except KeyError:
        raise ValueError(f"unknown exchange {name!r}; choose one of {exchange_names()}") from None
