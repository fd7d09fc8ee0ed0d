"""`convbench scale`: the training step under DistributedDataParallel per world size, batch and
communication hook (`convbench.studies.scale` measures, `scale_report` writes).

    convbench scale --device cpu --world-sizes 1,2
    convbench scale --device cuda --world-sizes 1,2,4 --batch 128,256,512
    torchrun --nnodes 2 --nproc-per-node 8 --rdzv-backend c10d --rdzv-endpoint HOST:PORT \\
        -m convbench scale --device cuda

Under torchrun every rank runs this command; rank 0 alone writes the folder and prints.
"""

from __future__ import annotations

import sys
from pathlib import Path

import pandas as pd

from .. import runs
from ..machine.devices import backend_of, default_device
from ..measure import envinfo
from ..studies import scale, scale_report
from ..studies.workload import VARIANTS, Workload
from .common import (
    batches,
    command_line,
    counts,
    device_option,
    emit,
    positive,
    study_output_options,
    usage_errors,
)


def job_from(args) -> scale.Job:
    """The job the options ask for, checked here (`scale.check_job`); UsageError naming what
    is wrong."""

    device = args.device or default_device()  # the one default of every command
    with usage_errors():
        hooks = scale.parse_hooks(args.hooks)
        per_rank = args.per_rank_batch is not None
        batches = args.per_rank_batch or args.batch or (
            scale.GPU_BATCHES if device == "cuda" else scale.CPU_BATCHES)
        job = scale.Job(Workload.parse(args.net), device,
                        tuple(args.world_sizes or scale.default_world_sizes(device)),
                        tuple(batches), hooks, args.steps or scale.STEPS[device], args.warmup,
                        args.powersgd_rank, per_rank)
        scale.check_job(job)
    return job


def cmd_scale(args) -> int:
    job = job_from(args)
    result = scale.run(job)
    if result is None:  # a rank of torchrun's other than 0: rank 0 writes and prints
        return 0
    backend = backend_of(job.device)
    env = envinfo.collect(backend)
    env["run"] = {**result.run_info(), "command": command_line(args)}
    text = scale_report.markdown(result, env)
    folder = Path(args.out) if args.out else runs.default_folder(args.net, backend, "-scale")
    written = scale_report.write(folder, text, result, env, f"{args.net} on {env['device']}")
    print(f"convbench: {', '.join(written)} in {folder}", file=sys.stderr)
    emit(pd.DataFrame(result.rows), args.format, text.rstrip("\n"), result.rows)
    return 0


def add_parsers(sub) -> None:
    p = sub.add_parser("scale", help="data-parallel training step (DDP on torch.distributed) "
                       "per world size, batch and communication hook")
    p.add_argument("--net", default="alexnet", choices=VARIANTS,
                   help="the training-step model; -fcfree: fc6-fc8 as 1x1 convolutions "
                        "(default alexnet)")
    device_option(p, "cuda: a GPU per rank, NCCL; cpu: a core per rank, gloo (default cuda "
                     "where a GPU is, else cpu)")
    p.add_argument("--world-sizes", type=counts("world sizes"),
                   help="comma list of rank counts (default 1, 2, 4, ... up to the GPUs or "
                        "cores here, or the ranks torchrun started)")
    batch = p.add_mutually_exclusive_group()
    batch.add_argument("--batch", type=batches,
                       help="comma list of global batches, split over the ranks (default "
                            f"{','.join(map(str, scale.GPU_BATCHES))} on cuda, "
                            f"{','.join(map(str, scale.CPU_BATCHES))} on cpu)")
    batch.add_argument("--per-rank-batch", type=batches,
                       help="comma list of batches per rank instead (the global batch grows "
                            "with the ranks)")
    p.add_argument("--hooks", default=",".join(scale.HOOKS),
                   help=f"comma list of {', '.join(scale.HOOKS)} (allreduce, the exact "
                        "baseline, is always measured; default all)")
    p.add_argument("--powersgd-rank", type=positive(int), default=scale.POWERSGD_RANK,
                   help="rank of PowerSGD's approximation (default %(default)s)")
    p.add_argument("--steps", type=positive(int),
                   help=f"timed steps per measurement (default {scale.STEPS['cuda']} on cuda, "
                        f"{scale.STEPS['cpu']} on cpu)")
    p.add_argument("--warmup", type=positive(int), default=scale.WARMUP,
                   help="untimed steps first (default %(default)s)")
    study_output_options(p, "scale", "speedup.png, timeline.png", always=True)
    p.set_defaults(func=cmd_scale)
