"""JSON as every way in sends it: strict (RFC 8259), whatever the values hold.

Python's `json.dumps` writes a float NaN or infinity as `NaN` / `Infinity`, which no JSON parser but
Python's accepts: a browser's `JSON.parse` throws on the whole message. So a non-finite float goes out as
`null` (the value is not known, which is what it meant), numpy scalars and arrays as numbers and lists, and
anything else that is no JSON type as its text.
"""

import json
import math
from collections.abc import Mapping


def jsonable(value):
    """`value` as plain JSON types: dicts with string keys, lists, str, int, finite float, bool, None."""
    if isinstance(value, float):  # numpy's float64 too
        return float(value) if math.isfinite(value) else None
    if value is None or isinstance(value, (str, bool)):
        return value
    if isinstance(value, int):
        return int(value)
    if isinstance(value, Mapping):
        return {str(key): jsonable(item) for key, item in value.items()}
    if isinstance(value, (list, tuple, set, frozenset)):
        return [jsonable(item) for item in value]
    if hasattr(value, "tolist"):  # numpy arrays and scalars (float32, int64, bool_), torch tensors
        return jsonable(value.tolist())
    return str(value)


def json_text(value) -> str:
    """`value` as strict JSON text (jsonable's types; allow_nan=False guards the rule)."""
    return json.dumps(jsonable(value), allow_nan=False)
