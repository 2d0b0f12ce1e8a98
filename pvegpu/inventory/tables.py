"""The README's variable tables, generated from the specs' field descriptions (scripts/readme_tables.py)."""

from __future__ import annotations

import types
from typing import Annotated, Any, Literal, Union, get_args, get_origin

from pydantic import BaseModel
from pydantic_core import PydanticUndefined

from pvegpu.models.node import NODE_KEY, NodeSpec
from pvegpu.models.spec_validation import model_of, union_tags


def spec_table_markdown(model: type[BaseModel] = NodeSpec, prefix: str = NODE_KEY) -> str:
    """A markdown table (field, type, default, description) of `model`, nested models flattened.

    The README's variable table is generated from this, so descriptions are the documentation.
    """
    lines = ["| variable | type | default | description |", "|---|---|---|---|"]
    lines.extend(_table_rows(model, prefix))
    return "\n".join(lines) + "\n"


def _table_rows(model: type[BaseModel], prefix: str) -> list[str]:
    rows: list[str] = []
    for name, info in model.model_fields.items():
        path = f"{prefix}.{name}"
        nested = model_of(info.annotation)
        if nested is not None:
            rows.extend(_table_rows(nested, path))
            continue
        default = "*required*" if info.default is PydanticUndefined else f"`{info.default}`"
        description = (info.description or "").replace("|", "\\|")
        rows.append(f"| `{path}` | {_type_name(info.annotation)} | {default} | {description} |")
        for member in union_tags(info.annotation).values():  # each form's fields, under the same path
            rows.extend(_table_rows(member, path))
    return rows


def _type_name(annotation: Any) -> str:
    """Readable type of a field annotation; refuses shapes it does not know rather than guessing."""
    origin, args = get_origin(annotation), get_args(annotation)
    if origin is Annotated:
        return _type_name(args[0])
    if origin is Literal:
        return "one of " + ", ".join(f"`{arg}`" for arg in args)
    if origin in (Union, types.UnionType):
        named = [_type_name(arg) for arg in args if arg is not type(None)]
        return " or ".join(named) + (" or `None`" if type(None) in args else "")
    if origin is tuple and len(args) == 2 and args[1] is Ellipsis:
        return f"list of {_type_name(args[0])}s"
    if origin is dict:
        return f"mapping of {_type_name(args[0])} to {_type_name(args[1])}"
    return _plain_name(annotation)


def _plain_name(annotation: Any) -> str:
    """A scalar's name, or `mapping (`a`, `b`)` for a form of a tagged union (its fields get rows)."""
    names = {str: "string", int: "integer", bool: "boolean", float: "number"}
    if annotation in names:
        return names[annotation]
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return "mapping (" + ", ".join(f"`{name}`" for name in annotation.model_fields) + ")"
    raise TypeError(f"no table type name for {annotation!r}")
