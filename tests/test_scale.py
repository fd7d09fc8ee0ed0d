"""Data-parallel scaling: two gloo ranks on this machine train a small model; the exact
all-reduce computes one process's gradient, the hooks' errors are reported, the output is
written; gradient bytes and what each hook sends; bad input is one line."""

import os

import pytest
import torch
from test_cli import run_cli
from torch import nn

from convbench.studies import scale, scale_report
from convbench.studies.workload import Workload


class Small(nn.Module):
    """A conv layer and two fully connected ones; fc6 (2 MiB of gradient) is over DDP's 1 MiB
    first bucket, so the gradient travels in two buckets and PowerSGD compresses fc6."""

    def __init__(self):
        super().__init__()
        self.conv1 = nn.Conv2d(3, 8, 3, padding=1)
        self.fc6 = nn.Linear(8 * 16 * 16, 256)
        self.fc7 = nn.Linear(256, 10)

    def forward(self, x):
        return self.fc7(torch.relu(self.fc6(torch.relu(self.conv1(x)).flatten(1))))


SMALL = Workload.of_model("test_scale:Small", (3, 16, 16))  # the ranks import this module


@pytest.fixture(scope="module")
def two_ranks():
    """Every hook at world sizes 1 and 2, global batch 4, on two spawned gloo ranks."""
    job = scale.Job(SMALL, "cpu", (1, 2), (4,), scale.HOOKS, steps=3, warmup=1, powersgd_rank=1)
    return scale.run(job)


def step_row(result, world: int, hook: str) -> dict:
    return next(r for r in result.rows if r["kind"] == "step" and r["world_size"] == world
                and r["hook"] == hook)


def test_the_exact_all_reduce_computes_one_process_gradient(two_ranks):
    """DDP over 2 ranks of 2 images each: the gradient of one process with all 4."""
    assert step_row(two_ranks, 2, "allreduce")["one_process_error"] < 1e-6
    assert step_row(two_ranks, 2, "allreduce")["gradient_error"] < 1e-6


def test_each_hook_reports_the_error_it_introduces(two_ranks):
    errors = {h: step_row(two_ranks, 2, h)["gradient_error"] for h in scale.HOOKS}
    assert 1e-6 < errors["fp16"] < 1e-2 and 1e-5 < errors["bf16"] < 5e-2
    assert errors["powersgd"] > errors["bf16"]  # a rank-1 approximation of a rank-4 gradient
    assert step_row(two_ranks, 1, "allreduce")["gradient_error"] is None


def test_every_measurement_is_a_row_and_the_derived_numbers_hold(two_ranks):
    kinds = {(r["world_size"], r["hook"], r["kind"]) for r in two_ranks.rows}
    assert kinds == {(1, "none", "compute"), *((1, "allreduce", k) for k in scale.KINDS[1:]),
                     (2, "none", "compute"),
                     *((2, h, k) for h in scale.HOOKS for k in scale.KINDS[1:])}
    for r in two_ranks.rows:
        assert r["reps"] == 3 and len(r["times_ms"].split()) == 3 and r["median_ms"] > 0
    one, two = step_row(two_ranks, 1, "allreduce"), step_row(two_ranks, 2, "allreduce")
    assert one["speedup"] == pytest.approx(1.0)
    assert two["speedup"] == pytest.approx(one["median_ms"] / two["median_ms"])
    assert two["efficiency"] == pytest.approx(two["speedup"] / 2)
    assert 0.0 <= two["hidden_share"] <= 1.0 and one["hidden_share"] is None
    assert two["exchanged_bytes"] == 4 * sum(p.numel() for p in Small().parameters())
    assert two_ranks.nodes == 1 and len(two_ranks.ranks) == 2
    timeline = two_ranks.timelines()[(2, 4)]
    assert len(timeline["buckets"]) == 2
    assert 0 < timeline["forward"] <= timeline["backward"] <= timeline["end"]


def test_the_report_and_plots(two_ranks, tmp_path):
    pytest.importorskip("matplotlib")
    text = scale_report.markdown(two_ranks, {"device": "a CPU"})
    assert f"| {SMALL.name} |" in text and "| powersgd  |" in text and "vs one process" in text
    names = scale_report.write(tmp_path, text, two_ranks, {}, "title")
    assert names == ["report.md", "scale.csv", "env.json", "speedup.png", "timeline.png"]
    assert all((tmp_path / n).stat().st_size > 0 for n in names)


def test_gradient_bytes_and_what_each_hook_sends():
    alexnet = scale.on_meta(Workload.parse("alexnet"))
    split = scale.gradient_bytes(alexnet)
    assert sum(split.values()) == 4 * 62_378_344 and split["fc"] / sum(split.values()) > 0.9
    fcfree = scale.gradient_bytes(scale.on_meta(Workload.parse("alexnet-fcfree")))
    assert split["conv"] == fcfree["conv"] and sum(fcfree.values()) < 0.45 * sum(split.values())
    total = sum(split.values())
    assert scale.exchanged_bytes(alexnet, "fp16") == total // 2
    fc7 = (4096 + 4096) * 4 * 4  # PowerSGD sends P and Q: (n + m) * rank floats
    assert fc7 < scale.exchanged_bytes(alexnet, "powersgd", 4) < total / 100


def test_the_fc_free_variant_trains_like_the_original():
    model = Workload.parse("alexnet-fcfree").build()
    assert all(isinstance(getattr(model, n), nn.Conv2d) for n in scale.FC_LAYERS)
    x, y = Workload.parse("alexnet-fcfree").example_batch(1, "cpu")
    assert model(x).shape == (1, 1000) and y.shape == (1,)


def test_hooks_are_checked():
    assert scale.parse_hooks("powersgd, fp16") == ("allreduce", "powersgd", "fp16")
    with pytest.raises(ValueError, match="unknown hook 'magic'; valid: allreduce, fp16"):
        scale.parse_hooks("fp16,magic")


@pytest.mark.parametrize("argv, names", [
    (["--world-sizes", f"1,{(os.cpu_count() or 1) + 1}"],
     f"world size {(os.cpu_count() or 1) + 1} is larger than the {os.cpu_count()} CPU cores"),
    (["--world-sizes", "1,2", "--batch", "3"], "global batch 3 does not split evenly over 2"),
    (["--hooks", "allreduce,1bit"], "unknown hook '1bit'"),
    (["--net", "vgg16"], "invalid choice: 'vgg16'"),
    (["--world-sizes", "0,2"], "'0,2' is not a comma list of positive world sizes"),
    (["--batch", "2", "--per-rank-batch", "2"], "not allowed with argument --batch"),
])
def test_bad_input_is_one_line_and_exit_2(capsys, argv, names):
    code, out, err = run_cli(capsys, "scale", "--device", "cpu", *argv)
    assert code == 2 and err.count("\n") == 1 and names in err and out == ""


@pytest.mark.skipif(torch.cuda.is_available(), reason="this machine has a GPU")
def test_cuda_without_a_gpu_is_one_line(capsys):
    code, _, err = run_cli(capsys, "scale", "--device", "cuda")
    assert code == 2 and err == "convbench: error: --device cuda: torch sees no GPU here\n"


def test_world_sizes_under_torchrun_are_checked_against_its_ranks(monkeypatch):
    monkeypatch.setenv("RANK", "0")
    monkeypatch.setenv("LOCAL_RANK", "0")
    monkeypatch.setenv("WORLD_SIZE", "2")
    assert scale.default_world_sizes("cpu") == (1, 2)
    job = scale.Job(SMALL, "cpu", (1, 4), (4,))
    with pytest.raises(ValueError, match="world size 4 is larger than the 2 ranks torchrun"):
        scale.check_job(job)
