"""``python -m atc_stream``: the ``atc-stream`` command."""

from atc_stream.app.entry import main

main()
