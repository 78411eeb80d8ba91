"""Request bodies checked the way 0.5.4's pydantic models check them (protocol.py), with FastAPI's error
text: 0.5.4 answers a validation failure with 400 and `str(RequestValidationError)` as the message, i.e.
the Python repr of pydantic's error list (docs/facts/vllm-volta.md §5.4), e.g.
`[{'type': 'extra_forbidden', 'loc': ('body', 'max_completion_tokens'), 'msg': 'Extra inputs are not
permitted', 'input': 100}]`. OpenAI models forbid extra fields, which is why `max_completion_tokens`
(newer OpenAI clients) is refused by 0.5.x.

APPROXIMATION: the common pydantic v2 lax-mode coercions and error types are reproduced (missing,
extra_forbidden, string/int/float/bool/list/dict types and parsing, value_error from the models'
`mode="before"` validators, json_invalid); unions report one error, not one per member.
"""
from __future__ import annotations

import json
from typing import Any, Callable, Dict, List, Optional, Tuple

Error = Dict[str, Any]
_MISSING = object()


class ValidationFailed(Exception):
    def __init__(self, errors: List[Error]):
        super().__init__(str(errors))
        self.errors = errors


def _err(kind: str, loc: Tuple[Any, ...], msg: str, value: Any, ctx: Optional[Dict[str, Any]] = None) -> Error:
    error: Error = {"type": kind, "loc": ("body",) + loc, "msg": msg, "input": value}
    if ctx is not None:
        error["ctx"] = ctx
    return error


# --- scalar coercions (pydantic v2 lax mode) --------------------------------------------------------
def as_str(value: Any, loc) -> Tuple[Any, List[Error]]:
    if isinstance(value, str):
        return value, []
    return None, [_err("string_type", loc, "Input should be a valid string", value)]


def as_int(value: Any, loc) -> Tuple[Any, List[Error]]:
    if isinstance(value, bool):
        return int(value), []
    if isinstance(value, int):
        return value, []
    if isinstance(value, float):
        if value.is_integer():
            return int(value), []
        return None, [_err("int_from_float", loc, "Input should be a valid integer, got a number with a fractional "
                           "part", value)]
    if isinstance(value, str):
        try:
            return int(value.strip()), []
        except ValueError:
            return None, [_err("int_parsing", loc, "Input should be a valid integer, unable to parse string as an "
                               "integer", value)]
    return None, [_err("int_type", loc, "Input should be a valid integer", value)]


def as_float(value: Any, loc) -> Tuple[Any, List[Error]]:
    if isinstance(value, bool):
        return float(value), []
    if isinstance(value, (int, float)):
        return float(value), []
    if isinstance(value, str):
        try:
            return float(value.strip()), []
        except ValueError:
            return None, [_err("float_parsing", loc, "Input should be a valid number, unable to parse string as a "
                               "number", value)]
    return None, [_err("float_type", loc, "Input should be a valid number", value)]


_TRUE = {"1", "on", "t", "true", "y", "yes"}
_FALSE = {"0", "off", "f", "false", "n", "no"}


def as_bool(value: Any, loc) -> Tuple[Any, List[Error]]:
    if isinstance(value, bool):
        return value, []
    if isinstance(value, int) and value in (0, 1):
        return bool(value), []
    if isinstance(value, str) and value.lower() in _TRUE | _FALSE:
        return value.lower() in _TRUE, []
    if isinstance(value, (str, int, float)):
        return None, [_err("bool_parsing", loc, "Input should be a valid boolean, unable to interpret input", value)]
    return None, [_err("bool_type", loc, "Input should be a valid boolean", value)]


def as_dict(value: Any, loc) -> Tuple[Any, List[Error]]:
    if isinstance(value, dict):
        return value, []
    return None, [_err("dict_type", loc, "Input should be a valid dictionary", value)]


def as_any(value: Any, loc) -> Tuple[Any, List[Error]]:
    return value, []


def optional(inner: Callable) -> Callable:
    def check(value: Any, loc):
        if value is None:
            return None, []
        return inner(value, loc)
    return check


def list_of(inner: Callable) -> Callable:
    def check(value: Any, loc):
        if not isinstance(value, list):
            return None, [_err("list_type", loc, "Input should be a valid list", value)]
        out, errors = [], []
        for i, item in enumerate(value):
            converted, errs = inner(item, loc + (i,))
            out.append(converted)
            errors += errs
        return out, errors
    return check


def ge(inner: Callable, bound: int) -> Callable:
    def check(value: Any, loc):
        converted, errors = inner(value, loc)
        if not errors and converted is not None and converted < bound:
            return None, [_err("greater_than_equal", loc, f"Input should be greater than or equal to {bound}",
                               value, {"ge": bound})]
        return converted, errors
    return check


def str_or_str_list(value: Any, loc) -> Tuple[Any, List[Error]]:
    if value is None:
        return [], []
    if isinstance(value, str):
        return value, []
    if isinstance(value, list) and all(isinstance(v, str) for v in value):
        return value, []
    return None, [_err("string_type", loc, "Input should be a valid string", value)]


def prompt(value: Any, loc) -> Tuple[Any, List[Error]]:
    """Union[List[int], List[List[int]], str, List[str]]."""
    if isinstance(value, str):
        return value, []
    if isinstance(value, list) and value:
        if all(isinstance(v, int) and not isinstance(v, bool) for v in value):
            return value, []
        if all(isinstance(v, str) for v in value):
            return value, []
        if all(isinstance(v, list) and all(isinstance(t, int) for t in v) for v in value):
            return value, []
    if isinstance(value, list) and not value:
        return value, []
    return None, [_err("string_type", loc, "Input should be a valid string", value)]


def stream_options(value: Any, loc) -> Tuple[Any, List[Error]]:
    if value is None:
        return None, []
    if not isinstance(value, dict):
        return None, [_err("model_type", loc, "Input should be a valid dictionary or instance of StreamOptions",
                           value, {"class_name": "StreamOptions"})]
    out = {"include_usage": True, "continuous_usage_stats": True}
    errors: List[Error] = []
    for key, item in value.items():
        if key not in out:
            errors.append(_err("extra_forbidden", loc + (key,), "Extra inputs are not permitted", item))
            continue
        converted, errs = optional(as_bool)(item, loc + (key,))
        errors += errs
        out[key] = converted
    return out, errors


def messages(value: Any, loc) -> Tuple[Any, List[Error]]:
    """List of chat messages: {role, content: str | [{"type": "text", "text": ...}], name?}."""
    if not isinstance(value, list):
        return None, [_err("list_type", loc, "Input should be a valid list", value)]
    errors: List[Error] = []
    for i, item in enumerate(value):
        if not isinstance(item, dict):
            errors.append(_err("dict_type", loc + (i,), "Input should be a valid dictionary", item))
            continue
        if "role" not in item:
            errors.append(_err("missing", loc + (i, "role"), "Field required", item))
        elif not isinstance(item["role"], str):
            errors.append(_err("string_type", loc + (i, "role"), "Input should be a valid string", item["role"]))
    return value, errors


Field = Tuple[Callable, Any]


def validate(body: Any, fields: Dict[str, Field], required: List[str],
             before: List[Callable[[Dict[str, Any]], None]]) -> Dict[str, Any]:
    """Check `body` against `fields`; raises ValidationFailed with pydantic's error list."""
    if not isinstance(body, dict):
        raise ValidationFailed([{"type": "model_attributes_type", "loc": ("body",),
                                 "msg": "Input should be a valid dictionary or object to extract fields from",
                                 "input": body}])
    for validator in before:
        try:
            validator(body)
        except ValueError as exc:
            raise ValidationFailed([{"type": "value_error", "loc": ("body",), "msg": f"Value error, {exc}",
                                     "input": body, "ctx": {"error": exc}}]) from None
    errors: List[Error] = []
    out: Dict[str, Any] = {}
    for name, (check, default) in fields.items():
        if name in body:
            converted, errs = check(body[name], (name,))
            errors += errs
            out[name] = converted
        elif name in required:
            errors.append({"type": "missing", "loc": ("body", name), "msg": "Field required", "input": body})
        else:
            out[name] = default() if callable(default) else default
    for name in body:
        if name not in fields:
            errors.append({"type": "extra_forbidden", "loc": ("body", name), "msg": "Extra inputs are not permitted",
                           "input": body[name]})
    if errors:
        raise ValidationFailed(errors)
    return out


def parse_json_body(raw: bytes, content_type: str) -> Any:
    """FastAPI's body handling: JSON unless another content type is declared."""
    if not raw:
        raise ValidationFailed([{"type": "missing", "loc": ("body",), "msg": "Field required", "input": None}])
    if content_type and "json" not in content_type.split(";")[0].lower():
        return raw.decode("utf-8", "replace")
    try:
        return json.loads(raw)
    except json.JSONDecodeError as exc:
        raise ValidationFailed([{"type": "json_invalid", "loc": ("body", exc.pos), "msg": "JSON decode error",
                                 "input": {}, "ctx": {"error": exc.msg}}]) from None
    except UnicodeDecodeError:
        raise ValidationFailed([{"type": "json_invalid", "loc": ("body", 0), "msg": "JSON decode error",
                                 "input": {}, "ctx": {"error": "Invalid UTF-8"}}]) from None


# --- the request models of v0.5.4 protocol.py --------------------------------------------------------
def _chat_stream_options(data: Dict[str, Any]) -> None:
    if data.get("stream_options") is not None and not data.get("stream"):
        raise ValueError("stream_options can only be set if stream is true")


def _completion_stream_options(data: Dict[str, Any]) -> None:
    if data.get("stream_options") and not data.get("stream"):
        raise ValueError("Stream options can only be defined when stream is true.")


def _guided_count(data: Dict[str, Any]) -> None:
    count = sum(1 for key in ("guided_json", "guided_regex", "guided_choice") if data.get(key) is not None)
    if count > 1:
        raise ValueError("You can only use one kind of guided decoding ('guided_json', 'guided_regex' or "
                         "'guided_choice').")


def _chat_tool_choice(data: Dict[str, Any]) -> None:
    if "tool_choice" in data and data["tool_choice"] != "none":
        if not isinstance(data["tool_choice"], dict):
            raise ValueError("Currently only named tools are supported.")
        if "tools" not in data or data["tools"] is None:
            raise ValueError("When using `tool_choice`, `tools` must be set.")


def _chat_logprobs(data: Dict[str, Any]) -> None:
    if "top_logprobs" in data and data["top_logprobs"] is not None:
        if "logprobs" not in data or data["logprobs"] is False:
            raise ValueError("when using `top_logprobs`, `logprobs` must be set to true.")
        if isinstance(data["top_logprobs"], (int, float)) and data["top_logprobs"] < 0:
            raise ValueError("`top_logprobs` must be a value a positive value.")


def _completion_logprobs(data: Dict[str, Any]) -> None:
    if "logprobs" in data and isinstance(data["logprobs"], (int, float)) and data["logprobs"] < 0:
        raise ValueError("if passed, `logprobs` must be a positive value.")


_GUIDED = {"guided_json": (as_any, None), "guided_regex": (optional(as_str), None),
           "guided_choice": (optional(list_of(as_str)), None), "guided_grammar": (optional(as_str), None),
           "guided_decoding_backend": (optional(as_str), None), "guided_whitespace_pattern": (optional(as_str), None)}
_SAMPLING = {
    "use_beam_search": (as_bool, False), "top_k": (as_int, -1), "min_p": (as_float, 0.0),
    "repetition_penalty": (as_float, 1.0), "length_penalty": (as_float, 1.0), "early_stopping": (as_bool, False),
    "stop_token_ids": (optional(list_of(as_int)), list), "include_stop_str_in_output": (as_bool, False),
    "ignore_eos": (as_bool, False), "min_tokens": (as_int, 0), "skip_special_tokens": (as_bool, True),
    "spaces_between_special_tokens": (as_bool, True), "truncate_prompt_tokens": (optional(ge(as_int, 1)), None),
}
CHAT_FIELDS: Dict[str, Field] = {
    "messages": (messages, None), "model": (as_str, None), "frequency_penalty": (optional(as_float), 0.0),
    "logit_bias": (optional(as_dict), None), "logprobs": (optional(as_bool), False),
    "top_logprobs": (optional(as_int), 0), "max_tokens": (optional(as_int), None), "n": (optional(as_int), 1),
    "presence_penalty": (optional(as_float), 0.0), "response_format": (optional(as_dict), None),
    "seed": (optional(as_int), None), "stop": (str_or_str_list, list), "stream": (optional(as_bool), False),
    "stream_options": (stream_options, None), "temperature": (optional(as_float), 0.7),
    "top_p": (optional(as_float), 1.0), "tools": (optional(list_of(as_dict)), None), "tool_choice": (as_any, "none"),
    "user": (optional(as_str), None), "best_of": (optional(as_int), None), **_SAMPLING,
    "echo": (as_bool, False), "add_generation_prompt": (as_bool, True), "add_special_tokens": (as_bool, False),
    "documents": (optional(list_of(as_dict)), None), "chat_template": (optional(as_str), None),
    "chat_template_kwargs": (optional(as_dict), None), **_GUIDED,
}
COMPLETION_FIELDS: Dict[str, Field] = {
    "model": (as_str, None), "prompt": (prompt, None), "best_of": (optional(as_int), None),
    "echo": (optional(as_bool), False), "frequency_penalty": (optional(as_float), 0.0),
    "logit_bias": (optional(as_dict), None), "logprobs": (optional(as_int), None),
    "max_tokens": (optional(as_int), 16), "n": (as_int, 1), "presence_penalty": (optional(as_float), 0.0),
    "seed": (optional(as_int), None), "stop": (str_or_str_list, list), "stream": (optional(as_bool), False),
    "stream_options": (stream_options, None), "suffix": (optional(as_str), None),
    "temperature": (optional(as_float), 1.0), "top_p": (optional(as_float), 1.0), "user": (optional(as_str), None),
    **_SAMPLING, "allowed_token_ids": (optional(list_of(as_int)), None), "add_special_tokens": (as_bool, True),
    "response_format": (optional(as_dict), None), **_GUIDED,
}
TOKENIZE_COMPLETION_FIELDS: Dict[str, Field] = {"model": (as_str, None), "prompt": (as_str, None),
                                                "add_special_tokens": (as_bool, True)}
TOKENIZE_CHAT_FIELDS: Dict[str, Field] = {"model": (as_str, None), "messages": (messages, None),
                                          "add_generation_prompt": (as_bool, True),
                                          "add_special_tokens": (as_bool, False)}
DETOKENIZE_FIELDS: Dict[str, Field] = {"model": (as_str, None), "tokens": (list_of(as_int), None)}

# pydantic runs mode="before" model validators last-defined first.
CHAT_BEFORE = [_chat_logprobs, _chat_tool_choice, _guided_count, _chat_stream_options]
COMPLETION_BEFORE = [_completion_stream_options, _completion_logprobs, _guided_count]


def chat_request(body: Any) -> Dict[str, Any]:
    return validate(body, CHAT_FIELDS, ["messages", "model"], CHAT_BEFORE)


def completion_request(body: Any) -> Dict[str, Any]:
    return validate(body, COMPLETION_FIELDS, ["model", "prompt"], COMPLETION_BEFORE)
