"""The metric catalogue: every series the code exports (the instruments under services/*/src, libs/*/src and
worker/src, with their labels), the runtime and scrape series that come without an instrument of ours, and a
small PromQL reader that names the series and labels a query uses. One rule, used by every consumer of PromQL
under deploy/k8s: the Prometheus adapter's rules (``autoscaling``), the Grafana dashboards and the alerting rules
(``monitoring``). A query that reads a series no code exports, or a label its instrument does not have, fails
``make k8s-check`` instead of drawing an empty panel or never firing."""

from __future__ import annotations

import ast
import re
from dataclasses import dataclass, field
from functools import cache
from pathlib import Path

from .contract import METRIC_SOURCES, REPO, RUNTIME_SERIES, SCRAPE_SERIES, TARGET_LABELS

#: The constructors of an instrument: horde_core.metrics' (spec names with ``.``, spec attributes as labels) and
#: prometheus_client's classes.
_SPEC_KINDS = {"counter", "gauge", "histogram"}
_RAW_KINDS = {"Counter", "Gauge", "Histogram", "Summary"}


def series_names(kind: str, name: str) -> list[str]:
    """The series names prometheus_client exposes for an instrument."""
    kind = kind.lower()
    if kind == "counter":
        return [name.removesuffix("_total") + "_total"]
    if kind == "histogram":
        return [name + "_bucket", name + "_sum", name + "_count"]
    if kind == "summary":
        return [name, name + "_sum", name + "_count"]
    return [name]


@dataclass(frozen=True)
class Instrument:
    """One instrument definition found in the code."""

    kind: str
    name: str
    #: Label names; None when the code does not spell them as a literal list (then they are not checked).
    labels: tuple[str, ...] | None


def _literal_strings(node: ast.expr | None) -> tuple[str, ...] | None:
    if node is None:
        return ()
    if isinstance(node, ast.List | ast.Tuple) and all(
        isinstance(e, ast.Constant) and isinstance(e.value, str) for e in node.elts
    ):
        return tuple(str(e.value) for e in node.elts if isinstance(e, ast.Constant))
    return None


def _label_name(spec_attribute: str) -> str:
    """horde_core.metrics.label_name: ``horde.reason`` -> ``reason``."""
    return spec_attribute.removeprefix("horde.").replace(".", "_")


def instruments(source: str) -> list[Instrument]:
    """The instruments a Python module defines: ``counter("horde.x.y", doc, [attrs])`` (horde_core.metrics) or
    ``Counter("horde_x_y", doc, [labels])`` (prometheus_client)."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if not isinstance(node, ast.Call) or not node.args:
            continue
        func = node.func
        kind = func.id if isinstance(func, ast.Name) else func.attr if isinstance(func, ast.Attribute) else ""
        first = node.args[0]
        if kind not in _SPEC_KINDS | _RAW_KINDS or not isinstance(first, ast.Constant):
            continue
        if not isinstance(first.value, str):
            continue
        keyword = "attributes" if kind in _SPEC_KINDS else "labelnames"
        labels_node = node.args[2] if len(node.args) > 2 else None
        labels_node = next((k.value for k in node.keywords if k.arg == keyword), labels_node)
        labels = _literal_strings(labels_node)
        if kind in _SPEC_KINDS:
            name = first.value.replace(".", "_")
            labels = tuple(_label_name(a) for a in labels) if labels is not None else None
        else:
            name = first.value
        found.append(Instrument(kind.lower(), name, labels))
    return found


@dataclass
class Catalogue:
    """Series name -> the services exporting it (``services/<dir>``, ``worker``; ``*`` for a lib's, which every
    service has) and -> its label names (None: not known from the code)."""

    owners: dict[str, set[str]] = field(default_factory=dict)
    labels: dict[str, set[str] | None] = field(default_factory=dict)

    def add(self, series: str, owner: str, labels: set[str] | None) -> None:
        self.owners.setdefault(series, set()).add(owner)
        known = self.labels.get(series, set())
        # Defined twice (a lib and a service): the union; unknown once, unknown.
        self.labels[series] = None if known is None or labels is None else known | labels


def _owner(parts: tuple[str, ...]) -> str:
    if parts[0] == "services":
        return parts[1]
    return "worker" if parts[0] == "worker" else "*"


@cache
def code_catalogue(repo: Path = REPO) -> Catalogue:
    """Every series the code's instruments export, with owners and labels."""
    found = Catalogue()
    for pattern in METRIC_SOURCES:
        for path in sorted(repo.glob(pattern)):
            owner = _owner(path.relative_to(repo).parts)
            for inst in instruments(path.read_text()):
                for series in series_names(inst.kind, inst.name):
                    labels = set(inst.labels) if inst.labels is not None else None
                    if labels is not None and series.endswith("_bucket") and inst.kind == "histogram":
                        labels.add("le")
                    found.add(series, owner, labels)
    return found


def exported_metrics(repo: Path = REPO) -> dict[str, set[str]]:
    """Series name -> the services exporting it (``services/<dir>``; ``worker``; ``*`` for a lib's)."""
    return code_catalogue(repo).owners


@cache
def known_series(repo: Path = REPO) -> dict[str, set[str] | None]:
    """Every series a query may read -> its labels: the code's instruments, the runtime series of
    prometheus_client's default registry (which every service serves) and the scrape's own series."""
    known: dict[str, set[str] | None] = dict(code_catalogue(repo).labels)
    for name, labels in {**RUNTIME_SERIES, **SCRAPE_SERIES}.items():
        known.setdefault(name, set(labels))
    return known


def not_exported(series: str) -> str:
    """The problem of a query reading ``series``, which nothing exports."""
    return f"{series} is exported by no code ({', '.join(METRIC_SOURCES)})"


# --- reading PromQL -------------------------------------------------------------------------------------

_TOKEN = re.compile(
    r"""\s*(?:
      (?P<string>"(?:[^"\\]|\\.)*"|'(?:[^'\\]|\\.)*'|`[^`]*`)
    | (?P<duration>\d+(?:ms|s|m|h|d|w|y)(?:\d+(?:ms|s|m|h|d|w|y))*)
    | (?P<number>0x[0-9a-fA-F]+|(?:\d+\.?\d*|\.\d+)(?:[eE][+-]?\d+)?)
    | (?P<ident>[a-zA-Z_:][a-zA-Z0-9_:]*)
    | (?P<op>=~|!~|!=|==|<=|>=|[-+*/%^<>=(){}\[\],@:])
    )""",
    re.VERBOSE,
)
#: Words that are not series names where an identifier stands.
_KEYWORDS = {"and", "or", "unless", "bool", "offset", "inf", "nan", "atan2", "start", "end"}
_GROUPING = {"by", "without", "on", "ignoring", "group_left", "group_right"}
_AGGREGATIONS = {
    "sum",
    "min",
    "max",
    "avg",
    "group",
    "stddev",
    "stdvar",
    "count",
    "count_values",
    "bottomk",
    "topk",
    "quantile",
    "limitk",
    "limit_ratio",
}
#: Functions whose argument at this index (a string) names a label they create.
_CREATES_LABEL = {"label_replace": 1, "label_join": 1}
#: Grafana's variables, as concrete values (so the query is plain PromQL that promtool can parse too).
GRAFANA_DURATIONS = {"__rate_interval": "5m", "__interval": "1m", "__range": "1h"}
_GRAFANA_VARIABLE = re.compile(r"\$\{(\w+)(?::\w+)?\}|\$(\w+)|\[\[(\w+)\]\]")


def substitute_grafana_variables(expr: str) -> str:
    """A Grafana query as plain PromQL: ``$__rate_interval`` and its kind become durations, other variables a
    word (they stand in label values: ``namespace=~"$namespace"``)."""

    def value(m: re.Match[str]) -> str:
        name = m.group(1) or m.group(2) or m.group(3)
        return GRAFANA_DURATIONS.get(name, name)

    return _GRAFANA_VARIABLE.sub(value, expr)


@dataclass
class QueryNames:
    """The names a PromQL expression uses."""

    series: set[str] = field(default_factory=set)
    #: (series or None for a bare ``{...}`` selector, label) of each label matcher.
    matchers: list[tuple[str | None, str]] = field(default_factory=list)
    #: Labels named in ``by``/``without``/``on``/``ignoring``/``group_*`` clauses.
    grouping: set[str] = field(default_factory=set)
    #: Labels the expression creates (label_replace, label_join).
    created: set[str] = field(default_factory=set)
    problems: list[str] = field(default_factory=list)


def _tokens(expr: str) -> list[tuple[str, str]]:
    out: list[tuple[str, str]] = []
    pos = 0
    text = expr.rstrip()
    while pos < len(text):
        if text.startswith("#", pos):  # a comment to the end of the line
            end = text.find("\n", pos)
            pos = len(text) if end < 0 else end
            continue
        m = _TOKEN.match(text, pos)
        if m is None or m.end() == pos:
            raise ValueError(f"cannot read PromQL at {text[pos:].lstrip()[:20]!r}")
        kind = m.lastgroup or ""
        out.append((kind, m.group(kind)))
        pos = m.end()
    return out


def _label_list(tokens: list[tuple[str, str]], i: int) -> tuple[list[str], int]:
    """The labels of ``( a, b )`` starting at tokens[i] == "(", and the index after ``)``."""
    labels = []
    i += 1
    while i < len(tokens) and tokens[i][1] != ")":
        if tokens[i][0] == "ident":
            labels.append(tokens[i][1])
        i += 1
    return labels, i + 1


def _matchers(tokens: list[tuple[str, str]], i: int, series: str | None, out: QueryNames) -> int:
    """Read ``{ label op "value", ... }`` starting at tokens[i] == "{"; the index after ``}``."""
    i += 1
    while i < len(tokens) and tokens[i][1] != "}":
        kind, value = tokens[i]
        if kind == "ident" and i + 1 < len(tokens) and tokens[i + 1][1] in {"=", "!=", "=~", "!~"}:
            if value == "__name__" and tokens[i + 1][1] == "=" and i + 2 < len(tokens):
                out.series.add(tokens[i + 2][1][1:-1])
            else:
                out.matchers.append((series, value))
            i += 3
            continue
        if kind == "string":  # a quoted series name, Prometheus 3's {"name", ...}
            out.series.add(value[1:-1])
        i += 1
    return i + 1


def _call_frames(frames: list[tuple[str, int]], kind: str, value: str, out: QueryNames) -> None:
    """Follow parentheses and arguments, to find the labels label_replace and label_join create."""
    if value == "(":
        frames.append(("", 0))
    elif value == ")" and frames:
        frames.pop()
    elif value == "," and frames:
        func, argi = frames[-1]
        frames[-1] = (func, argi + 1)
    elif kind == "string" and frames:
        func, argi = frames[-1]
        if _CREATES_LABEL.get(func) == argi:
            out.created.add(value[1:-1])


def query_names(expr: str) -> QueryNames:
    """The series, matched labels and grouping labels a PromQL expression names (Grafana variables allowed)."""
    out = QueryNames()
    try:
        tokens = _tokens(substitute_grafana_variables(expr))
    except ValueError as exc:
        out.problems.append(str(exc))
        return out
    #: One frame per open parenthesis: the function it calls (or "") and the argument index reached.
    frames: list[tuple[str, int]] = []
    i = 0
    while i < len(tokens):
        kind, value = tokens[i]
        following = tokens[i + 1][1] if i + 1 < len(tokens) else ""
        if kind == "ident" and value in _GROUPING and following == "(":
            labels, i = _label_list(tokens, i + 1)
            out.grouping.update(labels)
            continue
        if kind == "ident" and value in _AGGREGATIONS and following in {"by", "without"}:
            i += 1  # its grouping clause comes first: ``sum by (le) (...)``
            continue
        if kind == "ident" and following == "(":
            frames.append((value, 0))
            i += 2
            continue
        if kind == "ident" and value not in _KEYWORDS:
            out.series.add(value)
            if following == "{":
                i = _matchers(tokens, i + 1, value, out)
                continue
        elif value == "{":
            i = _matchers(tokens, i, None, out)
            continue
        elif value == "[":  # a range or a subquery: durations only
            while i < len(tokens) and tokens[i][1] != "]":
                i += 1
        else:
            _call_frames(frames, kind, value, out)
        i += 1
    return out


def check_query(expr: str, known: dict[str, set[str] | None] | None = None) -> list[str]:
    """What is wrong with the names a query uses: series no code exports, labels their instruments lack."""
    known = known if known is not None else known_series()
    names = query_names(expr)
    problems = list(names.problems)
    unknown = sorted(s for s in names.series if s not in known)
    problems += [not_exported(s) for s in unknown]
    every: set[str] = set(TARGET_LABELS) | names.created | {"__name__"}
    label_sets = [known.get(s) for s in names.series if s in known]
    if any(labels is None for labels in label_sets):
        return problems  # a series whose labels the code does not spell out: no label check
    for labels in label_sets:
        every |= labels or set()
    for series, label in names.matchers:
        if series is not None and series not in known:
            continue  # already reported
        allowed = (
            every if series is None else (known.get(series) or set()) | set(TARGET_LABELS) | {"__name__"}
        )
        if label not in allowed:
            problems.append(f"{series or 'a selector'} has no label {label!r}")
    for label in sorted(names.grouping - every):
        problems.append(f"grouping by {label!r}, a label none of {sorted(names.series)} has")
    return problems
