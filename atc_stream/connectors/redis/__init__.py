"""Redis: the wire protocol (RESP), pub/sub signals, exactly-once Redis Streams."""
