"""Beyond one machine: bars routed to shard streams, one exactly-once engine per shard
(docs/design/cluster.md). Ray is imported only by the jobs that start shard actors."""
