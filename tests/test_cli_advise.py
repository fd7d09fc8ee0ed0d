import argparse
import json

import pytest
from test_tune import tiny_run

from convbench.cli import advise as cli_advise
from convbench.planning import advice, tune
from convbench.planning.plan import Constraints, Plan, PlanStore


def command(*argv):
    parser = argparse.ArgumentParser()
    cli_advise.add_parsers(parser.add_subparsers())
    args = parser.parse_args(list(argv))
    return args.func(args)


def test_advise_command_prints_the_advice_and_writes_the_plan(tmp_path, capsys):
    folder = tiny_run(tmp_path)
    store, out = tmp_path / "store", tmp_path / "plan.json"
    assert command("advise", str(folder), "--store", str(store), "--out", str(out),
                   "--workspace-budget", "1GiB", "--deterministic", "--max-error", "1e-3") == 0
    text, err = capsys.readouterr()
    assert "## Per-layer best (numpy, fp32)" in text and "## Network layout plan" in text
    assert "Network plan:" in text
    assert "cudnn regret" not in text  # a CPU run: no cuDNN to regret
    assert "The constraints (workspace <= 1 GiB, deterministic, error <= 0.001) cost " in text
    plan = Plan.load(out)
    assert plan.constraints == Constraints(1 << 30, True, 1e-3)
    assert [p.name for p in store.iterdir()] == [PlanStore(store).path_for(plan).name]
    assert f"plan written to {out}" in err
    assert command("advise", str(folder), "--no-store", "--format", "json",
                   "--store", str(tmp_path / "unused")) == 0
    assert json.loads(capsys.readouterr().out)["format"] == "convbench-plan"
    assert not (tmp_path / "unused").exists()


def test_what_a_workspace_budget_costs(tmp_path, capsys):
    folder = tiny_run(tmp_path)
    free, _, _ = tune.advise_run(folder)
    tight, _, _ = tune.advise_run(folder, Constraints(workspace_budget=1))
    assert tight.layers and all(c is None for lp in tight.layers for c in lp.passes.values())
    assert advice.plan_total_ms(free) > 0
    line = advice.constraint_cost(tight, free)
    assert line.startswith("The constraints (workspace <= 1 B) cost ")
    assert f"against {advice.plan_total_ms(free):.4g} ms unconstrained" in line
    assert "No choice fits for l" in line  # nothing declares under one byte
    assert command("advise", str(folder), "--no-store") == 0
    assert "The constraints" not in capsys.readouterr().out  # none given: nothing to cost


def test_advise_command_errors_are_usage_errors(tmp_path):
    from convbench.cli import UsageError

    with pytest.raises(UsageError, match="is not a run folder"):
        command("advise", str(tmp_path), "--no-store")
    with pytest.raises(SystemExit):
        command("advise", str(tmp_path), "--workspace-budget", "lots")
    with pytest.raises(SystemExit):
        command("advise", str(tmp_path), "--max-error", "-1")



def test_advise_on_a_model_run_counts_each_layer_as_the_report_does(tmp_path, capsys):
    """#35: `advise RUN` on a --model run weighs each distinct problem by its occurrences
    (env.json's run), so its network total is the report's; it counted each problem once."""
    from test_advice import synthetic, times

    from convbench.analysis import report
    from convbench.core import results
    from convbench.core.fmt import fmt_ms

    folder = tmp_path / "run"
    sink = results.CsvSink(folder / results.RESULTS_CSV)
    for row in synthetic({("l1", "fwd", "gemm", "nchw"): times(1.0),
                          ("l2", "fwd", "gemm", "nchw"): times(3.0)}):
        sink.append(row)
    (folder / results.ENV_JSON).write_text(json.dumps(
        {"run": {"model": "m:net", "occurrences": {"l1": 3, "l2": 1}}}))
    plan, adv, _ = tune.advise_run(folder)
    df, env = results.load_run(folder)
    total = advice.plan_total_ms(plan, adv.occurrences)
    assert total == pytest.approx(3 * 1.0 + 3.0)
    assert fmt_ms(total) == report.choice_totals(df, env["run"]["occurrences"]).loc[
        "fastest per layer and pass", "network ms"]
    assert command("advise", str(folder), "--no-store") == 0
    assert "4 conv layers, 2 distinct problems" in capsys.readouterr().out
