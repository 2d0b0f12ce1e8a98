"""One role spec validated from a host's data (`spec_of`), its problems as `path.to.field: message` lines
with a "did you mean" for a misspelt field."""

from __future__ import annotations

import difflib
import types
from collections.abc import Mapping
from typing import Annotated, Any, Protocol, TypeVar, Union, get_args, get_origin

from pydantic import BaseModel, Tag, ValidationError
from pydantic_core import ErrorDetails

from pvegpu.models.errors import InventoryError
from pvegpu.models.fields import shown

SpecT = TypeVar("SpecT", bound=BaseModel)


def validate_spec(key: str, model: type[BaseModel], value: object) -> tuple[BaseModel | None, list[str]]:
    if isinstance(value, model):
        return value, []
    if not isinstance(value, Mapping):
        return None, [f"{key}: must be a mapping (got {shown(value)})"]
    try:
        return model.model_validate(value), []
    except ValidationError as error:
        return None, [_problem_line(key, model, detail) for detail in error.errors()]


class HostDataLike(Protocol):
    """A host's data as roles see it: a mapping, or pyinfra's `host.data` (`get(key, default)`)."""

    def get(self, key: str, default: Any, /) -> Any: ...


def spec_of(data: HostDataLike, key: str, model: type[SpecT]) -> SpecT:
    """The validated spec under `key` of one host's data (roles pass `host.data`; inventories were checked
    already).

    A role key that is absent gets the model's defaults; raises `InventoryError` when the data is invalid.
    """
    spec, problems = validate_spec(key, model, data.get(key, {}))
    if problems or not isinstance(spec, model):
        raise InventoryError(problems)
    return spec


def _problem_line(key: str, model: type[BaseModel], detail: ErrorDetails) -> str:
    path = ".".join((key, *_data_path(model, detail["loc"])[0]))
    return f"{path}: {_message(model, detail)}"


def _data_path(
    model: type[BaseModel], loc: tuple[int | str, ...]
) -> tuple[list[str], type[BaseModel] | None]:
    """`loc` as the operator's data has it, and the model holding its last field (None: not a model).

    pydantic puts a discriminated union's tag in the location (`image.url.checksum`); the data has no such
    level, so it is left out (`image.checksum`)."""
    parts: list[str] = []
    annotation: Any = model
    holder: type[BaseModel] | None = model
    for part in loc:
        tags = union_tags(annotation)
        if part in tags:
            annotation = tags[str(part)]
            continue
        parts.append(str(part))
        holder = model_of(annotation)
        field = None if holder is None else holder.model_fields.get(str(part))
        annotation = None if field is None else field.annotation
    return parts, holder


def union_tags(annotation: Any) -> dict[str, Any]:
    """The members of a discriminated union (also inside `X | None`) by their tag; empty for other types."""
    origin, args = get_origin(annotation), get_args(annotation)
    if origin is Annotated:
        tag = next((meta.tag for meta in args[1:] if isinstance(meta, Tag)), None)
        return {tag: args[0]} if tag is not None else union_tags(args[0])
    if origin in (Union, types.UnionType):
        return {tag: member for arg in args for tag, member in union_tags(arg).items()}
    return {}


def _message(model: type[BaseModel], detail: ErrorDetails) -> str:
    """Rewrite one pydantic error as an operator-facing sentence."""
    kind, ctx = detail["type"], detail.get("ctx", {})
    if kind == "value_error":
        return str(ctx["error"])
    if kind == "extra_forbidden":
        return "unknown field" + _suggestion(model, detail["loc"])
    got = f" (got {shown(detail['input'])})"
    choices = str(ctx.get("expected", "")).replace("'", "").replace(" or ", ", ")
    sentences = {
        "missing": "is required",
        "bool_parsing": f"must be true or false{got}",
        "bool_type": f"must be true or false{got}",
        "literal_error": f"must be one of {choices}{got}",
        "string_type": f"must be a string{got}",
        "tuple_type": f"must be a list{got}",
        "int_type": f"must be a whole number{got}",
        "model_type": f"must be a mapping{got}",
        "greater_than_equal": f"must be at least {ctx.get('ge')}{got}",
    }
    return sentences.get(kind, detail["msg"] + got)


def _suggestion(model: type[BaseModel], loc: tuple[int | str, ...]) -> str:
    """` (did you mean 'gpus'?)` when an unknown field is a near miss of a known one."""
    parts, holder = _data_path(model, loc)
    if holder is None:
        return ""
    close = difflib.get_close_matches(parts[-1], list(holder.model_fields), n=1)
    return f" (did you mean {close[0]!r}?)" if close else ""


def model_of(annotation: Any) -> type[BaseModel] | None:
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return annotation
    return None
