"""Commands: the CLI, one job module per command, and the durability of a run."""
