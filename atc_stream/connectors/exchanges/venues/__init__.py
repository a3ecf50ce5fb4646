"""Exchange adapters of the live feed, one module per exchange (``registry.py`` names them)."""
