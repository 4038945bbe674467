"""Bounded validation of a reply against a request's strict JSON schema.

See docs/native-api.md#reply-verification: a strict json_schema is validated with jsonschema, by the draft its
``$schema`` declares and Draft 2020-12 otherwise; references resolve only inside the schema; a schema the library
cannot compile, or whose references do not resolve, refuses the reply. The requester writes the schema and the
worker writes the reply, so neither may make the check run long or grow large:

* ``pattern`` and ``patternProperties`` (and the pattern test of ``additionalProperties``) match with RE2, in time
  linear in the text. A pattern RE2 does not take (a backreference, a lookaround, ``\\Z``, a repetition above
  1000, a program over :data:`RE2_MAX_MEM`) makes the schema uncompilable, whatever the reply. So does
  ``unevaluatedProperties`` in a schema that also has ``patternProperties``, since jsonschema matches those
  patterns with Python's backtracking ``re`` there.
* References resolve in an empty registry: inside the schema only; never a metaschema, a file or a URL.
* A subschema below the root that names a known dialect in ``$schema`` makes the schema uncompilable: jsonschema
  would switch to its own validator class there, outside these bounds.
* Checking the schema against its metaschema, and validating the reply, each run under a :class:`SchemaLimits`
  budget: one step per subschema descent, keyword and pattern test, at most ``max_ref_expansions`` reference
  expansions (the reply's check only), and at most ``cpu_seconds`` of the calling thread's CPU time. Past any of them the check ends with
  :class:`SchemaBoundExceeded`, which the Horde answers as a nonconformant reply; so does a reply nested deeper
  than Python's recursion limit allows.
* Error messages are cut to :data:`MAX_SCHEMA_ERROR_MESSAGE_CHARS` as they are made, so a large reply is never
  copied into each of many errors.

Pure and synchronous: the submit service runs it in a small thread pool, off its event loop.
"""

from __future__ import annotations

import functools
import json
import threading
import time
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any, Final

import re2
import referencing
import referencing.exceptions
import referencing.jsonschema
from jsonschema import Draft202012Validator, validators
from jsonschema.exceptions import ValidationError, best_match
from jsonschema_specifications import REGISTRY as _SPECIFICATIONS

from .schema_rules import iter_subschemas

#: Steps (subschema descents, keywords, pattern tests) one check may take: the bound that usually ends a long
#: check, the same on every machine. The densest legal reply, 256 KiB (the most a job of 16,384 tokens may
#: submit) of one-digit integers in an array, takes 262,000 steps and about 0.6 s of CPU; 5,200 objects of three
#: properties (285 KB) take 94,000 steps; checking a 62 KB schema against its metaschema takes 51,000.
MAX_SCHEMA_VALIDATION_STEPS: Final = 500_000
#: ``$ref``, ``$dynamicRef`` and ``$recursiveRef`` expansions one check may take (a tree-shaped reply expands one
#: reference per node).
MAX_SCHEMA_REF_EXPANSIONS: Final = 50_000
#: CPU seconds of the validating thread one check may take: the safety net for steps that each cost much (an
#: error that quotes a large reply, a long enum), above what MAX_SCHEMA_VALIDATION_STEPS ordinary steps take.
MAX_SCHEMA_VALIDATION_CPU_SECONDS: Final = 2.0
#: RE2's memory budget for one compiled pattern (its default is 8 MiB).
RE2_MAX_MEM: Final = 1 << 20
#: An error message longer than this is cut to its head and tail as it is made.
MAX_SCHEMA_ERROR_MESSAGE_CHARS: Final = 600

_REF_KEYWORDS = frozenset({"$ref", "$dynamicRef", "$recursiveRef"})
_CACHE_SIZE = 16


@dataclass(frozen=True, slots=True)
class SchemaLimits:
    """The budget of one check (the schema against its metaschema, or a reply against the schema)."""

    max_steps: int = MAX_SCHEMA_VALIDATION_STEPS
    max_ref_expansions: int = MAX_SCHEMA_REF_EXPANSIONS
    cpu_seconds: float = MAX_SCHEMA_VALIDATION_CPU_SECONDS


DEFAULT_SCHEMA_LIMITS: Final = SchemaLimits()


class SchemaUncompilable(Exception):
    """The schema cannot be compiled: not a schema, not valid against its metaschema, a pattern RE2 does not
    take, a nested dialect, or a reference that does not resolve inside it."""


class SchemaBoundExceeded(Exception):
    """Checking took more steps, reference expansions or CPU time than :class:`SchemaLimits` allows, or nested
    deeper than the recursion limit; ``str()`` says which."""


# -- the budget ----------------------------------------------------------------------------------------------


class _Exceeded(Exception):
    pass


class _Budget:
    __slots__ = ("deadline", "max_refs", "max_steps", "refs", "steps")

    def __init__(self, limits: SchemaLimits) -> None:
        self.steps = 0
        self.refs = 0
        self.max_steps = limits.max_steps
        self.max_refs = limits.max_ref_expansions
        self.deadline = time.thread_time() + limits.cpu_seconds

    def step(self) -> None:
        self.steps += 1
        if self.steps > self.max_steps:
            raise _Exceeded(f"more than {self.max_steps} validation steps")
        # thread_time() costs about a microsecond, a step a few: read it on every eighth step.
        if not self.steps & 7 and time.thread_time() > self.deadline:
            raise _Exceeded("its CPU time bound")

    def ref(self) -> None:
        self.refs += 1
        if self.refs > self.max_refs:
            raise _Exceeded(f"more than {self.max_refs} reference expansions")


# The budget of a guarded validator used outside :func:`_bounded` (this module's entry points never do).
_UNLIMITED: Final = _Budget(SchemaLimits(max_steps=1 << 62, max_ref_expansions=1 << 62, cpu_seconds=1e12))

_local = threading.local()


def _budget() -> _Budget:
    budget: _Budget | None = getattr(_local, "budget", None)
    return budget if budget is not None else _UNLIMITED


def _bounded(limits: SchemaLimits, run: Callable[[], Any]) -> Any:
    """Run ``run()`` under a fresh budget of ``limits`` on this thread; map its end to SchemaBoundExceeded."""
    previous = getattr(_local, "budget", None)
    _local.budget = _Budget(limits)
    try:
        return run()
    except _Exceeded as exc:
        raise SchemaBoundExceeded(str(exc)) from None
    except RecursionError:
        raise SchemaBoundExceeded("the recursion limit (the reply or schema nests too deeply)") from None
    finally:
        _local.budget = previous


# -- RE2 ---------------------------------------------------------------------------------------------------

_RE2_OPTIONS = re2.Options()
_RE2_OPTIONS.max_mem = RE2_MAX_MEM
_RE2_OPTIONS.log_errors = False


def _utf8(text: str) -> bytes:
    return text.encode("utf-8", "surrogatepass")


def compile_pattern(pattern: Any) -> Any:
    """A JSON-schema ``pattern`` compiled with RE2 (UTF-8, unanchored search). Raises SchemaUncompilable for a
    pattern RE2 does not take. Compiled patterns are cached by the ``re2`` module (128 of them)."""
    if not isinstance(pattern, str):
        raise SchemaUncompilable(f"the pattern {pattern!r} is not a string")
    try:
        return re2.compile(_utf8(pattern), _RE2_OPTIONS)
    except re2.error:
        raise SchemaUncompilable(
            f"the pattern {_cut(repr(pattern), 200)} is not one RE2 takes (no backreferences or lookarounds)"
        ) from None


def _search(pattern: str, text: str) -> bool:
    _budget().step()
    return compile_pattern(pattern).search(_utf8(text)) is not None


# -- keywords ----------------------------------------------------------------------------------------------


def _cut(message: str, limit: int = MAX_SCHEMA_ERROR_MESSAGE_CHARS) -> str:
    if len(message) <= limit:
        return message
    tail = limit // 4
    return f"{message[: limit - tail - 5]} ... {message[-tail:]}"


def _pattern(validator: Any, patrn: Any, instance: Any, schema: Any) -> Iterator[ValidationError]:
    if validator.is_type(instance, "string") and not _search(patrn, instance):
        yield ValidationError(_cut(f"{_cut(repr(instance))} does not match {patrn!r}"))


def _pattern_properties(
    validator: Any, pattern_properties: Any, instance: Any, schema: Any
) -> Iterator[ValidationError]:
    if not validator.is_type(instance, "object"):
        return
    for pattern, subschema in pattern_properties.items():
        for key, value in instance.items():
            if _search(pattern, key):
                yield from validator.descend(value, subschema, path=key, schema_path=pattern)


def _additional(instance: Mapping[str, Any], schema: Mapping[str, Any]) -> Iterator[str]:
    properties = schema.get("properties", {})
    patterns = list(schema.get("patternProperties", {}))
    for key in instance:
        if key not in properties and not any(_search(pattern, key) for pattern in patterns):
            yield key


def _additional_properties(validator: Any, ap: Any, instance: Any, schema: Any) -> Iterator[ValidationError]:
    # jsonschema's additionalProperties, with the patterns matched by RE2 (one search per pattern, as the
    # alternation jsonschema builds from them would match).
    if not validator.is_type(instance, "object"):
        return
    extras = set(_additional(instance, schema))
    if validator.is_type(ap, "object"):
        for extra in extras:
            yield from validator.descend(instance[extra], ap, path=extra)
    elif not ap and extras:
        if "patternProperties" in schema:
            verb = "does" if len(extras) == 1 else "do"
            joined = ", ".join(repr(each) for each in sorted(extras))
            patterns = ", ".join(repr(each) for each in sorted(schema["patternProperties"]))
            yield ValidationError(_cut(f"{joined} {verb} not match any of the regexes: {patterns}"))
        else:
            unexpected = sorted(extras, key=str)
            verb = "was" if len(unexpected) == 1 else "were"
            listed = ", ".join(repr(each) for each in unexpected)
            yield ValidationError(_cut(f"Additional properties are not allowed ({listed} {verb} unexpected)"))


def _canonical(value: Any) -> Any:
    # A hashable key equal for two values exactly when jsonschema's ``equal`` holds: booleans apart from
    # numbers, 1 equal to 1.0, arrays by order, objects by key.
    if value is True or value is False:
        return ("b", value)
    if isinstance(value, str):
        return ("s", value)
    if isinstance(value, list):
        return ("a", tuple(_canonical(v) for v in value))
    if isinstance(value, dict):
        return ("o", frozenset((k, _canonical(v)) for k, v in value.items()))
    return ("n", value)


def _unique_items(validator: Any, ui: Any, instance: Any, schema: Any) -> Iterator[ValidationError]:
    # jsonschema falls back on comparing every pair of items when they do not sort (objects): quadratic.
    if not ui or not validator.is_type(instance, "array"):
        return
    seen: set[Any] = set()
    budget = _budget()
    for item in instance:
        budget.step()
        key = _canonical(item)
        if key in seen:
            yield ValidationError(_cut(f"{_cut(repr(instance))} has non-unique elements"))
            return
        seen.add(key)


_OVERRIDES: Final[Mapping[str, Callable[..., Iterator[ValidationError]]]] = {
    "pattern": _pattern,
    "patternProperties": _pattern_properties,
    "additionalProperties": _additional_properties,
    "uniqueItems": _unique_items,
}


def _guard_keyword(name: str, keyword: Callable[..., Any]) -> Callable[..., Iterator[ValidationError]]:
    is_ref = name in _REF_KEYWORDS

    def guarded(validator: Any, value: Any, instance: Any, schema: Any) -> Iterator[ValidationError]:
        budget = _budget()
        budget.step()
        if is_ref:
            budget.ref()
        errors = keyword(validator, value, instance, schema)
        if errors is None:
            return
        try:
            for error in errors:
                if len(error.message) > MAX_SCHEMA_ERROR_MESSAGE_CHARS:
                    error.message = _cut(error.message)
                yield error
        except referencing.exceptions.Unresolvable:
            if not is_ref:
                raise
            raise SchemaUncompilable(
                f"the reference {_cut(repr(value), 200)} does not resolve inside it"
            ) from None

    guarded.__name__ = getattr(keyword, "__name__", name)
    return guarded


def _false_schema(instance: Any) -> Iterator[ValidationError]:
    yield ValidationError(
        _cut(f"False schema does not allow {_cut(repr(instance))}"),
        validator=None,
        validator_value=None,
        instance=instance,
        schema=False,
    )


@functools.cache
def _guarded_class(base: Any) -> Any:
    """``base`` (a jsonschema draft class) with every keyword counted and cut, RE2 for patterns, a quadratic-free
    uniqueItems, and ``descend`` counted (a ``false`` subschema included, which reaches no keyword). Built with
    ``validators.extend``, whose class is this module's own: nothing global changes."""
    keywords = {name: _guard_keyword(name, _OVERRIDES.get(name, fn)) for name, fn in base.VALIDATORS.items()}
    cls = validators.extend(base, keywords)
    descend = cls.descend

    def counted_descend(
        self: Any,
        instance: Any,
        schema: Any,
        path: Any = None,
        schema_path: Any = None,
        resolver: Any = None,
    ) -> Iterator[ValidationError]:
        _budget().step()
        if schema is False:
            return _false_schema(instance)
        result: Iterator[ValidationError] = descend(self, instance, schema, path, schema_path, resolver)
        return result

    cls.descend = counted_descend
    return cls


def _specification(cls: Any) -> Any:
    return referencing.jsonschema.specification_with(
        cls.ID_OF(cls.META_SCHEMA) or "urn:unknown-dialect", default=referencing.Specification.OPAQUE
    )


def _empty_registry_validator(cls: Any, schema: Any, **kwargs: Any) -> Any:
    """An instance of ``cls`` whose references resolve inside ``schema`` only: an empty registry, without the
    metaschemas jsonschema otherwise adds, and nothing retrieved."""
    return cls(schema, _resolver=_crawled_resolver(_specification(cls).create_resource(schema)), **kwargs)


def _crawled_resolver(root: Any, registry: Any = None) -> Any:
    # Crawled once here: an uncrawled registry crawls again on each anchor lookup.
    uri = root.id() or ""
    crawled = (registry or referencing.Registry()).with_resource(uri, root).crawl()
    return crawled.resolver(base_uri=uri)


# -- the metaschema check ------------------------------------------------------------------------------------


def _without_dialect(value: Any) -> Any:
    if isinstance(value, dict):
        return {k: _without_dialect(v) for k, v in value.items() if k != "$schema"}
    if isinstance(value, list):
        return [_without_dialect(v) for v in value]
    return value


@functools.cache
def _metaschema_validator(base: Any) -> Any:
    """A guarded validator of ``base``'s metaschema. The bundled metaschemas are copied without ``$schema``, so
    their vocabularies (each naming the same dialect) stay in the guarded class instead of jsonschema's own."""
    meta_cls = validators.validator_for(base.META_SCHEMA, default=base)
    registry: referencing.Registry[Any] = referencing.Registry()
    for uri, resource in _SPECIFICATIONS.items():
        contents = resource.contents
        if not isinstance(contents, dict):
            continue
        specification = referencing.jsonschema.specification_with(
            str(contents.get("$schema", "")), default=referencing.Specification.OPAQUE
        )
        registry = registry.with_resource(uri, specification.create_resource(_without_dialect(contents)))
    root = _without_dialect(base.META_SCHEMA)
    guarded = _guarded_class(meta_cls)
    resolver = _crawled_resolver(_specification(meta_cls).create_resource(root), registry)
    return guarded(root, _resolver=resolver, format_checker=meta_cls.FORMAT_CHECKER)


# -- compile -------------------------------------------------------------------------------------------------


def _nodes(schema: Any) -> Iterator[tuple[bool, Any]]:
    """Every object in the schema document, ``(is_root, node)``, iteratively."""
    stack: list[tuple[bool, Any]] = [(True, schema)]
    while stack:
        root, node = stack.pop()
        if isinstance(node, dict):
            yield root, node
            stack.extend((False, v) for v in node.values() if isinstance(v, dict | list))
        elif isinstance(node, list):
            stack.extend((False, v) for v in node if isinstance(v, dict | list))


def _scan(schema: Any) -> None:
    """The document-wide refusals: a dialect named below the root, unevaluatedProperties beside
    patternProperties, and every pattern at a subschema position that RE2 does not take."""
    budget = _budget()
    unevaluated = pattern_properties = False
    for root, node in _nodes(schema):
        budget.step()
        dialect = node.get("$schema")
        if not root and isinstance(dialect, str) and validators.validator_for(node, default=None) is not None:
            raise SchemaUncompilable(f"a subschema below the root names the dialect {_cut(dialect, 200)!r}")
        unevaluated = unevaluated or "unevaluatedProperties" in node
        pattern_properties = pattern_properties or "patternProperties" in node
    if unevaluated and pattern_properties:
        raise SchemaUncompilable("it uses unevaluatedProperties beside patternProperties")
    if not isinstance(schema, dict):
        return
    stack: list[dict[str, Any]] = [schema]
    while stack:
        node = stack.pop()
        budget.step()
        if "pattern" in node:
            compile_pattern(node["pattern"])
        if isinstance(node.get("patternProperties"), dict):
            for pattern in node["patternProperties"]:
                compile_pattern(pattern)
        stack.extend(sub for _, sub in iter_subschemas(node))


@dataclass(frozen=True, slots=True)
class _Compiled:
    validator: Any = None
    uncompilable: str | None = None
    exceeded: str | None = None


@functools.lru_cache(maxsize=_CACHE_SIZE)
def _compile_cached(schema_json: str, limits: SchemaLimits) -> _Compiled:
    schema = json.loads(schema_json)
    # The metaschema expands a few references for every subschema it checks, a number linear in the schema's
    # size (the metaschema is trusted, the schema only data to it): steps and CPU time bound that check.
    compile_limits = SchemaLimits(
        max_steps=limits.max_steps,
        max_ref_expansions=max(limits.max_ref_expansions, limits.max_steps),
        cpu_seconds=limits.cpu_seconds,
    )
    try:
        return _Compiled(validator=_bounded(compile_limits, lambda: _compile(schema)))
    except SchemaUncompilable as exc:
        return _Compiled(uncompilable=str(exc) or "it is not a valid schema")
    except SchemaBoundExceeded as exc:
        return _Compiled(exceeded=str(exc))
    except Exception:
        return _Compiled(uncompilable="it does not compile")


def _compile(schema: Any) -> Any:
    if not isinstance(schema, dict | bool):
        raise SchemaUncompilable("it is not an object")
    base = validators.validator_for(schema, default=Draft202012Validator)
    _scan(schema)
    error = next(_metaschema_validator(base).iter_errors(schema), None)
    if error is not None:
        raise SchemaUncompilable(f"it is not a valid schema: {_cut(error.message, 300)}")
    return _empty_registry_validator(_guarded_class(base), schema)


def compile_reply_schema(schema: Any, limits: SchemaLimits = DEFAULT_SCHEMA_LIMITS) -> Any:
    """A bounded validator for a request's strict ``schema``: by the draft its ``$schema`` declares (2020-12
    otherwise), patterns in RE2, references inside the schema only, checked against its metaschema under
    ``limits``. Cached by the schema's canonical JSON (the last 16), outcome included.

    Raises SchemaUncompilable (the schema cannot be compiled) or SchemaBoundExceeded (checking the schema took
    more than ``limits``)."""
    try:
        schema_json = json.dumps(schema, sort_keys=True, separators=(",", ":"), allow_nan=False)
    except (TypeError, ValueError, RecursionError):
        raise SchemaUncompilable("it is not JSON") from None
    compiled = _compile_cached(schema_json, limits)
    if compiled.uncompilable is not None:
        raise SchemaUncompilable(compiled.uncompilable)
    if compiled.exceeded is not None:
        raise SchemaBoundExceeded(compiled.exceeded)
    return compiled.validator


def reply_schema_error(
    validator: Any, instance: Any, limits: SchemaLimits = DEFAULT_SCHEMA_LIMITS
) -> ValidationError | None:
    """The best error of ``instance`` (a parsed reply) under a :func:`compile_reply_schema` validator, or None
    when it matches. Raises SchemaBoundExceeded past ``limits``, SchemaUncompilable for a reference that does
    not resolve inside the schema (or any other failure of the schema while validating)."""

    def run() -> ValidationError | None:
        error: ValidationError | None = best_match(validator.iter_errors(instance))
        return error

    try:
        return _bounded(limits, run)
    except (SchemaBoundExceeded, SchemaUncompilable):
        raise
    except referencing.exceptions.Unresolvable:
        raise SchemaUncompilable("a reference does not resolve inside it") from None
    except Exception:
        raise SchemaUncompilable("it fails while validating") from None
