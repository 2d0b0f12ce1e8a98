"""PVE::JSONSchema: the parameter schema (`P`), the value checks and their error texts, property strings."""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class P:
    """One parameter: JSON type, constraints, and for property strings the sub-schema."""

    type: str = "string"
    optional: bool = True
    pattern: str | None = None
    verify: Callable[[str], None] | None = None
    minimum: int | None = None
    maximum: int | None = None
    max_length: int | None = None
    enum: tuple[str, ...] = ()
    props: dict[str, P] | None = None  # a property string (format => {...})
    default_key: str | None = None
    list_format: bool = False  # a `*-list` format: repeats are joined with ","
    items: P | None = None  # array items
    requires: str | None = None  # another key that must be set with this one


def add_error(errors: dict[str, str], path: str, msg: str) -> None:
    errors.setdefault(path, msg)


def check_value(path: str, schema: P, value: Any, errors: dict[str, str]) -> Any:  # noqa: PLR0911, PLR0912
    """JSONSchema::check_prop for a CLI value (a string, or a list for arrays); returns the typed value."""
    if schema.type == "array":
        assert schema.items is not None
        return [check_value(f"{path}[{i}]", schema.items, v, errors) for i, v in enumerate(value)]
    if schema.type == "boolean":
        parsed = parse_boolean(value)
        if parsed is None:
            add_error(errors, path, f"type check ('boolean') failed - got '{value}'")
        return parsed
    if schema.type == "integer":
        if not re.fullmatch(r"[+-]?\d+", value):
            add_error(errors, path, f"type check ('integer') failed - got '{value}'")
            return None
        number = int(value)
        if schema.verify is not None and not _verified(path, schema, value, errors):
            return None
        if schema.minimum is not None and number < schema.minimum:
            add_error(errors, path, f"value must have a minimum value of {schema.minimum}")
        if schema.maximum is not None and number > schema.maximum:
            add_error(errors, path, f"value must have a maximum value of {schema.maximum}")
        return number
    if schema.type == "number":
        if not re.fullmatch(r"[+-]?(\d+(\.\d*)?|\.\d+)([eE][+-]?\d+)?", value):
            add_error(errors, path, f"type check ('number') failed - got '{value}'")
        return value
    if schema.props is not None:
        try:
            parsed_ps = parse_property_string(schema, value)
        except ValueError as error:
            add_error(errors, path, f"invalid format - {str(error).rstrip()}")
            return value
        check_object(path, schema.props, parsed_ps, errors)
        return value
    if schema.verify is not None and not _verified(path, schema, value, errors):
        return value
    if schema.pattern is not None and not re.fullmatch(schema.pattern, value):
        add_error(errors, path, "value does not match the regex pattern")
    if schema.max_length is not None and len(value) > schema.max_length:
        add_error(errors, path, f"value may only be {schema.max_length} characters long")
    if schema.enum and value not in schema.enum:
        add_error(
            errors,
            path,
            f"value '{value}' does not have a value in the enumeration '{', '.join(schema.enum)}'",
        )
    return value


def _verified(path: str, schema: P, value: str, errors: dict[str, str]) -> bool:
    assert schema.verify is not None
    try:
        schema.verify(value)
    except ValueError as error:
        add_error(errors, path, f"invalid format - {str(error).rstrip()}")
        return False
    return True


def check_object(path: str, props: dict[str, P], value: dict[str, str], errors: dict[str, str]) -> None:
    for key, schema in props.items():
        if key not in value:
            if not schema.optional:
                add_error(errors, f"{path}.{key}", "property is missing and it is not optional")
            continue
        check_value(f"{path}.{key}", schema, value[key], errors)
    check_requires(path, props, value, errors)


def check_requires(path: str, props: dict[str, P], value: dict[str, Any], errors: dict[str, str]) -> None:
    """JSONSchema::check_object's `requires`: `<path.other>: missing property required by '<path.key>'`."""
    prefix = f"{path}." if path else ""
    for key in value:
        required = props[key].requires if key in props else None
        if required is not None and required not in value:
            add_error(errors, f"{prefix}{required}", f"missing property required by '{prefix}{key}'")


def parse_property_string(schema: P, text: str) -> dict[str, str]:
    """JSONSchema::parse_property_string's syntax errors (ValueError); values are checked by the caller."""
    assert schema.props is not None
    result: dict[str, str] = {}
    for part in text.split(","):
        if part == "":
            continue
        match = re.fullmatch(r"([^=]+)=(.+)", part, re.DOTALL)
        if match:
            key, value = match.groups()
            if key in result:
                raise ValueError(f"duplicate key in comma-separated list property: {key}\n")
            if key not in schema.props:
                raise ValueError(f"invalid key in comma-separated list property: {key}\n")
            result[key] = value
        elif "=" not in part:
            if schema.default_key is None:
                raise ValueError("value without key, but schema does not define a default key\n")
            if schema.default_key in result:
                raise ValueError(f"duplicate key in comma-separated list property: {schema.default_key}\n")
            result[schema.default_key] = part
        else:
            raise ValueError("missing key in comma-separated list property\n")
    return result


def parse_boolean(value: str) -> int | None:
    lowered = value.lower()
    if lowered in ("1", "on", "yes", "true"):
        return 1
    if lowered in ("0", "off", "no", "false"):
        return 0
    return None
