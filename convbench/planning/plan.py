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
from dataclasses import dataclass, field
from pathlib import Path

from ..algos.cudnn_find import MATH_TYPES, enum_of
from ..algos.cudnn_pinned import Pin
from ..algos.registry import ALGOS
from ..core.problem import LAYOUTS, PASSES, PRECISIONS, ConvProblem
from ..core.results import ENTRY_NUMBERS, ENTRY_TEXTS, STATUSES
from ..machine.backends import BACKENDS
from ..machine.host import user_cache
from .planschema import (
    Invalid,
    anything,
    flag,
    integer,
    list_of,
    no_constant,
    no_duplicates,
    number,
    obj,
    one_of,
    optional,
    passes,
    problem_field,
    text,
)

PLAN_FORMAT = "convbench-plan"
#: Bumped whenever a field changes meaning; a plan of another version is refused, not guessed.
PLAN_VERSION = 1
#: What makes a measurement valid: a change in any of these makes a stored plan stale.
ENV_FIELDS = ("device", "driver", "cuda", "cudnn", "torch", "cupy", "convbench")
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
    relative error against the float64 reference, beyond the algorithm's own tolerance; a
    library's `inexact` result (past its tolerance) is a candidate only within it.
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
    """The implementation a pass runs, with the time it was chosen for; for one of cuDNN's
    algorithms (`cudnn-find-*`) its pin: what training runs directly, with no find
    (`cudnn_pinned.Pin`: the enum, math type, workspace, the find's time, the cuDNN version)."""

    algo: str
    backend: str
    median_ms: float
    iqr_ms: float
    pin: Pin | None = None


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


@dataclass(frozen=True)
class StepCheck:
    """What the model's whole step measured of a plan (`confirm`): in `mode` (train,
    inference), the step time with the changes kept over torch's default's (`time_ratio`, its
    95% interval `low`..`high`; 1 without an interval where nothing was kept) and the two
    medians, the same ratio for the whole plan as tuned, how many comparisons were made, and
    which changed layers were kept and which dropped."""

    mode: str
    time_ratio: float
    low: float | None
    high: float | None
    plan_ms: float | None
    default_ms: float | None
    whole_ratio: float
    whole_low: float | None
    whole_high: float | None
    trials: int
    kept: list[str]
    dropped: list[str]
    #: Whether every layer keeps the plan's layout, the dropped ones running torch's own
    #: algorithms in it (the step confirmed the layouts alone before the replacements).
    layouts_kept: bool = False
    #: On a GPU, the host's median time to issue a step with the changes kept and torch's
    #: default's (ms), beside the steps' times: a step whose host takes longer than its device
    #: runs at the host's pace. None on the CPU, where the step's time is the host's.
    plan_host_ms: float | None = None
    default_host_ms: float | None = None
    #: What held the machine back through every try of the comparison that stopped the
    #: confirmation (contended cores, throttled clocks); "" where it ran to its end. Stopped,
    #: the plan keeps what was confirmed before, torch's default for the rest.
    busy: str = ""
    #: The alternative the plan became, faster than what it kept (`confirm.CHANNELS_LAST`:
    #: every layer channels_last, torch's algorithms); "" where the plan is its own.
    alternative: str = ""

    def text(self) -> str:
        """One line: `train step: 0.87× [0.84, 0.90] torch's default's time; 12 of 20
        changes confirmed`, and what made it so where a busy machine stopped the confirmation
        or an alternative won."""
        n = len(self.kept) + len(self.dropped)
        if not n:
            return f"{self.mode} step: the plan changes no layer; torch's default runs it all"
        ratio = (f"{self.time_ratio:.3g}× [{self.low:.3g}, {self.high:.3g}] torch's default's "
                 "time" if self.low is not None else "torch's default (nothing confirmed)")
        whole = (f"; the whole plan measured {self.whole_ratio:.3g}× [{self.whole_low:.3g}, "
                 f"{self.whole_high:.3g}]" if self.dropped and self.whole_low is not None
                 else "")
        layouts = ("; the plan's layouts kept, torch's algorithms in them where replacements "
                   "were dropped" if self.layouts_kept else "")
        alternative = (f"; {self.alternative} (torch's algorithms) was faster than the plan "
                       "and runs instead" if self.alternative else "")
        busy = (f"; the machine stayed busy ({self.busy}): stopped, torch's default for what "
                "was not confirmed" if self.busy else "")
        return (f"{self.mode} step: {ratio}; {len(self.kept)} of {n} "
                f"{'change' if n == 1 else 'changes'} confirmed"
                f"{layouts}{alternative}{whole}{busy}")


@dataclass
class Plan:
    """What to run for each conv layer of a network, the key it is valid under (`env`, backend,
    precision), the constraints it was chosen under, and the measurements it was chosen from."""

    env: dict[str, str | None]
    backend: str
    precision: str
    constraints: Constraints
    #: The global flags to set: {"benchmark", "deterministic"}, and on a GPU the
    #: "benchmark_limit" torch's search ran with when measured.
    cudnn: dict[str, bool | int]
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
    #: What the model's whole step measured of the plan, per mode (`confirm`); empty where it
    #: was not confirmed.
    checks: list[StepCheck] = field(default_factory=list)

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
            header = obj({"format": text, "version": anything}, partial=True)(data, "")
            if header["format"] != PLAN_FORMAT:
                raise Invalid("format", f"expected {PLAN_FORMAT!r}, got {header['format']!r}: "
                               "not a convbench plan")
            version = header["version"]
            if type(version) is not int or version != PLAN_VERSION:
                raise Invalid("version", f"plan format version {version!r}; this "
                               f"convbench reads version {PLAN_VERSION} (tune again to replace "
                               "it)")
            plan = _PLAN(data, "")
        except Invalid as exc:
            raise PlanError(f"invalid plan {source}: {exc.path or 'top level'}: {exc.what}") \
                from None
        _check_consistent(plan, source)
        return plan

    @classmethod
    def from_json(cls, text: str, source: str = "plan") -> Plan:
        try:
            data = json.loads(text, parse_constant=no_constant, object_pairs_hook=no_duplicates)
        except json.JSONDecodeError as exc:
            raise PlanError(f"invalid plan {source}: not valid JSON ({exc.msg} at line "
                            f"{exc.lineno} column {exc.colno})") from None
        except Invalid as exc:
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
            # mkstemp's file is private (0600); a plan is a file like any other the user writes
            os.fchmod(fd, 0o666 & ~_umask())
            with os.fdopen(fd, "w") as f:
                f.write(text)
            os.replace(tmp, path)
        except BaseException:
            Path(tmp).unlink(missing_ok=True)
            raise
        return path


def _umask() -> int:
    """The process's umask (read by setting it, and set back at once)."""
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


# --- the store ------------------------------------------------------------------------------
def default_dir() -> Path:
    """$CONVBENCH_PLAN_DIR, else $XDG_CACHE_HOME/convbench/plans, else ~/.cache/convbench/plans."""
    if os.environ.get("CONVBENCH_PLAN_DIR"):
        return Path(os.environ["CONVBENCH_PLAN_DIR"])
    return user_cache() / "plans"


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


_ALGO, _BACKEND = one_of(ALGOS, "algo"), one_of(BACKENDS, "backend")
_LAYOUT, _PASS = one_of(LAYOUTS, "layout"), one_of(PASSES, "pass")
_OPT_NUMBER = optional(number)
_MEASUREMENT = obj({"problem": problem_field, "pass": _PASS, "algo": _ALGO,
                     "backend": _BACKEND, "layout": _LAYOUT,
                     "status": one_of(STATUSES, "status"), "reason": text,
                     **{k: _OPT_NUMBER for k in ENTRY_NUMBERS},
                     "workspace_bytes": optional(integer()), "times_ms": list_of(number),
                     **{k: text for k in ENTRY_TEXTS}, "contended": flag},
                    optional=(*ENTRY_TEXTS, "contended"))
_PIN = obj({"algo": text, "math": one_of(MATH_TYPES, "math type"),
            "workspace_bytes": optional(integer()), "search_ms": _OPT_NUMBER,
            "cudnn": optional(text)}, Pin)
_CHOICE = obj({"algo": _ALGO, "backend": _BACKEND, "median_ms": number, "iqr_ms": number,
               "pin": optional(_PIN)}, Choice, optional=("pin",))
_PLAN = obj({
    "format": text, "version": anything, "created": text,
    "env": obj({f: optional(text) for f in ENV_FIELDS}),
    "backend": _BACKEND,
    "precision": one_of(PRECISIONS, "precision"),
    "constraints": obj({"workspace_budget": optional(integer()), "deterministic": flag,
                         "max_error": _OPT_NUMBER,
                         "tie_break": one_of(TIE_BREAKS, "tie-break"), "include_busy": flag},
                        Constraints, optional=("tie_break", "include_busy")),
    "cudnn": obj({"benchmark": flag, "deterministic": flag,
                  "benchmark_limit": optional(integer())}, optional=("benchmark_limit",)),
    "input_layout": _LAYOUT, "output_layout": _LAYOUT,
    "layers": list_of(obj({"layer": text, "problem": problem_field, "layout": _LAYOUT,
                          "passes": passes(_CHOICE)}, LayerPlan)),
    "network": optional(obj({"total_ms": number, "conversion_ms": number,
                               "per_layer_best_layouts": list_of(_LAYOUT),
                               "per_layer_best_ms": number}, NetworkTotals)),
    "unplanned": list_of(obj({"layer": text, "reason": text}, Unplanned)),
    "measurements": list_of(_MEASUREMENT),
    "conversions": list_of(obj({"shape": list_of(integer(1), 4), "from": _LAYOUT, "to": _LAYOUT,
                               "median_ms": number, "iqr_ms": number})),
    "checks": list_of(obj({"mode": one_of(("train", "inference"), "step mode"),
                           "time_ratio": number, "low": _OPT_NUMBER, "high": _OPT_NUMBER,
                           "plan_ms": _OPT_NUMBER, "default_ms": _OPT_NUMBER,
                           "whole_ratio": number, "whole_low": _OPT_NUMBER,
                           "whole_high": _OPT_NUMBER, "trials": integer(),
                           "kept": list_of(text), "dropped": list_of(text),
                           "layouts_kept": flag, "plan_host_ms": _OPT_NUMBER,
                           "default_host_ms": _OPT_NUMBER, "busy": text,
                           "alternative": text}, StepCheck,
                          optional=("layouts_kept", "plan_host_ms", "default_host_ms", "busy",
                                    "alternative"))),
}, lambda format, version, **fields: Plan(**fields), optional=("checks",))


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
            if choice is not None and choice.pin is not None and \
                    enum_of(choice.algo, pass_) != choice.pin.algo:
                fail(f"layers[{i}].passes.{pass_}.pin.algo: {choice.pin.algo!r} is not "
                     f"{choice.algo}'s cuDNN algorithm for {pass_}")
    for i, entry in enumerate(plan.measurements):
        if entry["backend"] != plan.backend:
            fail(f"measurements[{i}].backend: {entry['backend']!r} in a plan for backend "
                 f"{plan.backend!r}")
    if plan.network and len(plan.network.per_layer_best_layouts) != len(plan.layers):
        fail(f"network.per_layer_best_layouts: {len(plan.network.per_layer_best_layouts)} "
             f"layouts for {len(plan.layers)} layers")
