"""Files: readers of bar/tick files and writers of signal rows (JSONL, CSV, Parquet parts)."""
