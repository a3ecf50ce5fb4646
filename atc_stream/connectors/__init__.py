"""Sources and sinks: exchange feeds, Redis, and replay of bar and tick files."""
