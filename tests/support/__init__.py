"""What the tests share besides fixtures (those live in conftest.py files, where pytest finds them): specimens,
the real resources a test may need (resources.py), sandbox and process helpers, a fake judge server, an API
client. Imported as `tests.support.<module>`; nothing imports a conftest module."""

from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]  # the repository
