"""Redis: RESP, pub/sub signals, exactly-once Redis Streams, snapshots in Redis."""
