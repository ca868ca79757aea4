"""AST grading of function calls under BFCL's rules (Python categories).

Our own implementation of the rules of bfcl-eval's AST checker, kept verdict-for-verdict equal
to it (tests compare the two on every task's ground truth and on broken calls):

* **Call count and matching.** ``simple``: exactly one call, checked against the task's (only)
  function. ``multiple``: as many calls as answers (one), checked against the function the
  answer names. ``parallel*``: as many calls as answers, matched order-independently: each
  expected call, in answer order, takes the first still-unmatched call that passes (greedy, as
  BFCL does).
* **One call.** The name must be the function's; every ``required`` parameter present; every
  given parameter must exist both in the function's properties and in the answer; parameters
  of the answer that are not given must allow ``""`` (optional).
* **Types** (BFCL's Python mapping: ``any`` counts as a string, ``tuple`` as a list). An int is
  accepted where a float is expected (converted first). A value whose type differs from the
  declared one is still accepted when it has the type of the answer's values (BFCL's
  "variable" case, e.g. a name given as a string); it is then compared exactly. Lists are
  checked one level deep against the item type.
* **Values.** Strings are compared after normalisation (spaces and ``,./-_*^`` removed, lower
  case, ``'`` -> ``"``); lists element-wise with their strings normalised; dicts key by key
  (normalised string values, keys absent from the model's dict must allow ``""``); lists of
  dicts dict by dict in order; everything else by ``==`` against the possible values.
"""

from __future__ import annotations

import dataclasses
import json
import re
from collections.abc import Mapping, Sequence
from typing import Any

_PYTHON_TYPES: dict[str, type] = {
    "string": str,
    "integer": int,
    "float": float,
    "boolean": bool,
    "array": list,
    "tuple": list,
    "dict": dict,
    "any": str,
}
_LIST_TYPES = ("array", "tuple")
_STRIP_RE = re.compile(r"[ ,./\-_*^]")
_OPTIONAL = ""


@dataclasses.dataclass(frozen=True)
class Verdict:
    """The grade of one answer.

    Attributes:
        valid: The calls match the task's possible answers.
        error: Why not (empty when valid).
    """

    valid: bool
    error: str = ""

    def __bool__(self) -> bool:
        return self.valid


_VALID = Verdict(True)


def _shown(value: Any, limit: int) -> str:
    """``repr(value)`` cut at ``limit`` characters, for messages; never raises (an int too long
    for ``repr``, 4,300 digits and up, is named instead of crashing the grade)."""
    try:
        return repr(value)[:limit]
    except ValueError:
        return f"<{type(value).__name__} too long to show>"


def normalize_string(text: str) -> str:
    """BFCL's string normalisation: drop spaces and ``,./-_*^``, lower-case, ``'`` -> ``"``."""
    return _STRIP_RE.sub("", text).lower().replace("'", '"')


def _normalized(value: Any) -> Any:
    return normalize_string(value) if type(value) is str else value


def _answer_type(possible: Sequence[Any]) -> type | None:
    """The type of the first possible value that is not the optional marker."""
    for value in possible:
        if value != _OPTIONAL:
            return type(value)
    return None


def _type_ok(
    value: Any, possible: Sequence[Any], expected: type, item_type: type | None
) -> tuple[bool, bool]:
    """(type accepted, value is a "variable" to compare exactly)."""
    answer_type = _answer_type(possible)
    variable = answer_type is not None and answer_type is not expected
    if type(value) is expected:
        if item_type is None:
            return True, variable
        for candidate in possible:
            if type(candidate) is list and not all(
                _type_ok(item, candidate, item_type, None)[0] for item in value
            ):
                continue
            return True, variable
        return False, False
    if answer_type is not None and type(value) is answer_type:
        return True, True
    return False, False


def _string_ok(value: str, possible: Sequence[Any]) -> bool:
    return normalize_string(value) in [normalize_string(p) for p in possible if type(p) is str]


def _list_ok(value: list[Any], possible: Sequence[Any]) -> bool:
    normalized = [_normalized(item) for item in value]
    candidates = [
        [_normalized(item) for item in candidate]
        for candidate in possible
        if isinstance(candidate, list | str)
    ]
    return normalized in candidates


def _dict_ok(value: Mapping[str, Any], possible: Sequence[Any]) -> bool:
    for candidate in possible:
        if candidate == _OPTIONAL or not isinstance(candidate, Mapping):
            continue
        given_ok = all(
            key in candidate and _normalized(item) in [_normalized(c) for c in candidate[key]]
            for key, item in value.items()
        )
        omitted_ok = all(key in value or _OPTIONAL in options for key, options in candidate.items())
        if given_ok and omitted_ok:
            return True
    return False


def _list_of_dicts_ok(value: list[Any], possible: Sequence[Any]) -> bool:
    for candidate in possible:
        if not isinstance(candidate, list | str) or len(candidate) != len(value):
            continue
        if all(
            isinstance(item, Mapping) and _dict_ok(item, [expected])
            for item, expected in zip(value, candidate, strict=True)
        ):
            return True
    return False


def check_call(
    function: Mapping[str, Any], name: str, arguments: Mapping[str, Any], answer: Mapping[str, Any]
) -> Verdict:
    """Checks one call against one function document and one expected call.

    Args:
        function: The BFCL function document (``name``, ``parameters``).
        name: The called function's name.
        arguments: The call's arguments.
        answer: The expected call, ``{function_name: {param: [possible values]}}``.

    Returns:
        The verdict, with the first problem found.
    """
    possible_by_param: Mapping[str, Sequence[Any]] = next(iter(answer.values()))
    expected_name = function["name"]
    if name != expected_name:
        return Verdict(False, f"expected a call of {expected_name!r}, got {name!r}")
    parameters = function.get("parameters") or {}
    properties: Mapping[str, Any] = parameters.get("properties") or {}
    for param in parameters.get("required") or ():
        if param not in arguments:
            return Verdict(False, f"{name}: missing required parameter {param!r}")
    for param, value in arguments.items():
        if param not in properties or param not in possible_by_param:
            return Verdict(False, f"{name}: unexpected parameter {param!r}")
        possible = possible_by_param[param]
        declared = properties[param].get("type")
        expected = _PYTHON_TYPES.get(declared, str)
        item_type = None
        if declared in _LIST_TYPES:
            item_type = _PYTHON_TYPES.get((properties[param].get("items") or {}).get("type"))
        if declared == "tuple" and type(value) is tuple:
            value = list(value)
        if declared == "float" and type(value) is int:
            value = float(value)
        type_ok, variable = _type_ok(value, possible, expected, item_type)
        if not type_ok:
            return Verdict(False, f"{name}: parameter {param!r} should be of type {declared}, "
                                  f"got {type(value).__name__} ({_shown(value, 80)})")
        if not variable:
            special = None
            if expected is dict:
                special = _dict_ok(value, possible)
            elif expected is list and item_type is dict:
                special = _list_of_dicts_ok(value, possible)
            elif expected is str:
                special = _string_ok(value, possible)
            elif expected is list:
                special = _list_ok(value, possible)
            if special is not None:
                if not special:
                    return Verdict(False, f"{name}: invalid value for {param!r}: {_shown(value, 80)}; "
                                          f"expected one of {list(possible)!r:.160}")
                continue
        if value not in possible:
            return Verdict(False, f"{name}: invalid value for {param!r}: {_shown(value, 80)}; "
                                  f"expected one of {list(possible)!r:.160}")
    for param, possible in possible_by_param.items():
        if param not in arguments and _OPTIONAL not in possible:
            return Verdict(False, f"{name}: parameter {param!r} is missing (it is not optional)")
    return _VALID


def _decode(calls: Sequence[Any]) -> list[tuple[str, dict[str, Any]]] | str:
    """``[(name, arguments)]`` from ``{"name", "arguments"}`` dicts, or why they are malformed."""
    decoded = []
    for index, call in enumerate(calls):
        if isinstance(call, Mapping) and isinstance(call.get("function"), Mapping):
            call = call["function"]  # OpenAI form
        name = call.get("name") if isinstance(call, Mapping) else None
        arguments = call.get("arguments", {}) if isinstance(call, Mapping) else None
        if isinstance(arguments, str):
            try:
                arguments = json.loads(arguments)
            except ValueError:
                arguments = None
        if not isinstance(name, str) or not isinstance(arguments, dict):
            return f"call {index} is malformed: {_shown(call, 120)}"
        decoded.append((name, arguments))
    return decoded


def _find_function(functions: Sequence[Mapping[str, Any]], name: str) -> Mapping[str, Any] | None:
    return next((f for f in functions if f.get("name") == name), None)


def grade_calls(
    functions: Sequence[Mapping[str, Any]],
    calls: Sequence[Any],
    ground_truth: Sequence[Mapping[str, Any]],
    category: str,
) -> Verdict:
    """Grades a turn's calls against a BFCL task.

    Args:
        functions: The task's BFCL function documents.
        calls: The calls, ``{"name": str, "arguments": dict or JSON text}`` each.
        ground_truth: The task's possible answers (one ``{name: {param: [values]}}`` per call).
        category: The BFCL category (``simple_python``, ``multiple``, ``parallel``,
            ``parallel_multiple``): it selects the matching rule.

    Returns:
        The verdict (truthy when valid).
    """
    decoded = _decode(calls)
    if isinstance(decoded, str):
        return Verdict(False, decoded)
    expected_count = len(ground_truth) if "parallel" in category or "multiple" in category else 1
    if len(decoded) != expected_count:
        return Verdict(False, f"expected {expected_count} call(s), got {len(decoded)}")
    if "parallel" in category:
        matched: set[int] = set()
        for number, answer in enumerate(ground_truth):
            function = _find_function(functions, next(iter(answer)))
            if function is None:
                return Verdict(False, f"expected call {number} names no function of the task")
            last = Verdict(False, "no call left to match")
            for index, (name, arguments) in enumerate(decoded):
                if index in matched:
                    continue
                last = check_call(function, name, arguments, answer)
                if last:
                    matched.add(index)
                    break
            if not last:
                return Verdict(False, f"no call matches expected call {number}: {last.error}")
        return _VALID
    if "multiple" in category:
        function = _find_function(functions, next(iter(ground_truth[0])))
        if function is None:
            return Verdict(False, "the expected call names no function of the task")
    else:
        function = functions[0]
    name, arguments = decoded[0]
    return check_call(function, name, arguments, ground_truth[0])


def _concrete_dict(possible_dict: Mapping[str, Any]) -> dict[str, Any]:
    """A dict from a dict of possible values: each key's first value, optional keys omitted."""
    return {
        key: options[0]
        for key, options in possible_dict.items()
        if isinstance(options, list) and options and options[0] != _OPTIONAL
    }


def _concrete(value: Any, declared: Mapping[str, Any]) -> Any:
    """A possible value as a model would write it: BFCL writes dict-typed answers as dicts of
    possible values (and lists of dicts as lists of those); pick the first of each."""
    kind = declared.get("type")
    if kind == "dict" and isinstance(value, Mapping):
        return _concrete_dict(value)
    item_kind = (declared.get("items") or {}).get("type")
    if kind in _LIST_TYPES and item_kind == "dict" and isinstance(value, list):
        return [_concrete_dict(v) if isinstance(v, Mapping) else v for v in value]
    return value


def oracle_calls(
    functions: Sequence[Mapping[str, Any]], ground_truth: Sequence[Mapping[str, Any]]
) -> list[dict[str, Any]]:
    """The first possible answer of each expected call, as ``{"name", "arguments"}`` dicts.

    A parameter whose first possible value is ``""`` (optional) is omitted, unless the function
    requires it: then its first non-empty possible value is used. Answer keys that are not
    parameters of the function are left out. Dict values (and lists of
    dicts) take the first possible value of each of their keys, omitting optional keys.
    """
    calls = []
    for answer in ground_truth:
        name, possible_by_param = next(iter(answer.items()))
        function = _find_function(functions, name) or {}
        parameters = function.get("parameters") or {}
        properties = parameters.get("properties") or {}
        required = set(parameters.get("required") or ())
        arguments = {}
        for param, possible in possible_by_param.items():
            if param not in properties:  # an answer key the function does not have (data slip)
                continue
            values = [v for v in possible if v != _OPTIONAL]
            if possible and possible[0] != _OPTIONAL:
                arguments[param] = _concrete(possible[0], properties.get(param) or {})
            elif param in required and values:
                arguments[param] = _concrete(values[0], properties.get(param) or {})
        calls.append({"name": name, "arguments": arguments})
    return calls
