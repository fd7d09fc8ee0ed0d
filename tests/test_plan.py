import copy
import dataclasses
import json
import pickle

import pytest

from convbench.core import results
from convbench.core.measurement import Measurement
from convbench.core.problem import ConvProblem
from convbench.core.results import entry_from_row, row_from_entry
from convbench.measure import runner, verify
from convbench.planning.plan import (
    ENV_FIELDS,
    PLAN_VERSION,
    Choice,
    Constraints,
    LayerPlan,
    NetworkTotals,
    Plan,
    PlanError,
    PlanStore,
    Unplanned,
    default_dir,
    env_key,
    stale_fields,
)

P1 = ConvProblem(n=2, c=3, h=8, w=8, k=4, r=3, s=3, pad=1)
P2 = ConvProblem(n=2, c=4, h=8, w=8, k=4, r=1, s=1)
ENV = {"device": "Some CPU, 2 cores", "driver": None, "cuda": None, "cudnn": None,
       "torch": "2.13.0+cpu", "cupy": "14.2.0", "convbench": "0.1.0"}


def measured_row(problem=P1, pass_="fwd", algo="gemm", layout="nchw") -> dict:
    case = runner.Case("net", "conv", problem, algo, "numpy", pass_, layout, "fp32")
    return runner.row(case, "ok", check=verify.Check(True, 1e-7, 1e-6, 1e-5),
                      m=Measurement((1.0, 1.1, 1.2)), workspace=4096)


def make_plan(env=ENV, backend="numpy", layers=2) -> Plan:
    choice = Choice("gemm", backend, 1.1, 0.1)
    plan = Plan(
        env=dict(env), backend=backend, precision="fp32", constraints=Constraints(1 << 20, True),
        cudnn={"benchmark": False, "deterministic": True}, input_layout="nchw",
        output_layout="nchw",
        layers=[LayerPlan("a", P1, "nhwc", {"fwd": choice, "bwd_data": None,
                                            "bwd_filter": choice}),
                LayerPlan("b.0", P2, "nchw", {"fwd": choice, "bwd_data": choice,
                                              "bwd_filter": choice})],
        network=NetworkTotals(5.0, 0.5, ["nhwc", "nhwc"], 5.5),
        unplanned=[Unplanned("c", "asymmetric padding (0, 1)")],
        measurements=[entry_from_row(measured_row()),
                      entry_from_row({**measured_row(P2, "bwd_data"), "status": "failed",
                                      "median_ms": None, "rel_error": float("inf")})],
        conversions=[{"shape": [2, 4, 8, 8], "from": "nchw", "to": "nhwc", "median_ms": 0.25,
                      "iqr_ms": 0.01}])
    plan.layers = plan.layers[:layers]
    plan.network = dataclasses.replace(
        plan.network, per_layer_best_layouts=plan.network.per_layer_best_layouts[:layers])
    return plan


def test_round_trip_through_a_file(tmp_path):
    plan = make_plan()
    path = plan.save(tmp_path / "sub" / "plan.json")
    assert Plan.load(path) == plan
    data = json.loads(path.read_text())
    assert data["format"] == "convbench-plan" and data["version"] == PLAN_VERSION
    assert list(data["env"]) == list(ENV_FIELDS)
    assert data["measurements"][1]["rel_error"] is None  # inf is not JSON: the status says it
    assert not list(tmp_path.glob("sub/.*tmp"))  # the atomic write left nothing behind


def test_an_inexact_measurement_round_trips_with_its_error(tmp_path):
    """A plan keeps a library's `inexact` measurement (timed, its error beyond its tolerance):
    the tuning database knows what torch's pick costs and how far off it is."""
    plan = make_plan()
    bad = verify.Check(False, 5.1e-3, 0.1, 6.75e-4)
    case = runner.Case("net", "conv", P1, "torch-cpu", "numpy", "bwd_filter", "nchw", "fp32")
    plan.measurements.append(entry_from_row(runner.row(case, "inexact", bad.reason, check=bad,
                                                       m=Measurement((1.0, 1.1, 1.2)))))
    loaded = Plan.load(plan.save(tmp_path / "plan.json"))
    entry = loaded.measurements[-1]
    assert loaded == plan and entry["status"] == "inexact" and entry["median_ms"] == 1.1
    assert (entry["rel_error"], entry["tolerance"]) == (5.1e-3, 6.75e-4)
    assert entry["reason"].startswith("rel_error 0.0051 > tolerance 0.000675")


def test_entries_round_trip_to_results_rows():
    row = measured_row()
    back = row_from_entry(entry_from_row(row), "conv", "net", "fp32")
    for key in (*results.KEY, "status", "median_ms", "iqr_ms", "rel_error", "workspace_bytes",
                "times_ms"):
        assert back[key] == row[key], key


def mutate(path, value):
    """A function that sets `path` (keys and indexes) of a plan dict to `value`."""
    def fn(d):
        for k in path[:-1]:
            d = d[k]
        if value is KeyError:
            del d[path[-1]]
        else:
            d[path[-1]] = value
    return fn


@pytest.mark.parametrize("change, message", [
    (mutate(["version"], PLAN_VERSION + 1), "version: plan format version 2; this convbench"),
    (mutate(["version"], KeyError), "top level: missing key 'version'"),
    (mutate(["format"], "something-else"), "format: expected 'convbench-plan'"),
    (mutate(["layers", 0, "passes", "fwd", "algo"], "magic"),
     "layers[0].passes.fwd.algo: unknown algo 'magic'; valid: direct"),
    (mutate(["layers", 1, "layout"], "chwn"), "layers[1].layout: unknown layout 'chwn'"),
    (mutate(["layers", 0, "passes", "fwd", "median_ms"], "1.1"),
     "layers[0].passes.fwd.median_ms: expected a number, got a string"),
    (mutate(["layers", 0, "passes", "fwd", "median_ms"], -1), "expected a number >= 0"),
    (mutate(["layers", 0, "problem", "n"], 2.0), "layers[0].problem.n: expected an integer"),
    (mutate(["layers", 0, "problem", "r"], 99), "layers[0].problem: ConvProblem.r: filter"),
    (mutate(["layers", 0, "passes", "sideways"], None), "passes: unknown key 'sideways'"),
    (mutate(["layers", 0, "passes", "bwd_data"], KeyError), "missing key 'bwd_data'"),
    (mutate(["constraints", "deterministic"], "yes"), "deterministic: expected true or false"),
    (mutate(["measurements", 0, "pass"], "fwd2"), "measurements[0].pass: unknown pass"),
    (mutate(["measurements", 0, "status"], "great"), "measurements[0].status: unknown status"),
    (mutate(["conversions", 0, "shape"], [2, 4, 8]), "conversions[0].shape: expected 4 items"),
    (mutate(["precision"], "fp8"), "precision: unknown precision 'fp8'"),
    (mutate(["layers"], {}), "layers: expected a list, got an object"),
    (mutate(["layers", 1, "layer"], "a"), "layer 'a' is planned twice"),
    (mutate(["layers", 0, "passes", "fwd", "backend"], "cuda"), "'cuda' in a plan for backend"),
    (mutate(["network", "per_layer_best_layouts"], ["nchw"]), "1 layouts for 2 layers"),
    (mutate(["env", "torch"], 2.13), "env.torch: expected a string"),
])
def test_a_hand_edited_plan_is_one_clear_error(change, message):
    data = json.loads(make_plan().to_json())
    change(data)
    with pytest.raises(PlanError) as err:
        Plan.from_json(json.dumps(data), "edited.json")
    text = str(err.value)
    assert text.startswith("invalid plan edited.json: ") and "\n" not in text
    assert message in text


@pytest.mark.parametrize("content, message", [
    (lambda text: text[: text.index('"layers"') + 3], "not valid JSON (Unterminated string"),
    (lambda text: "", "not valid JSON (Expecting value at line 1 column 1)"),
    (lambda text: text.replace('"median_ms": 0.25', '"median_ms": NaN'),
     "NaN is not a number JSON allows"),
    (lambda text: text.replace('"backend": "numpy",', '"backend": "numpy", "backend": "numpy",',
                               1), "key 'backend' appears twice"),
    (lambda text: "[1, 2]", "top level: expected an object, got a list"),
])
def test_a_corrupt_file_is_one_clear_error(tmp_path, content, message):
    path = tmp_path / "plan.json"
    path.write_text(content(make_plan().to_json()))
    with pytest.raises(PlanError, match="^invalid plan .*plan.json: ") as err:
        Plan.load(path)
    assert message in str(err.value) and "\n" not in str(err.value)


def test_a_pickle_is_refused_not_run(tmp_path):
    class Boom:
        def __reduce__(self):
            return (pytest.fail, ("a plan was unpickled",))

    path = tmp_path / "plan.json"
    path.write_bytes(pickle.dumps(Boom()))
    with pytest.raises(PlanError, match="not UTF-8|not valid JSON"):
        Plan.load(path)


def test_plan_error_is_a_value_error():
    assert issubclass(PlanError, ValueError)


def test_env_key_reads_env_json_and_staleness_names_the_changes():
    env = {"device": "NVIDIA H200", "gpu": {"driver": 13000, "cuda_runtime": 13000},
           "torch": {"version": "2.13.0", "cudnn": 91000}, "cupy": "14.2.0",
           "convbench": "0.1.0", "numpy": {"version": "2.4"}}
    key = env_key(env)
    assert key == {"device": "NVIDIA H200", "driver": "13000", "cuda": "13000",
                   "cudnn": "91000", "torch": "2.13.0", "cupy": "14.2.0", "convbench": "0.1.0"}
    assert stale_fields(key, key) == []
    assert stale_fields(key, {**key, "torch": "2.14.0", "cudnn": "92000"}) == ["cudnn", "torch"]
    assert env_key({})["device"] is None


def test_default_dir_follows_the_environment(monkeypatch, tmp_path):
    monkeypatch.delenv("CONVBENCH_PLAN_DIR", raising=False)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    assert default_dir() == tmp_path / "convbench" / "plans"
    monkeypatch.setenv("CONVBENCH_PLAN_DIR", str(tmp_path / "mine"))
    assert default_dir() == tmp_path / "mine"
    assert PlanStore().folder == tmp_path / "mine"


def test_store_lookup_finds_fresh_measurements_and_reports_stale_ones(tmp_path):
    store = PlanStore(tmp_path)
    fresh = make_plan()
    path = store.save(fresh)
    assert path.parent == tmp_path and store.save(fresh) == path  # same network: same file
    old = make_plan({**ENV, "torch": "2.12.0"}, layers=1)  # another network, another torch
    old_path = store.save(old)
    assert old_path != path

    got = store.lookup(ENV, "numpy", "fp32")
    assert set(got.measurements) == {(P1, "fwd"), (P2, "bwd_data")}
    assert got.measurements[P1, "fwd"][0]["algo"] == "gemm"
    assert got.conversions[(2, 4, 8, 8), "nchw", "nhwc"]["median_ms"] == 0.25
    assert got.stale == [(old_path, ["torch"])]

    assert store.lookup(ENV, "numpy", "fp64").measurements == {}  # another precision
    newer = {**ENV, "torch": "2.14.0"}
    later = store.lookup(newer, "numpy", "fp32")
    assert later.measurements == {} and len(later.stale) == 2


def test_newest_plan_wins_a_lookup(tmp_path):
    store = PlanStore(tmp_path)
    old, new = make_plan(), make_plan(layers=1)  # another network: another file
    old.created, new.created = "2020-01-01T00:00:00+00:00", "2030-01-01T00:00:00+00:00"
    new.measurements = copy.deepcopy(new.measurements)
    new.measurements[0]["algo"] = "direct"
    store.save(old)
    store.save(new)
    assert store.lookup(ENV, "numpy", "fp32").measurements[P1, "fwd"][0]["algo"] == "direct"


def test_a_corrupt_store_file_names_the_file(tmp_path):
    store = PlanStore(tmp_path)
    store.save(make_plan())
    (tmp_path / "broken.json").write_text('{"format": "convbench-plan", "version": 1')
    with pytest.raises(PlanError, match=r"broken\.json: not valid JSON"):
        store.lookup(ENV, "numpy", "fp32")


#: Inception's 7x1 padded along the height only, and a stride and dilation per axis.
PER_AXIS = [ConvProblem(n=2, c=4, h=9, w=9, k=4, r=7, s=1, pad=(3, 0)),
            ConvProblem(n=2, c=4, h=9, w=9, k=4, r=3, s=3, stride=(2, 1), pad=1,
                        dilation=(1, 2))]


def test_a_per_axis_plan_round_trips_through_a_file(tmp_path):
    plan = make_plan()
    choice = Choice("direct", "numpy", 1.0, 0.1)
    plan.layers = [LayerPlan(f"inc.{i}", p, "nchw", {"fwd": choice, "bwd_data": choice,
                                                     "bwd_filter": None})
                   for i, p in enumerate(PER_AXIS)]
    plan.network = dataclasses.replace(plan.network, per_layer_best_layouts=["nchw"] * 2)
    plan.measurements = [entry_from_row(measured_row(p, algo="direct")) for p in PER_AXIS]
    path = plan.save(tmp_path / "plan.json")
    data = json.loads(path.read_text())
    assert [(lp["problem"]["stride"], lp["problem"]["pad"], lp["problem"]["dilation"])
            for lp in data["layers"]] == [(1, [3, 0], 1), ([2, 1], 1, [1, 2])]
    back = Plan.load(path)
    assert back == plan and [lp.problem for lp in back.layers] == PER_AXIS
    assert [results.problem_from_row(row_from_entry(e, "x", "net", "fp32"))
            for e in back.measurements] == PER_AXIS


def test_an_old_plan_file_with_integer_geometry_still_loads(tmp_path):
    """Plans written before per-axis geometry hold one integer per field; they load as before."""
    path = make_plan().save(tmp_path / "old.json")
    data = json.loads(path.read_text())
    assert {type(lp["problem"][f]) for lp in data["layers"]
            for f in ("stride", "pad", "dilation")} == {int}
    assert [lp.problem for lp in Plan.load(path).layers] == [P1, P2]


@pytest.mark.parametrize("value, message", [
    ([2, 1, 1], "expected an integer or \\[height, width\\]"),
    ([2, "1"], "expected an integer"),
    ([0, 1], r"stride\[0\]: expected an integer >= 1, got 0"),
])
def test_a_bad_per_axis_value_is_one_clear_error(tmp_path, value, message):
    path = make_plan().save(tmp_path / "plan.json")
    data = json.loads(path.read_text())
    data["layers"][0]["problem"]["stride"] = value
    path.write_text(json.dumps(data))
    with pytest.raises(PlanError, match=message):
        Plan.load(path)


#: Padding that differs before and after: TensorFlow's SAME, and rows no output reads.
ASYMMETRIC = [ConvProblem(n=2, c=4, h=8, w=9, k=4, r=3, s=3, stride=2, pad=((0, 1), (1, 1))),
              ConvProblem(n=1, c=4, h=10, w=9, k=4, r=3, s=2, pad=((1, -2), (0, 1)))]


def test_a_plan_with_padding_before_and_after_round_trips(tmp_path):
    plan = make_plan()
    choice = Choice("direct", "numpy", 1.0, 0.1)
    plan.layers = [LayerPlan(f"tf.{i}", p, "nchw", {"fwd": choice, "bwd_data": choice,
                                                    "bwd_filter": None})
                   for i, p in enumerate(ASYMMETRIC)]
    plan.network = dataclasses.replace(plan.network, per_layer_best_layouts=["nchw"] * 2)
    plan.measurements = [entry_from_row(measured_row(p, algo="direct")) for p in ASYMMETRIC]
    path = plan.save(tmp_path / "plan.json")
    data = json.loads(path.read_text())
    assert [lp["problem"]["pad"] for lp in data["layers"]] == [[[0, 1], [1, 1]],
                                                               [[1, -2], [0, 1]]]
    back = Plan.load(path)
    assert back == plan and [lp.problem for lp in back.layers] == ASYMMETRIC
    assert [results.problem_from_row(row_from_entry(e, "x", "net", "fp32"))
            for e in back.measurements] == ASYMMETRIC
    store = PlanStore(tmp_path / "store")
    store.save(plan)
    found = store.lookup(ENV, "numpy", "fp32").measurements
    assert {problem for problem, _ in found} == set(ASYMMETRIC)


def test_a_saved_plan_is_as_readable_as_any_file_the_user_writes(tmp_path):
    """mkstemp's private mode (0600) is not left on a plan: the umask decides, as for any file."""
    import os

    from convbench.planning.plan import ENV_FIELDS, Constraints, Plan

    plan = Plan(env=dict.fromkeys(ENV_FIELDS), backend="numpy", precision="fp32",
                constraints=Constraints(),
                cudnn={"benchmark": False, "deterministic": False}, input_layout="nchw",
                output_layout="nchw", layers=[], network=None)
    mask = os.umask(0o022)
    try:
        path = plan.save(tmp_path / "plan.json")
    finally:
        os.umask(mask)
    assert path.stat().st_mode & 0o777 == 0o644
