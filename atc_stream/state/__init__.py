"""State: the field table, the host state arrays, snapshots and their stores."""
