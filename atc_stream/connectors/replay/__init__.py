"""Replay of bar and tick files through the engine, in memory bounded by streams."""
