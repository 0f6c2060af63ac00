"""The agent's one validator of a value against a JSON schema (`tiny_llm.agent.actions.check_value`),
given to students with week 4: JSON Schema's equality, and the reason a value fits no branch."""

import pytest

from tiny_llm.agent.actions import check_value


def test_check_value_compares_json_values_as_json_schema_does():
    """`const` and `enum` compare as JSON Schema does, at any depth: 1 equals 1.0 (also inside
    arrays and objects), true is not 1, and objects are equal whatever the order of keys."""
    check_value(1.0, {"const": 1})
    check_value([1.0, 2], {"enum": [[1, 2]]})
    check_value({"b": [2.0], "a": 1}, {"const": {"a": 1.0, "b": [2]}})
    with pytest.raises(ValueError, match=r"value must be 1, got true"):
        check_value(True, {"const": 1})
    with pytest.raises(ValueError, match=r"value must be one of \[\[1\]\], got \[true\]"):
        check_value([True], {"enum": [[1]]})
    with pytest.raises(ValueError, match=r'value must be "1", got 1'):
        check_value(1, {"const": "1"})


def test_an_unmatched_any_of_gives_the_reason_of_the_closest_branch():
    """No branch fits: the reason is the one of the branch that shares the most keys with the
    value (the first on a tie), not a count of branches."""
    lines = {"type": "object", "properties": {"path": {"type": "string"}, "start": {"type": "integer"}},
             "required": ["path"], "additionalProperties": False}
    blob = {"type": "object", "properties": {"blob": {"type": "string"}, "start": {"type": "integer"},
                                             "end": {"type": "integer"}},
            "required": ["blob", "start", "end"], "additionalProperties": False}
    for key in ("anyOf", "oneOf"):
        with pytest.raises(ValueError, match=r"^read args is missing 'end'$"):
            check_value({"blob": "b", "start": 0}, {key: [lines, blob]}, "read args")
        with pytest.raises(ValueError, match=r"^read args is missing 'path'$"):
            check_value({}, {key: [lines, blob]}, "read args")
        with pytest.raises(ValueError, match=r"^read args.path must be string, got 3$"):
            check_value({"path": 3, "start": 0}, {key: [lines, blob]}, "read args")
    with pytest.raises(ValueError, match=r"matches 2 of the oneOf branches"):
        check_value(1, {"oneOf": [{"type": "integer"}, {"type": "number"}]})
