"""Live exchange feeds: kline protocol, REST backfill, websocket session, the feed."""
