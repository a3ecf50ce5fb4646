"""Files: readers of bar/tick files and writers of signal rows (JSONL, CSV, Parquet parts).

Network adapters live in ``atc_stream.adapters``; everything that reads or writes local
files lives here, on the one output schema of ``atc_stream.schema``.
"""
