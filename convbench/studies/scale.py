"""`convbench scale`: data-parallel training on several GPUs or nodes, the study's slides 25-28.

Kim et al. trained AlexNet data-parallel on up to four GPUs: the gradient exchange sits on the
critical path, so small batches ran slower on several GPUs than on one and even batch 512
reached only ~1.5x on four; overlapping each layer's transfer with the rest of the backward pass
helped, and so did sending less (CNTK's 1-bit SGD; the fully connected layers hold ~90% of
AlexNet's parameters). This measures the same on today's engine: the training step of
`trainstep.build_model` (forward, cross-entropy, backward, SGD with momentum) under torch's
`DistributedDataParallel`, over `torch.distributed` (NCCL between GPUs, gloo on CPUs), for each
world size and global batch asked (each rank takes batch / world size of the same seeded images).

Ranks: under `torchrun` (any number of nodes, its own rendezvous) this process is one rank of
the group torchrun made; otherwise one node's ranks are started through torch's launcher API
(`elastic_launch`, what `torchrun --standalone` runs). Every smaller world size is measured as
the subgroup of the first ranks (the others wait), so one launch measures them all. On the CPU
every rank computes on one thread (a rank is a core, as a GPU is on a GPU machine) with idle
threads sleeping (`threads.CPU_THREAD_ENV`).

Per world size, batch and communication hook, on a model of its own (the same seeded weights):

- `step`: DDP's step as it runs, each bucket's exchange launched when its gradients are ready,
  overlapping the rest of the backward pass;
- `serial`: the same step with the hook waiting for each bucket's exchange before backward goes
  on (and the GPU synchronized around it): nothing overlaps, as if the exchange ran after the
  backward pass; the time between a bucket's ready and its exchange's end, summed over the
  buckets, is `exchange`, the exchange alone;
- `compute` (with the exact all-reduce only): the step under `no_sync()`, no exchange at all.

A step's time is the slowest rank's (ranks meet at a barrier before each step), after warm-up
steps; median and spread over the timed steps (`Measurement`). The share of the exchange the
overlap hid is (compute + exchange - step) / exchange, clamped to [0, 1]: 1 when the step takes
no longer than its compute, 0 when it takes as long as compute and exchange one after the
other. Speedup is the one-rank step's time over the N-rank step's at the same global batch;
efficiency is speedup / N.

Hooks (`torch.distributed.algorithms.ddp_comm_hooks`): `allreduce`, the exact average
(`default_hooks.allreduce_hook`); `fp16` and `bf16`, the gradient compressed to 16 bits for the
exchange; `powersgd`, PowerSGD's low-rank approximation with error feedback, today's counterpart
of 1-bit SGD (its first `POWERSGD_START` iterations are exact all-reduces, so the warm-up
covers them). Each hook's gradient error is ‖g − g_exact‖ / ‖g_exact‖ of the averaged gradient
of one step against the exact all-reduce's, on the same weights and data, at its first
compressed step (PowerSGD's error feedback then holds nothing yet: what it carries into later
steps is not counted). Gradient bytes are the model's parameters' (fp32); the fully connected
share counts fc6-fc8, whether `nn.Linear` or the FC-free variant's 1x1 convolutions.

This module measures; `scale_report` writes the study's folder from the `ScaleResult`.
"""

from __future__ import annotations

import functools
import gc
import os
from dataclasses import dataclass, field

from ..core.measurement import Measurement
from . import ddp
from .ddp import (
    POWERSGD_START,
    RankTrainer,
    devices_here,
    interconnect,
    launch,
    launched,
    process_group,
    rank_info,
)
from .workload import Workload

HOOKS = ("allreduce", "fp16", "bf16", "powersgd")
KINDS = ("compute", "exchange", "serial", "step")
#: The layers counted as fully connected, whichever form they take.
FC_LAYERS = ("fc6", "fc7", "fc8")
#: Global batches: the study's on a GPU; on the CPU so small that `convbench scale --device
#: cpu --world-sizes 1,2` ends within about five minutes on 2 cores.
GPU_BATCHES = (128, 256, 512)
CPU_BATCHES = (2, 4)
#: Timed steps per measurement and warm-up steps before them (the first builds DDP's buckets).
STEPS = {"cpu": 5, "cuda": 20}
WARMUP = 3
#: PowerSGD: the rank of its approximation unless told otherwise.
POWERSGD_RANK = 4
#: PowerSGD compresses a gradient only when that shrinks it at least this many times (its
#: default `min_compression_rate`, which the hook is run with).
POWERSGD_MIN_RATE = 2


# --- what is trained --------------------------------------------------------------------------
def gradient_bytes(model) -> dict[str, int]:
    """Bytes of fp32 gradient per step, split into the conv layers' and the fully connected
    ones' (`FC_LAYERS`)."""
    out = {"conv": 0, "fc": 0}
    for name, p in model.named_parameters():
        out["fc" if name.split(".")[0] in FC_LAYERS else "conv"] += p.numel() * 4
    return out


def exchanged_bytes(model, hook: str, powersgd_rank: int = POWERSGD_RANK) -> int:
    """Bytes each rank hands the all-reduce per step under `hook`: the fp32 gradient, half of
    it in 16 bits, or PowerSGD's factors (P and Q, n·r and m·r for each n×m gradient it finds
    worth compressing, by its own `_should_compress`; the rest as is)."""
    from torch.distributed.algorithms.ddp_comm_hooks import powerSGD_hook

    total = sum(p.numel() for p in model.parameters()) * 4
    if hook != "powersgd":
        return total // 2 if hook in ("fp16", "bf16") else total
    out = 0
    for p in model.parameters():
        n = p.shape[0]
        m = p.numel() // n
        r = min(n, m, powersgd_rank)
        compress, whole, factors = powerSGD_hook._should_compress(n, m, r, POWERSGD_MIN_RATE)
        out += 4 * (factors if compress else whole)
    return out


def on_meta(load: Workload):
    """The workload's model without storage: enough to count its parameters."""
    import torch

    with torch.device("meta"):
        return load.build()


# --- the job ----------------------------------------------------------------------------------
@dataclass(frozen=True)
class Job:
    """What to measure: every world size × batch × hook. A batch is the global batch, split
    over the ranks as in the study, or with `per_rank` each rank's."""

    load: Workload
    device: str
    world_sizes: tuple[int, ...]
    batches: tuple[int, ...]
    hooks: tuple[str, ...] = HOOKS
    steps: int = STEPS["cpu"]
    warmup: int = WARMUP
    powersgd_rank: int = POWERSGD_RANK
    per_rank: bool = False

    def global_batch(self, world: int, batch: int) -> int:
        return batch * world if self.per_rank else batch

    def hooks_at(self, world: int) -> tuple[str, ...]:
        """One rank exchanges nothing: only the exact all-reduce, the baseline, is timed."""
        return ("allreduce",) if world == 1 else self.hooks


def parse_hooks(text: str) -> tuple[str, ...]:
    """`allreduce,powersgd` -> the hooks, `allreduce` (the baseline) always first; ValueError
    naming an unknown one."""
    items = [t.strip() for t in text.split(",") if t.strip()]
    for item in items:
        if item not in HOOKS:
            raise ValueError(f"unknown hook {item!r}; valid: {', '.join(HOOKS)}")
    return tuple(dict.fromkeys(["allreduce", *items]))


def default_world_sizes(device: str) -> tuple[int, ...]:
    """1, 2, 4, ... up to the ranks torchrun started, or the devices of this node."""
    most = int(os.environ["WORLD_SIZE"]) if launched() else devices_here(device)
    sizes = [1 << i for i in range(most.bit_length()) if 1 << i <= most]
    return tuple(dict.fromkeys([*sizes, most]))


def check_job(job: Job) -> None:
    """ValueError, in one line, for a job that cannot run here: a world size beyond the ranks
    torchrun started or the devices of this node, a global batch that does not split evenly."""
    if job.device == "cuda" and devices_here("cuda") == 0:
        raise ValueError("--device cuda: torch sees no GPU here")
    largest = max(job.world_sizes)
    if launched():
        started = int(os.environ["WORLD_SIZE"])
        if largest > started:
            raise ValueError(f"world size {largest} is larger than the {started} ranks torchrun "
                             "started")
        local = int(os.environ.get("LOCAL_WORLD_SIZE", started))
        if job.device == "cuda" and local > devices_here("cuda"):
            raise ValueError(f"torchrun started {local} ranks on this node, which has "
                             f"{devices_here('cuda')} GPUs")
    elif largest > devices_here(job.device):
        what = "GPUs" if job.device == "cuda" else "CPU cores"
        raise ValueError(f"world size {largest} is larger than the {devices_here(job.device)} "
                         f"{what} here (several nodes: start it with torchrun)")
    for batch in () if job.per_rank else job.batches:
        for world in job.world_sizes:
            if batch % world:
                raise ValueError(f"global batch {batch} does not split evenly over "
                                 f"{world} ranks")


def measure_point(job: Job, world: int, batch: int, group, barrier, rank: int) -> list[dict]:
    """This rank's records at one world size and global batch: per hook, the step's times in
    each mode (and the exchange's), the gradient error; the compute alone and a timeline with
    the exact all-reduce, and on rank 0 its gradient against one process's."""
    whole = job.load.example_batch(batch, job.device)
    share = batch // world
    x, y = (t[rank * share:(rank + 1) * share] for t in whole)
    at = {"world_size": world, "batch": batch, "rank": rank}
    out = []
    for hook in job.hooks_at(world):
        trainer = RankTrainer(job.load, job.device, hook, job.powersgd_rank, group, x, y)
        if world > 1:
            out.append({**at, "hook": hook, "kind": "error",
                        "value": trainer.gradient_error()})
            if hook == "allreduce" and rank == 0:
                out.append({**at, "hook": hook, "kind": "one_process",
                            "value": trainer.against_one_process(*whole)})
        for _ in range(job.warmup):
            trainer.step()
        out.append({**at, "hook": hook, "kind": "step",
                    "times_ms": trainer.times(trainer.step, job.steps, barrier)})
        serial, spent = trainer.serial_times(job.steps, barrier)
        out += [{**at, "hook": hook, "kind": "serial", "times_ms": serial},
                {**at, "hook": hook, "kind": "exchange", "times_ms": spent}]
        if hook == "allreduce":
            out.append({**at, "hook": "none", "kind": "compute",
                        "times_ms": trainer.times(trainer.compute_step, job.steps, barrier)})
            out.append({**at, "hook": hook, "kind": "timeline",
                        "value": trainer.timeline(barrier)})
        del trainer
        gc.collect()  # DDP's reducer holds cycles: free this model's memory before the next
    return out


def rank_main(job: Job, launcher: str) -> ScaleResult | None:
    """One rank's whole run: join the group (torchrun's or the launcher's, from the
    environment), measure every world size whose subgroup holds this rank, send the records to
    rank 0; rank 0 returns the ScaleResult, the others None."""
    import torch.distributed as dist

    cuda = job.device == "cuda"
    with process_group(job.device) as backend:
        rank = dist.get_rank()
        ctl = dist.new_group(backend="gloo", timeout=ddp.TIMEOUT) if cuda else dist.group.WORLD
        records = []
        for world in job.world_sizes:  # every rank creates every subgroup, in the same order
            ranks = list(range(world))
            group = dist.new_group(ranks, timeout=ddp.TIMEOUT)
            sub = dist.new_group(ranks, backend="gloo", timeout=ddp.TIMEOUT) if cuda else group
            if rank < world:
                for batch in job.batches:
                    records += measure_point(job, world, job.global_batch(world, batch), group,
                                             functools.partial(dist.barrier, group=sub), rank)
            dist.barrier(group=ctl)
        gathered = [None] * dist.get_world_size() if rank == 0 else None
        dist.gather_object((records, rank_info(job.device)), gathered, dst=0, group=ctl)
        if rank:
            return None
        return ScaleResult(job, [r for recs, _ in gathered for r in recs],
                           [info for _, info in gathered], interconnect(backend), launcher)


def run(job: Job) -> ScaleResult | None:
    """Measure `job`: as this rank of torchrun's group (None on every rank but 0), or on
    max(world sizes) ranks of this node started through torch's launcher API."""
    check_job(job)
    if launched():
        return rank_main(job, "torchrun")
    return launch(max(job.world_sizes), rank_main, job,
                  "torch's launcher API (elastic_launch), one node")


# --- the records, summed up -------------------------------------------------------------------
@dataclass
class ScaleResult:
    """Every rank's records, where each rank ran, the interconnect, how it was launched."""

    job: Job
    records: list[dict]
    ranks: list[dict]
    interconnect: dict
    launcher: str
    rows: list[dict] = field(init=False)

    def __post_init__(self):
        self.rows = summarize(self.job, self.records)

    @property
    def nodes(self) -> int:
        return len({r["host"] for r in self.ranks})

    def timelines(self) -> dict[tuple[int, int], dict]:
        """Rank 0's timeline per (world size, batch)."""
        return {(r["world_size"], r["batch"]): r["value"] for r in self.records
                if r["kind"] == "timeline" and r["rank"] == 0}

    def run_info(self) -> dict:
        """env.json's "run": how the run was asked for and what it ran on."""
        job = self.job
        return {"net": job.load.name, "device": job.device, "world_sizes": list(job.world_sizes),
                "batches": list(job.batches), "hooks": list(job.hooks), "steps": job.steps,
                "warmup": job.warmup, "powersgd_rank": job.powersgd_rank,
                "powersgd_start_iter": POWERSGD_START, "launcher": self.launcher,
                "threads_per_rank": 1 if job.device == "cpu" else None,
                "nodes": self.nodes, "hosts": sorted({r["host"] for r in self.ranks}),
                "ranks": self.ranks, "interconnect": self.interconnect}


def _slowest(records: list[dict]) -> list[float]:
    """Per step, the slowest rank's time."""
    return [max(steps) for steps in zip(*(r["times_ms"] for r in records))]


def summarize(job: Job, records: list[dict]) -> list[dict]:
    """One row per world size × batch × hook × kind: the slowest rank's times, and on `step`
    rows images/s, speedup and efficiency against one rank, the share of the exchange hidden,
    the bytes exchanged and the gradient error. Speedup is images/s over one rank's at the same
    batch option: the same global batch (the study's strong scaling: the ratio of step times),
    or with `per_rank` the same batch per rank."""
    model = on_meta(job.load)
    groups: dict[tuple, list[dict]] = {}
    for r in records:
        if "times_ms" in r:
            groups.setdefault((r["world_size"], r["batch"], r["hook"], r["kind"]), []).append(r)
    medians = {key: Measurement(tuple(_slowest(recs))) for key, recs in groups.items()}
    errors = {(r["world_size"], r["batch"], r["hook"], r["kind"]): r["value"] for r in records
              if r["kind"] in ("error", "one_process") and r["rank"] == 0}
    rows = []
    for (world, batch, hook, kind), m in medians.items():
        row = {"net": job.load.name, "world_size": world, "batch": batch,
               "rank_batch": batch // world, "hook": hook, "kind": kind,
               "median_ms": m.median, "iqr_ms": m.iqr, "min_ms": m.min, "reps": m.reps,
               "noisy": m.noisy, "images_per_s": None, "speedup": None, "efficiency": None,
               "hidden_share": None, "exchanged_bytes": None, "gradient_error": None,
               "one_process_error": None, "times_ms": m.times_text()}
        if kind in ("exchange", "step"):
            row["exchanged_bytes"] = exchanged_bytes(model, hook, job.powersgd_rank)
        if kind == "step":
            base = medians.get((1, batch // world if job.per_rank else batch, "allreduce",
                                "step"))
            compute = medians.get((world, batch, "none", "compute"))
            exchange = medians.get((world, batch, hook, "exchange"))
            row.update(images_per_s=batch / m.median * 1e3,
                       gradient_error=errors.get((world, batch, hook, "error")),
                       one_process_error=errors.get((world, batch, hook, "one_process")))
            if base:
                speedup = row["images_per_s"] / (row["batch"] // (world if job.per_rank else 1)
                                                 / base.median * 1e3)
                row.update(speedup=speedup, efficiency=speedup / world)
            if world > 1 and compute and exchange and exchange.median > 0:
                hidden = (compute.median + exchange.median - m.median) / exchange.median
                row["hidden_share"] = min(1.0, max(0.0, hidden))
        rows.append(row)
    order = {k: i for i, k in enumerate(KINDS)}
    hooks = {h: i for i, h in enumerate(("none", *HOOKS))}
    return sorted(rows, key=lambda r: (r["world_size"], r["batch"], hooks[r["hook"]],
                                       order[r["kind"]]))
