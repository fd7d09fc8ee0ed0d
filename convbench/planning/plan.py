"""Plans as versioned JSON, read strictly, and the plan store: the persisted tuning database.

A plan says, for each conv layer of a network, which layout it runs in and which algorithm runs
each pass, and carries the measurements it was chosen from (the tuning database) with the
conversion times the layout plan used. It is keyed by what makes a time valid — the device, its
driver, the CUDA, cuDNN, torch, CuPy and convbench versions — and, per measurement, by problem,
precision and pass.

Reading a plan validates every field (types, names from the registry and `problem`, the format
version) and turns it into typed objects; anything else is one `PlanError` line naming the file,
the field and what is wrong. JSON is all that is ever parsed: a plan cannot execute anything.

The store is a folder of plan files ($CONVBENCH_PLAN_DIR, else $XDG_CACHE_HOME/convbench/plans,
else ~/.cache/convbench/plans), written atomically. `PlanStore.lookup` hands back the
measurements of plans made in the current environment; a plan whose key differs in any version
is stale: it is reported, never trusted, and its layers are measured again.
"""

from __future__ import annotations

import dataclasses
import datetime
import hashlib
import json
import os
import re
import tempfile
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path

from ..algos.registry import ALGOS, BACKENDS
from ..core.problem import AXIS_FIELDS, FIELD_MAX, LAYOUTS, PASSES, PRECISIONS, ConvProblem
from ..core.results import ENTRY_NUMBERS, ENTRY_TEXTS, PROBLEM_FIELDS, STATUSES

PLAN_FORMAT = "convbench-plan"
#: Bumped whenever a field changes meaning; a plan of another version is refused, not guessed.
PLAN_VERSION = 1
#: What makes a measurement valid: a change in any of these makes a stored plan stale.
ENV_FIELDS = ("device", "driver", "cuda", "cudnn", "torch", "cupy", "convbench")
#: Algorithms that are torch's own convolution, and the `cudnn.benchmark` each runs with (None:
#: whatever is set). A pass planned for one of them is left to torch when the plan is applied.
TORCH_ALGOS = {"torch-cpu": None, "cudnn": False, "cudnn-autotune": True}
#: How a tie within noise is broken (`Constraints.tie_break`): the least workspace (declared,
#: else the measured peak), the lowest median, or the smallest error against float64.
TIE_BREAKS = ("workspace", "time", "error")


class PlanError(ValueError):
    """A plan file (or dict) that is not a valid plan of this version; one line says why."""


# --- the environment key --------------------------------------------------------------------
def env_key(env: dict) -> dict[str, str | None]:
    """The key fields of an env.json (`envinfo.collect`), as strings (None: absent)."""
    gpu = env.get("gpu") or {}
    torch = env.get("torch") or {}
    values = {"device": env.get("device"), "driver": gpu.get("driver"),
              "cuda": gpu.get("cuda_runtime"), "cudnn": torch.get("cudnn"),
              "torch": torch.get("version"), "cupy": env.get("cupy"),
              "convbench": env.get("convbench")}
    return {k: None if v is None else str(v) for k, v in values.items()}


def current_env_key(backend: str) -> dict[str, str | None]:
    """The key of this machine and these libraries, for measurements on `backend`."""
    from ..measure import envinfo

    return env_key(envinfo.collect(backend))


def stale_fields(stored: dict, current: dict) -> list[str]:
    """The key fields in which a stored plan's environment differs from the current one."""
    return [f for f in ENV_FIELDS if stored.get(f) != current.get(f)]


# --- the plan -------------------------------------------------------------------------------
@dataclass(frozen=True)
class Constraints:
    """What a choice must satisfy besides being correct and fast.

    `workspace_budget`: most bytes of workspace a pass may use: what it declares
    (`workspace_bytes`), else the peak it was seen to allocate beyond its operands
    (`peak_bytes`); a row with neither does not fit a budget. `deterministic`: only algorithms
    that give bitwise-equal results run to run (`advice.is_deterministic`). `max_error`: most
    relative error against the float64 reference, beyond the algorithm's own tolerance.
    `tie_break`: among candidates whose times are a tie within noise with the fastest, the one
    to prefer (`TIE_BREAKS`). `include_busy`: also consider times measured on a busy machine
    (contended CPU, throttled GPU), which are left out by default.
    """

    workspace_budget: int | None = None
    deterministic: bool = False
    max_error: float | None = None
    tie_break: str = "workspace"
    include_busy: bool = False

    def __post_init__(self) -> None:
        if self.tie_break not in TIE_BREAKS:
            raise ValueError(f"tie-break {self.tie_break!r}: valid: {', '.join(TIE_BREAKS)}")

    def describe(self) -> str:
        from ..measure.memory import format_size

        parts = [f"workspace <= {format_size(self.workspace_budget)}"
                 if self.workspace_budget is not None else "",
                 "deterministic" if self.deterministic else "",
                 f"error <= {self.max_error:g}" if self.max_error is not None else ""]
        return ", ".join(p for p in parts if p) or "none"


@dataclass(frozen=True)
class Choice:
    """The implementation a pass runs, with the time it was chosen for."""

    algo: str
    backend: str
    median_ms: float
    iqr_ms: float


@dataclass(frozen=True)
class LayerPlan:
    """One conv layer: its layout and, per pass, the choice (None: left to torch's default, as
    for a pass nothing was measured for, or a pass the layer does not need)."""

    layer: str
    problem: ConvProblem
    layout: str
    passes: dict[str, Choice | None]


@dataclass(frozen=True)
class Unplanned:
    """A conv layer the plan leaves as it is, and why."""

    layer: str
    reason: str


@dataclass(frozen=True)
class NetworkTotals:
    """The layout plan's totals (ms of a training step's conv passes and conversions), beside
    the per-layer best layouts and what they cost once their conversions are paid."""

    total_ms: float
    conversion_ms: float
    per_layer_best_layouts: list[str]
    per_layer_best_ms: float


@dataclass
class Plan:
    """What to run for each conv layer of a network, the key it is valid under (`env`, backend,
    precision), the constraints it was chosen under, and the measurements it was chosen from."""

    env: dict[str, str | None]
    backend: str
    precision: str
    constraints: Constraints
    cudnn: dict[str, bool]  # {"benchmark": ..., "deterministic": ...}: the global flags to set
    input_layout: str
    output_layout: str
    layers: list[LayerPlan]
    network: NetworkTotals | None  # None: conversions could not be measured
    unplanned: list[Unplanned] = field(default_factory=list)
    #: The tuning database: one entry per measurement (`results.entry_from_row`; "problem" is a
    #: ConvProblem in memory, its fields in the file).
    measurements: list[dict] = field(default_factory=list)
    #: NCHW<->NHWC conversion times: {"shape": NCHW dims, "from", "to", "median_ms", "iqr_ms"}.
    conversions: list[dict] = field(default_factory=list)
    created: str = field(default_factory=lambda: datetime.datetime.now().astimezone()
                         .isoformat(timespec="seconds"))

    # --- JSON -----------------------------------------------------------------------------
    def to_dict(self) -> dict:
        def plain(v):
            if isinstance(v, ConvProblem):
                return dataclasses.asdict(v)
            if dataclasses.is_dataclass(v):
                return {f.name: plain(getattr(v, f.name)) for f in dataclasses.fields(v)}
            if isinstance(v, dict):
                return {k: plain(x) for k, x in v.items()}
            if isinstance(v, (list, tuple)):
                return [plain(x) for x in v]
            return v

        return {"format": PLAN_FORMAT, "version": PLAN_VERSION, **plain(self)}

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), indent=1, allow_nan=False) + "\n"

    @classmethod
    def from_dict(cls, data, source: str = "plan") -> Plan:
        """Validate `data` field by field and build the plan; PlanError naming the first bad
        field otherwise."""
        try:
            header = _obj({"format": _text, "version": _any}, partial=True)(data, "")
            if header["format"] != PLAN_FORMAT:
                raise _Invalid("format", f"expected {PLAN_FORMAT!r}, got {header['format']!r}: "
                               "not a convbench plan")
            version = header["version"]
            if type(version) is not int or version != PLAN_VERSION:
                raise _Invalid("version", f"plan format version {version!r}; this "
                               f"convbench reads version {PLAN_VERSION} (tune again to replace "
                               "it)")
            plan = _PLAN(data, "")
        except _Invalid as exc:
            raise PlanError(f"invalid plan {source}: {exc.path or 'top level'}: {exc.what}") \
                from None
        _check_consistent(plan, source)
        return plan

    @classmethod
    def from_json(cls, text: str, source: str = "plan") -> Plan:
        try:
            data = json.loads(text, parse_constant=_no_constant, object_pairs_hook=_no_duplicates)
        except json.JSONDecodeError as exc:
            raise PlanError(f"invalid plan {source}: not valid JSON ({exc.msg} at line "
                            f"{exc.lineno} column {exc.colno})") from None
        except _Invalid as exc:
            raise PlanError(f"invalid plan {source}: {exc.what}") from None
        return cls.from_dict(data, source)

    @classmethod
    def load(cls, path: str | os.PathLike) -> Plan:
        path = Path(path)
        try:
            text = path.read_bytes().decode("utf-8")
        except UnicodeDecodeError:
            raise PlanError(f"invalid plan {path}: not UTF-8 text") from None
        return cls.from_json(text, str(path))

    def save(self, path: str | os.PathLike) -> Path:
        """Write the plan atomically (a reader never sees half a file), after checking that it
        reads back: a plan that would not load is never written."""
        path = Path(path)
        text = self.to_json()
        Plan.from_json(text, str(path))
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
        try:
            with os.fdopen(fd, "w") as f:
                f.write(text)
            os.replace(tmp, path)
        except BaseException:
            Path(tmp).unlink(missing_ok=True)
            raise
        return path


# --- the store ------------------------------------------------------------------------------
def default_dir() -> Path:
    """$CONVBENCH_PLAN_DIR, else $XDG_CACHE_HOME/convbench/plans, else ~/.cache/convbench/plans."""
    if os.environ.get("CONVBENCH_PLAN_DIR"):
        return Path(os.environ["CONVBENCH_PLAN_DIR"])
    base = os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache"
    return Path(base) / "convbench" / "plans"


@dataclass
class Stored:
    """What the store holds for one environment, backend and precision."""

    #: (problem, pass) -> the measurement entries of the newest plan that has any.
    measurements: dict[tuple[ConvProblem, str], list[dict]]
    #: (NCHW shape, from, to) -> the conversion entry of the newest plan that has it.
    conversions: dict[tuple[tuple[int, ...], str, str], dict]
    #: (file, the key fields that changed) of each stale plan: not used.
    stale: list[tuple[Path, list[str]]]


class PlanStore:
    """A folder of plan files, looked up before measuring."""

    def __init__(self, folder: str | os.PathLike | None = None):
        self.folder = Path(folder) if folder is not None else default_dir()

    def path_for(self, plan: Plan) -> Path:
        """Where `plan` is stored: one file per environment, backend, precision and set of
        problems, so tuning the same network again replaces its file."""
        problems = sorted({layer.problem.spec() for layer in plan.layers})
        digest = hashlib.sha256(json.dumps([plan.env, plan.backend, plan.precision, problems])
                                .encode()).hexdigest()[:16]
        device = re.sub(r"[^a-z0-9]+", "-", (plan.env.get("device") or "device").lower())
        return self.folder / f"{device.strip('-')[:40]}-{plan.precision}-{digest}.json"

    def save(self, plan: Plan) -> Path:
        return plan.save(self.path_for(plan))

    def plans(self) -> list[tuple[Path, Plan]]:
        """Every plan in the store, newest first; PlanError (naming the file) for one that is
        not a valid plan — delete it or tune again."""
        found = [(path, Plan.load(path)) for path in sorted(self.folder.glob("*.json"))]
        return sorted(found, key=lambda pp: (pp[1].created, pp[0].stat().st_mtime), reverse=True)

    def lookup(self, env: dict, backend: str, precision: str) -> Stored:
        out = Stored({}, {}, [])
        for path, plan in self.plans():
            changed = stale_fields(plan.env, env)
            if changed:
                out.stale.append((path, changed))
                continue
            if (plan.backend, plan.precision) != (backend, precision):
                continue
            found: dict[tuple[ConvProblem, str], list[dict]] = {}
            for entry in plan.measurements:
                found.setdefault((entry["problem"], entry["pass"]), []).append(entry)
            for key, entries in found.items():
                out.measurements.setdefault(key, entries)
            for c in plan.conversions:
                out.conversions.setdefault((tuple(c["shape"]), c["from"], c["to"]), c)
        return out


# --- validation: a small schema that parses as it checks ------------------------------------
class _Invalid(Exception):
    def __init__(self, path: str, what: str):
        super().__init__(what)
        self.path, self.what = path, what


Validator = Callable[[object, str], object]


def _no_constant(name: str):
    raise _Invalid("", f"{name} is not a number JSON allows")


def _no_duplicates(pairs: list[tuple[str, object]]) -> dict:
    out = {}
    for k, v in pairs:
        if k in out:
            raise _Invalid("", f"key {k!r} appears twice in one object")
        out[k] = v
    return out


def _describe(v) -> str:
    name = {dict: "an object", list: "a list", str: "a string", bool: "a boolean",
            type(None): "null"}.get(type(v), "a number")
    return f"{name} ({json.dumps(v)[:40]})" if not isinstance(v, (dict, list)) else name


def _join(path: str, key) -> str:
    return f"{path}[{key}]" if isinstance(key, int) else f"{path}.{key}" if path else key


def _any(v, path):
    return v


def _text(v, path):
    if not isinstance(v, str):
        raise _Invalid(path, f"expected a string, got {_describe(v)}")
    return v


def _flag(v, path):
    if not isinstance(v, bool):
        raise _Invalid(path, f"expected true or false, got {_describe(v)}")
    return v


def _integer(minimum: int = 0) -> Validator:
    def check(v, path):
        if isinstance(v, bool) or not isinstance(v, int):
            raise _Invalid(path, f"expected an integer, got {_describe(v)}")
        if v < minimum:
            raise _Invalid(path, f"expected an integer >= {minimum}, got {v}")
        return v

    return check


def _axis_value(minimum: int, sides: bool = False) -> Validator:
    """Stride, pad or dilation: one integer, or [height, width]; with `sides` (the padding),
    each of height and width may be [before, after] (after may be negative: rows no output
    reads), as a problem padded unequally is written."""
    whole = _integer(minimum)
    after = _integer(-FIELD_MAX)

    def side(x, path):
        if sides and isinstance(x, list):
            if len(x) != 2:
                raise _Invalid(path, f"expected an integer or [before, after], got "
                                     f"{_describe(x)}")
            return (whole(x[0], f"{path}[0]"), after(x[1], f"{path}[1]"))
        return whole(x, path)

    def check(v, path):
        if isinstance(v, list):
            if len(v) != 2:
                raise _Invalid(path, f"expected an integer or [height, width], got {_describe(v)}")
            return tuple(side(x, f"{path}[{i}]") for i, x in enumerate(v))
        return whole(v, path)

    return check


def _number(v, path):
    if isinstance(v, bool) or not isinstance(v, (int, float)):
        raise _Invalid(path, f"expected a number, got {_describe(v)}")
    if v < 0:
        raise _Invalid(path, f"expected a number >= 0, got {v}")
    return float(v)


def _one_of(valid: Iterable[str], kind: str) -> Validator:
    valid = tuple(valid)

    def check(v, path):
        if _text(v, path) not in valid:
            raise _Invalid(path, f"unknown {kind} {v!r}; valid: {', '.join(valid)}")
        return v

    return check


def _optional(inner: Validator) -> Validator:
    return lambda v, path: None if v is None else inner(v, path)


def _list(item: Validator, length: int | None = None) -> Validator:
    def check(v, path):
        if not isinstance(v, list):
            raise _Invalid(path, f"expected a list, got {_describe(v)}")
        if length is not None and len(v) != length:
            raise _Invalid(path, f"expected {length} items, got {len(v)}")
        return [item(x, _join(path, i)) for i, x in enumerate(v)]

    return check


def _obj(fields: dict[str, Validator], build: Callable = dict, partial: bool = False,
         optional: Iterable[str] = ()) -> Validator:
    """An object with exactly `fields` (with `partial`, at least them), each validated, built
    into `build(**values)`; `optional` ones (added after a format version) may be missing, and
    are then left to `build`'s default."""
    optional = set(optional)

    def check(v, path):
        if not isinstance(v, dict):
            raise _Invalid(path, f"expected an object, got {_describe(v)}")
        missing = [k for k in fields if k not in v and k not in optional]
        if missing:
            raise _Invalid(path, f"missing key {missing[0]!r}")
        unknown = [k for k in v if k not in fields]
        if unknown and not partial:
            raise _Invalid(path, f"unknown key {unknown[0]!r}; expected: {', '.join(fields)}")
        return build(**{k: fn(v[k], _join(path, k)) for k, fn in fields.items() if k in v})

    return check


def _problem_field(v, path):
    fields = _obj({f: _axis_value(AXIS_FIELDS[f], f == "pad") if f in AXIS_FIELDS else _integer(1)
                   for f in PROBLEM_FIELDS})(v, path)
    try:
        return ConvProblem(**fields)
    except ValueError as exc:
        raise _Invalid(path, str(exc)) from None


def _passes(choice: Validator) -> Validator:
    return _obj({p: _optional(choice) for p in PASSES})


_ALGO, _BACKEND = _one_of(ALGOS, "algo"), _one_of(BACKENDS, "backend")
_LAYOUT, _PASS = _one_of(LAYOUTS, "layout"), _one_of(PASSES, "pass")
_OPT_NUMBER = _optional(_number)
_MEASUREMENT = _obj({"problem": _problem_field, "pass": _PASS, "algo": _ALGO,
                     "backend": _BACKEND, "layout": _LAYOUT,
                     "status": _one_of(STATUSES, "status"), "reason": _text,
                     **{k: _OPT_NUMBER for k in ENTRY_NUMBERS},
                     "workspace_bytes": _optional(_integer()), "times_ms": _list(_number),
                     **{k: _text for k in ENTRY_TEXTS}, "contended": _flag},
                    optional=(*ENTRY_TEXTS, "contended"))
_CHOICE = _obj({"algo": _ALGO, "backend": _BACKEND, "median_ms": _number, "iqr_ms": _number},
               Choice)
_PLAN = _obj({
    "format": _text, "version": _any, "created": _text,
    "env": _obj({f: _optional(_text) for f in ENV_FIELDS}),
    "backend": _BACKEND,
    "precision": _one_of(PRECISIONS, "precision"),
    "constraints": _obj({"workspace_budget": _optional(_integer()), "deterministic": _flag,
                         "max_error": _OPT_NUMBER,
                         "tie_break": _one_of(TIE_BREAKS, "tie-break"), "include_busy": _flag},
                        Constraints, optional=("tie_break", "include_busy")),
    "cudnn": _obj({"benchmark": _flag, "deterministic": _flag}),
    "input_layout": _LAYOUT, "output_layout": _LAYOUT,
    "layers": _list(_obj({"layer": _text, "problem": _problem_field, "layout": _LAYOUT,
                          "passes": _passes(_CHOICE)}, LayerPlan)),
    "network": _optional(_obj({"total_ms": _number, "conversion_ms": _number,
                               "per_layer_best_layouts": _list(_LAYOUT),
                               "per_layer_best_ms": _number}, NetworkTotals)),
    "unplanned": _list(_obj({"layer": _text, "reason": _text}, Unplanned)),
    "measurements": _list(_MEASUREMENT),
    "conversions": _list(_obj({"shape": _list(_integer(1), 4), "from": _LAYOUT, "to": _LAYOUT,
                               "median_ms": _number, "iqr_ms": _number})),
}, lambda format, version, **fields: Plan(**fields))


def _check_consistent(plan: Plan, source: str) -> None:
    """What the field types cannot say: one backend throughout, unique layer names, a layout
    per layer in the network totals."""
    def fail(what: str):
        raise PlanError(f"invalid plan {source}: {what}")

    names = [layer.layer for layer in plan.layers]
    if len(set(names)) != len(names):
        fail(f"layer {next(n for n in names if names.count(n) > 1)!r} is planned twice")
    for i, layer in enumerate(plan.layers):
        for pass_, choice in layer.passes.items():
            if choice is not None and choice.backend != plan.backend:
                fail(f"layers[{i}].passes.{pass_}.backend: {choice.backend!r} in a plan for "
                     f"backend {plan.backend!r}")
    for i, entry in enumerate(plan.measurements):
        if entry["backend"] != plan.backend:
            fail(f"measurements[{i}].backend: {entry['backend']!r} in a plan for backend "
                 f"{plan.backend!r}")
    if plan.network and len(plan.network.per_layer_best_layouts) != len(plan.layers):
        fail(f"network.per_layer_best_layouts: {len(plan.network.per_layer_best_layouts)} "
             f"layouts for {len(plan.layers)} layers")
