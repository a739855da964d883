"""Property: the registry's reader of the YAML files people write (files.load_yaml) either returns data or raises
YamlError, for any input. Nothing else escapes it (a ValueError, a RecursionError, an OverflowError would be a
traceback from `manage.py registry import`)."""

from hypothesis import given
from hypothesis import strategies as st

from apps.registry.files import YamlError, load_yaml
from tests.support.fuzz import ANY_TEXT, JSON_VALUES, bounded, json_text
from workers.definitions.canonical import data_problem

YAML_ALPHABET = "[]{}:,-?&*!|>'\"#%@`\n\t abxyz0123456789.eE+_~/\\"
YAML_TOKENS = st.sampled_from(["!!int ", "!!float ", "!!bool ", "!!timestamp ", "!!binary ", "!!set ",
                               "!!omap ", "!!pairs ", "!!python/", "!!null ",
                               "!!str ", "&a ", "*a", "<<: ", "? ", "--- ", "...", "%YAML 1.1\n", "0x", "0o", "1_0",
                               ".inf", ".nan", "2001-12-14t21:59:43.10-05:00", "2001-13-45", "1" * 5000, "\n  ",
                               "- ", "{", "}", "[", "]", ": ", "|\n ", ">-\n "])
YAML_TEXT = (st.text() | ANY_TEXT | st.text(YAML_ALPHABET, max_size=80)
             | st.lists(YAML_TOKENS | st.text(YAML_ALPHABET, max_size=6), max_size=20).map("".join)
             | st.integers(0, 3000).map(lambda depth: "a: " + "[" * depth + "1" + "]" * depth)
             | JSON_VALUES.map(json_text))  # JSON is YAML too (NaN is not: it is read as text)


@bounded(400)
@given(text=YAML_TEXT)
def test_load_yaml_returns_data_or_raises_yaml_error(text):
    try:
        value = load_yaml(text)
    except YamlError as exc:
        assert str(exc)
        return
    # What it returns the registry can store: no deep nesting, no NaN, no huge integer, no lone surrogate.
    assert data_problem(value) is None
