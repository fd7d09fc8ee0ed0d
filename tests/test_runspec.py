"""The run as data: a RunSpec round-trips through env.json, is read back to resume a run from
the library alone, and a resumed run given other options is refused naming the field."""

import json

import pytest
from test_cli import REAL_PREPARE, run_cli

from convbench import runs
from convbench.core import results
from convbench.core.runspec import RunSpec
from convbench.machine import threads
from convbench.measure import runner, timing

TINY = "n=1,c=2,h=6,w=6,k=3,r=3,s=3,pad=1"
#: Two layers, two competing groups of two cases each (fwd of each layer, two layouts).
SPEC = RunSpec(device="cpu", algos=("torch-cpu",), passes=("fwd",), layouts=("nchw", "nhwc"),
               precisions=("fp32",), budget_s=0.002, target_noise=0.05, net="alexnet",
               layers=(TINY, "conv3"), batches=(1,), threads=threads.available_cores())


@pytest.fixture(autouse=True)
def _default_threads():
    yield
    threads.use()  # what `start` and `runs.resume` set, back to the default policy


def start(folder, spec: RunSpec = SPEC) -> runs.Run:
    """A run of `spec` into `folder`, from the library: its threads, cases, env.json, folder."""
    threads.use(spec.threads)
    cases = runs.cases(spec)
    return runs.Run(spec, cases, runs.open_folder(spec, cases, folder, command="a test"))


def test_a_spec_round_trips_through_env_json(tmp_path):
    start(tmp_path / "run")
    env = json.loads((tmp_path / "run" / results.ENV_JSON).read_text())
    assert env["schema"] == results.SCHEMA
    assert env["run"]["command"] == "a test" and env["run"]["layers"] == [TINY, "conv3"]
    assert RunSpec.load(tmp_path / "run") == SPEC
    # how its rows were timed: on this spec's threads, each call with its pool awake or not
    assert (timing.WARM_POOLS in env["statistics"]["timing"]) is (threads.count() > 1)
    assert RunSpec.from_dict(json.loads(json.dumps(SPEC.to_dict()))) == SPEC


def test_from_dict_takes_its_fields_and_names_what_is_missing():
    run = {**SPEC.to_dict(), "occurrences": {"conv3": 1}, "command": "convbench bench"}
    assert RunSpec.from_dict(run) == SPEC  # what the run found is left alone
    del run["algos"]
    with pytest.raises(ValueError, match="^the run lacks algos$"):
        RunSpec.from_dict(run)
    with pytest.raises(ValueError, match="needs its input's shape"):
        RunSpec.from_dict({**SPEC.to_dict(), "model": "m:f"})


def test_a_run_resumes_from_the_library_alone(tmp_path, monkeypatch, interrupt):
    """Ctrl-C after the first group, then `runs.resume(folder)`: the rest of the cases and no
    more, and the folder holds the whole run."""
    folder = tmp_path / "run"
    interrupt(2)
    outcome = start(folder).measure()
    assert outcome.interrupted and len(outcome.frame) == 2
    monkeypatch.setattr(runner, "prepare", REAL_PREPARE)
    measured = []
    monkeypatch.setattr(runner, "prepare", lambda case, *a, **k: measured.append(case) or
                        REAL_PREPARE(case, *a, **k))
    run = runs.resume(folder)
    outcome = run.measure()
    assert not outcome.interrupted and len(measured) == 2
    assert sorted(map(results.row_key, outcome.frame.to_dict("records"))) == \
        sorted(c.key() for c in runs.cases(SPEC))
    env = json.loads((folder / results.ENV_JSON).read_text())
    assert [r["when"] for r in env["load"]] == ["start", "end", "resumed start", "end"]
    assert runs.resume(folder).todo == []  # nothing left


def test_the_library_cannot_resume_what_it_cannot_read(tmp_path):
    with pytest.raises(ValueError, match="does not exist: there is no run to resume"):
        runs.resume(tmp_path / "nothing")
    start(tmp_path / "run")
    env_path = tmp_path / "run" / results.ENV_JSON
    env = json.loads(env_path.read_text())
    env_path.write_text(json.dumps({**env, "schema": results.SCHEMA + 1}))
    with pytest.raises(ValueError, match="newer than this convbench reads"):
        runs.resume(tmp_path / "run")
    del env["schema"]  # a folder from before run specs: the command line resumes it
    env_path.write_text(json.dumps(env))
    with pytest.raises(ValueError, match=r"written before run specs \(schema 0\): resume it "
                                         r"with `a test --resume --out"):
        RunSpec.load(tmp_path / "run")
    model = RunSpec(**{**SPEC.to_dict(), "layers": (), "model": "m:f", "input": (1, 3, 8, 8)})
    with pytest.raises(ValueError, match="give its layers"):
        runs.cases(model)


def test_a_conflict_names_the_field_and_lists_agree_in_any_order():
    assert SPEC.conflict({"layouts": ["nhwc", "nchw"], "layers": ("conv3", TINY)}) is None
    assert SPEC.conflict({"batches": (8,)}) == ("batches", (8,), (1,))
    assert SPEC.conflict({"algos": ["gemm"], "batches": (8,)})[0] == "algos"
    with pytest.raises(ValueError, match="no field 'colour'"):
        SPEC.conflict({"colour": "red"})


def test_the_command_line_resumes_a_run_the_library_made(tmp_path, capsys, monkeypatch,
                                                        interrupt):
    """A library run has no command line to read back: `bench --resume` takes its spec, and
    refuses an option that contradicts it in one line naming the option."""
    folder = tmp_path / "run"
    interrupt(2)
    start(folder).measure()
    for argv, expected in ((["--algos", "gemm"], "--algos gemm contradicts the run in"),
                           (["--precisions", "fp16"], "--precisions fp16 contradicts the run"),
                           (["--precision", "fp16"], "--precisions fp16 contradicts the run"),
                           (["--layouts", "nchw"], "--layouts nchw contradicts the run"),
                           (["--batch", "2"], ("--batch 2 contradicts the run in {f}, made "
                                               "with --batch 1"))):
        code, out, err = run_cli(capsys, "bench", *argv, "--resume", "--out", str(folder))
        assert code == 2 and out == "" and err.count("\n") == 1, err
        assert err.startswith("convbench: error: " + expected.format(f=folder)), err
    monkeypatch.setattr(runner, "prepare", REAL_PREPARE)
    code, _, err = run_cli(capsys, "bench", "--resume", "--out", str(folder), "--quiet",
                           "--layouts", "nhwc,nchw")  # its own options, in another order
    assert code == 0, err
    assert len(results.read_rows(folder / results.RESULTS_CSV)) == 4
