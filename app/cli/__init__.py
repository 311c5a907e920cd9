"""The ``kiln`` command line: ``python -m app.cli`` (``cli.main``), ``kiln run``, ``kiln bake``."""
