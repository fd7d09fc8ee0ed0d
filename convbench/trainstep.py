"""`convbench train-step`: a whole training step, three ways — defaults, cudnn.benchmark, the plan.

The study found that once the frameworks were tuned they differed little: what is left is the
convolution algorithms, the layouts, and everything around them. This times a full step
(forward, cross-entropy loss, backward, SGD update) of an AlexNet-shaped model — the catalog's
conv layers with ReLU and 3x3/2 max-pooling after conv1, conv2 and conv5, then fc6-fc8 (4096,
4096, 1000; no dropout, so every configuration computes the same thing) — with

- `defaults`: torch as installed (cuDNN heuristics on a GPU);
- `cudnn.benchmark`: `torch.backends.cudnn.benchmark = True` (on the CPU this does nothing:
  torch's CPU convolutions never read it, so that row is a control of run-to-run noise);
- `plan`: `advisor.tune` on the model, then `advisor.apply`.

Each configuration runs in its own process: cuDNN remembers the algorithm it picked for a shape
for the life of a process (per thread, whatever `benchmark` was when it picked), so in one
process the first configuration would decide the others' algorithms. Every process seeds the
same weights and data, so their first-step losses agree. fp32 is fp32: TF32 is off for cuDNN and
cuBLAS. Step times are measured like every other time here (`convbench.timing`, sized by a
budget), after one untimed step that also does cuDNN's autotuning. The three processes stay up
and take turns, a few rounds each, so a machine whose load drifts while they are timed (a shared
CPU) slows all three alike rather than whichever ran last. On the CPU every process, the tuning
one included, runs with idle threads sleeping (`threads.CPU_THREAD_ENV`).
"""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pandas as pd

from . import apply, layers, models, registry, results, timing, tune
from .devices import backend_of
from .measurement import Measurement
from .plan import Plan
from .report import fmt_ms
from .tables import tabulate
from .threads import CPU_THREAD_ENV

CONFIGS = ("defaults", "cudnn.benchmark", "plan")
NETS = ("alexnet", "alexnet-owt")
#: Conv layers followed by a 3x3, stride-2 max-pool, as in AlexNet.
POOLED = ("conv1", "conv2", "conv5")
CLASSES = 1000
#: CPU defaults, so `convbench train-step` ends within about three minutes on 2 cores: two images
#: per step (the study's batch was 256) of full size, a 0.02 s timing budget per tuning
#: measurement (each still gets its 3 repetitions) and 6 s of timed steps per configuration.
CPU_STEP_BATCH = 2
CPU_TUNE_BUDGET_S = 0.02
STEP_BUDGET_S = 6.0
#: The configurations take turns this many times, each timing budget / ROUNDS seconds of steps.
ROUNDS = 3


def _whole(heavy, cheap, x):
    """A stage run as it is: the heavy layer, then the cheap ones after it."""
    return cheap(heavy(x))


#: Separates a user's model from its input shape in a net name (`model_net`).
_INPUT_SEP = "@"


def model_net(spec: str, chw: tuple[int, int, int]) -> str:
    """The net name of a user's model (`MODULE:CALLABLE`, `models.load`) trained on images of
    `chw` (channels, height, width): `torchvision.models:resnet18@3,224,224`. Everything that
    builds a step from a net name (`build_model`, `example_batch`, `memplan`, `memprofile`'s
    model on `meta`) takes it beside the catalog's nets."""
    return f"{spec}{_INPUT_SEP}{','.join(map(str, chw))}"


def _user_model(net: str) -> tuple[str, tuple[int, ...]] | None:
    spec, sep, chw = net.partition(_INPUT_SEP)
    return (spec, tuple(int(t) for t in chw.split(","))) if sep else None


def input_shape(net: str) -> tuple[int, ...]:
    """(C, H, W) of one image of `net`."""
    user = _user_model(net)
    if user:
        return user[1]
    first = layers.net_layers(net)[0].problem
    return first.c, first.h, first.w


def loss(output, target):
    """The step's loss: cross-entropy against the labels for a classifier's (N, classes)
    output; for any other output (a user's model: a segmentation, features) the mean square,
    so every output element gets a gradient."""
    import torch.nn.functional as F

    if output.dim() == 2:
        return F.cross_entropy(output, target)
    return output.float().pow(2).mean()


def _classes(net: str) -> int:
    """How many classes the labels are drawn from: the model's output width (found on `meta`,
    so nothing is computed), 1 where the output is not (N, classes)."""
    import torch

    if not _user_model(net):
        return CLASSES
    with torch.device("meta"):
        out = build_model(net)(torch.empty(1, *input_shape(net)))
    return out.shape[1] if out.dim() == 2 else 1


def build_model(net: str = "alexnet", fc_free: bool = False):
    """The AlexNet-shaped model of `net`'s catalog: conv layers named as in the catalog, so a
    plan from `convbench advise` of that net's run applies to it by name; or a user's model
    (`model_net`), as its callable returns it (whose forward has no stages: strategies wrap its
    modules instead, `memplan`).

    `fc_free` is the study's variant without fully connected layers: fc6-fc8 become 1x1
    convolutions over the last pooled feature map, and the class scores are averaged over its
    positions. fc6 then sees one position's channels instead of the whole map, which is most
    of AlexNet's parameters (and of the gradient data-parallel training exchanges); fc7 and
    fc8 run at every position, which costs compute.

    Its forward pass is a chain of stages, each a heavy layer (a convolution, a fully connected
    layer) and the cheap ones after it (ReLU, pooling): `forward(x, run)` hands each stage to
    `run(heavy, cheap, x)`, which is how `memplan`'s strategies recompute or offload what a
    stage keeps for backward without a second copy of the network."""
    import torch
    from torch import nn

    user = _user_model(net)
    if user:
        return models.load(user[0])

    class AlexNetShaped(nn.Module):
        def __init__(self):
            super().__init__()
            convs = layers.net_layers(net)
            for layer in convs:
                p = layer.problem
                setattr(self, layer.name, nn.Conv2d(p.c, p.k, (p.r, p.s), (p.stride_h, p.stride_w),
                                                    (p.pad_h, p.pad_w), (p.dil_h, p.dil_w)))
            self.names = [layer.name for layer in convs]
            self.pool = nn.MaxPool2d(3, 2)
            last = convs[-1].problem
            if fc_free:
                self.fc6 = nn.Conv2d(last.k, 4096, 1)
                self.fc7 = nn.Conv2d(4096, 4096, 1)
                self.fc8 = nn.Conv2d(4096, CLASSES, 1)
            else:
                side = (last.p - 3) // 2 + 1
                self.fc6 = nn.Linear(last.k * side * side, 4096)
                self.fc7 = nn.Linear(4096, 4096)
                self.fc8 = nn.Linear(4096, CLASSES)

        def stages(self) -> list[tuple]:
            """(heavy layer, the cheap layers after it) in order."""
            def relu_pool(t):
                return self.pool(torch.relu(t))

            convs = [(getattr(self, name), relu_pool if name in POOLED else torch.relu)
                     for name in self.names]
            if fc_free:
                return [*convs, (self.fc6, torch.relu), (self.fc7, torch.relu),
                        (self.fc8, lambda t: t.mean((2, 3)))]
            return [*convs, (lambda t: self.fc6(torch.flatten(t, 1)), torch.relu),
                    (self.fc7, torch.relu), (self.fc8, lambda t: t)]

        def forward(self, x, run=_whole):
            for heavy, cheap in self.stages():
                x = run(heavy, cheap, x)
            return x

    return AlexNetShaped()


def example_batch(net: str, batch: int, device: str):
    """Seeded images and labels, the same in every process."""
    import torch

    g = torch.Generator().manual_seed(1)
    x = torch.randn(batch, *input_shape(net), generator=g)
    return x.to(device), torch.randint(0, _classes(net), (batch,), generator=g).to(device)


class Trainer:
    """One configuration's model, data and optimizer, ready to step (in this process)."""

    def __init__(self, config: str, net: str, batch: int, device: str,
                 plan_file: str | None = None):
        import torch

        torch.manual_seed(0)
        self.model = build_model(net).to(device)
        self.x, self.target = example_batch(net, batch, device)
        self.backend = backend_of(device)
        torch.backends.cudnn.allow_tf32 = False
        torch.backends.cuda.matmul.allow_tf32 = False
        torch.backends.cudnn.benchmark = config == "cudnn.benchmark"
        self.applied = str(apply.apply(self.model, plan_file)) if config == "plan" else ""
        self.opt = torch.optim.SGD(self.model.parameters(), lr=0.01, momentum=0.9)
        self.first_loss = self.step().item()  # untimed: cuDNN autotunes here

    def step(self):
        import torch.nn.functional as F

        self.opt.zero_grad(set_to_none=True)
        loss = F.cross_entropy(self.model(self.x), self.target)
        loss.backward()
        self.opt.step()
        return loss

    def time(self, budget_s: float) -> list[float]:
        return list(timing.timer_for(self.backend)(self.step, budget_s).times_ms)


class Worker:
    """A `Trainer` in its own Python process (see the module docstring for why), asked for
    timings one round at a time over a pipe: one JSON line per answer."""

    def __init__(self, log, config: str, net: str, batch: int, device: str,
                 plan_file: str | None = None):
        job = {"config": config, "net": net, "batch": batch, "device": device,
               "plan_file": plan_file}
        self.config, self.log = config, log
        self.proc = subprocess.Popen(_command("train", job), stdin=subprocess.PIPE,
                                     stdout=subprocess.PIPE, stderr=self.log, text=True,
                                     env=worker_environment(device))
        self.ready = self._answer()

    def _answer(self) -> dict:
        line = self.proc.stdout.readline()
        if not line:
            self.proc.wait()
            self.log.seek(0)
            tail = (self.log.read().strip().splitlines() or ["no output"])[-1]
            raise RuntimeError(f"train-step {self.config}: worker exited with "
                               f"{self.proc.returncode}: {tail}")
        return json.loads(line)

    def time(self, budget_s: float) -> list[float]:
        self.proc.stdin.write(f"{budget_s}\n")
        self.proc.stdin.flush()
        return self._answer()["times_ms"]

    def __enter__(self):
        return self

    def __exit__(self, *exc) -> None:
        if self.proc.poll() is None:
            self.proc.stdin.close()
            self.proc.wait()


def _command(kind: str, job: dict) -> list[str]:
    return [sys.executable, "-m", "convbench.trainstep", kind, json.dumps(job)]


def worker_environment(device: str) -> dict | None:
    """The environment of the worker processes (tuning, training, memplan's probes): on the CPU,
    idle threads sleep (`threads.CPU_THREAD_ENV`, unless set otherwise), else this one's."""
    return {**CPU_THREAD_ENV, **os.environ} if backend_of(device) == "numpy" else None


def serve(**job) -> None:
    """The worker's side: build the Trainer, say it is ready, then answer each budget read
    from stdin with that round's step times."""
    trainer = Trainer(**job)
    print(json.dumps({"first_loss": trainer.first_loss, "applied": trainer.applied}), flush=True)
    for line in sys.stdin:
        print(json.dumps({"times_ms": trainer.time(float(line))}), flush=True)


def time_configs(net: str, batch: int, device: str, budget_s: float, plan_file: str,
                 log=None) -> list[dict]:
    """Each configuration's step times, in ROUNDS interleaved rounds of `budget_s / ROUNDS`
    seconds, so a change in the machine's load while timing affects all three alike."""
    with contextlib.ExitStack() as stack:
        workers = []
        for config in CONFIGS:  # one at a time: a first step (cuDNN's search) runs alone
            if log:
                log(f"starting {config}")
            stderr = stack.enter_context(tempfile.TemporaryFile(mode="w+"))
            workers.append(stack.enter_context(Worker(stderr, config, net, batch, device,
                                                      plan_file if config == "plan" else None)))
        times: dict[str, list[float]] = {w.config: [] for w in workers}
        for _ in range(ROUNDS):
            for w in workers:
                times[w.config] += w.time(budget_s / ROUNDS)
    rows = []
    for w in workers:
        m = Measurement(tuple(times[w.config]))
        rows.append({"config": w.config, "median_ms": m.median, "iqr_ms": m.iqr,
                     "reps": m.reps, "noisy": m.noisy, **w.ready, "times_ms": list(m.times_ms)})
    return rows


def tune_here(net: str, batch: int, device: str, plan_file: str, budget_s: float | None,
              algos: str, store: str | None) -> None:
    """`tune.tune` on the model, the plan saved to `plan_file`; progress on stderr."""
    x, _ = example_batch(net, batch, device)
    plan = tune.tune(build_model(net).to(device), x, algos=algos, budget_s=budget_s,
                     store=store, log=lambda line: print(f"convbench: {line}", file=sys.stderr))
    plan.save(plan_file)


def compare(net: str, batch: int, device: str, *, budget_s: float = STEP_BUDGET_S,
            tune_budget_s: float | None = None, algos: str = "all", store=None,
            log=None) -> tuple[list[dict], Plan, float]:
    """Tune the model, then time the three configurations; (their rows, the plan, seconds the
    tuning took). Tuning runs in a process of its own too, with the workers' environment: with
    spinning threads, a measurement just after another thread pool's work (torch-cpu after a
    NumPy algorithm) is slowed by that pool's spinning threads, 2-3x for torch-cpu at the small
    budgets used here."""
    registry.expand_algos(algos, backend_of(device))  # a bad list fails here, in one line
    with tempfile.TemporaryDirectory() as tmp:
        plan_file = str(Path(tmp) / "plan.json")
        started = time.monotonic()
        job = {"net": net, "batch": batch, "device": device, "plan_file": plan_file,
               "budget_s": tune_budget_s, "algos": algos,
               "store": None if store is None else str(store)}
        tuned = subprocess.run(_command("tune", job), env=worker_environment(device), check=False)
        if tuned.returncode:
            raise RuntimeError(f"train-step: tuning exited with {tuned.returncode} (its "
                               "error is above)")
        tuning_s = time.monotonic() - started
        plan = Plan.load(plan_file)
        rows = time_configs(net, batch, device, budget_s, plan_file, log)
    return rows, plan, tuning_s


def table(rows: list[dict], backend: str) -> str:
    """The three configurations side by side."""
    base = rows[0]["median_ms"]
    notes = {"cudnn.benchmark": "no effect on the CPU: torch's CPU convolutions never read "
                                "cudnn.benchmark (a control of run-to-run noise)"
             if backend == "numpy" else "cuDNN times its algorithms on the first step",
             "plan": "advisor.tune + advisor.apply (the plan below)"}
    body = [[r["config"], ("~" if r["noisy"] else "") + fmt_ms(r["median_ms"]),
             fmt_ms(r["iqr_ms"]), r["reps"], f"{base / r['median_ms']:.2f}x",
             f"{r['first_loss']:.6f}", notes.get(r["config"], "torch as installed")]
            for r in rows]
    return tabulate(body, headers=["configuration", "ms/step", "IQR ms", "steps", "speed-up",
                                   "first-step loss", "note"],
                    tablefmt="github", disable_numparse=True)


def markdown(rows: list[dict], plan: Plan, net: str, batch: int, device_name: str,
             backend: str, tuning_s: float, default_batch: bool) -> str:
    """The report: what was timed, the table, and the plan as applied."""
    first = layers.net_layers(net)[0].problem
    why = (" (the CPU default, so the run ends in about three minutes; the study used 256)"
           if backend == "numpy" and default_batch else "")
    facts = [f"batch {batch}{why}, {first.c}x{first.h}x{first.w} images, fp32 (TF32 off)",
             ("step: forward, cross-entropy loss, backward, SGD (momentum 0.9) update; no "
              "dropout; each configuration in its own process, with the same weights and data")]
    if backend == "numpy":
        facts.append("every process runs with " + " ".join(
            f"{k}={os.environ.get(k, v)}" for k, v in CPU_THREAD_ENV.items())
            + " (idle threads sleep: NumPy's BLAS threads and torch's share the cores)")
    facts.append(f"tuning took {tuning_s:.0f} s; the plan rests on {len(plan.measurements)} "
                 "measurements (plan-store hits included)")
    return "\n".join([f"# train-step: {net} on {device_name}", "",
                      *[f"- {f}" for f in facts], "", table(rows, backend), "",
                      "## The plan as applied", "", rows[-1]["applied"]])


def write(folder: str | Path, rows: list[dict], plan: Plan, text: str, env: dict,
          meta: dict) -> None:
    """The run folder of a train-step: trainstep.csv (a row per configuration),
    trainstep.json (`meta`, how it was asked for, and the rows with their raw times),
    trainstep.md (`text`), env.json and plan.json."""
    out = Path(folder)
    out.mkdir(parents=True, exist_ok=True)
    (out / "trainstep.csv").write_text(results.to_csv(summary_frame(rows)))
    (out / "trainstep.json").write_text(json.dumps({**meta, "rows": rows}, indent=1) + "\n")
    (out / "trainstep.md").write_text(text + "\n")
    (out / results.ENV_JSON).write_text(json.dumps(env, indent=1) + "\n")
    plan.save(out / "plan.json")


def summary_frame(rows: list[dict]) -> pd.DataFrame:
    """The configurations' rows without the raw times and the applied-plan text."""
    return pd.DataFrame(rows).drop(columns=["applied", "times_ms"])


if __name__ == "__main__":  # a process of compare's: `tune JOB` or `train JOB`
    {"tune": tune_here, "train": serve}[sys.argv[1]](**json.loads(sys.argv[2]))
