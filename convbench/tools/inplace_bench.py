"""What a replaced layer pays in place beyond its measured passes: a benchmark, not a test.

    python -m convbench.tools.inplace_bench --layers alexnet:conv3 n=2,c=32,h=14,w=14,k=32,r=3,s=3,pad=1

For each layer and algorithm, three contenders are timed interleaved in rounds
(`timing.time_rounds`, so drifting load falls on all three), each a layer's whole training work,
forward then both gradients:

- `torch`: torch's own `nn.Conv2d` through autograd, the way a model calls it;
- `alone`: the algorithm's three prepared passes called on arrays, what `tune` measures;
- `in place`: `convbench.nn.Conv2d` running the same three passes through autograd, what a
  model with the plan runs.

`in place − alone` is the per-call overhead of a replaced layer (the module and autograd
Function, the tensor/array hand-offs, the allocation of each result); `in place / torch` is what
the replacement gains or loses in place. Every pass is first checked against torch's in float64
terms (`verify.tolerance`). On the CPU run it with idle threads sleeping
(`threads.CPU_THREAD_ENV`), as `apply` asks of training code.
"""

from __future__ import annotations

import argparse
import contextlib
import sys

import numpy as np

from ..algos import registry
from ..catalogs import layers as catalogs
from ..core import stats
from ..core.fmt import tabulate
from ..core.problem import PASSES
from ..measure import timing


def contenders(problem, algo: str):
    """(torch's step, the passes alone, the replaced layer's step) for `problem` by `algo`, on
    the CPU, fp32; each runs forward and both gradients."""
    import torch

    from .. import functional
    from .. import nn as cbnn

    conv = torch.nn.Conv2d(problem.c, problem.k, (problem.r, problem.s), bias=False,
                           **problem.torch_args())
    ours = cbnn.Conv2d.from_conv(conv, "nchw", {p: (algo, "numpy") for p in PASSES})
    x = torch.randn(*problem.x_shape(), requires_grad=True)
    dy = torch.randn(*problem.y_shape())

    def step(module):
        def run() -> None:
            x.grad = module.weight.grad = None
            module(x).backward(dy)
        return run

    xa, wa, dya = (t.detach().numpy() for t in (x, conv.weight, dy))
    outs = {p: np.empty(problem.operand_shapes(p, "nchw")[2], np.float32) for p in PASSES}
    operands = {"fwd": (xa, wa), "bwd_data": (dya, wa), "bwd_filter": (xa, dya)}

    fns = {p: functional._prepared(algo, "numpy", problem, p, "nchw", "fp32", None)
           for p in PASSES}

    def alone() -> None:  # as the runner times a pass: the prepared call, then its forget
        for p in PASSES:
            fns[p](*operands[p], outs[p])
            getattr(fns[p], "forget", lambda: None)()

    return step(conv), alone, step(ours)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m convbench.tools.inplace_bench",
                                description=__doc__.split("\n\n")[0])
    p.add_argument("--layers", nargs="+", default=["alexnet:conv3", "alexnet:conv5"],
                   help="layers: net:layer or text specs (n=2,c=32,...), space-separated")
    p.add_argument("--algos", default="gemm,winograd-4x4,direct", help="comma list of algos")
    p.add_argument("--batch", type=int, default=2)
    p.add_argument("--cold", action="store_true",
                   help="each repetition from cold caches (`timing.cold_caches`)")
    p.add_argument("--budget", type=float, default=1.0,
                   help="seconds of timed repetitions per contender (default %(default)s)")
    args = p.parse_args(argv)
    try:
        chosen = [catalogs.resolve(s, "alexnet") for s in args.layers]
        algos = registry.expand_algos(args.algos, "numpy")
    except ValueError as exc:
        print(f"inplace_bench: error: {exc}", file=sys.stderr)
        return 2
    rows = []
    for layer in chosen:
        problem = layer.problem.with_batch(args.batch)
        for algo in algos:
            impl = registry.get(algo, "numpy")
            why = next((w for pass_ in PASSES if (w := registry.supports(
                impl, problem, pass_, "nchw", "fp32"))), None)
            if why:
                rows.append([layer.name, algo, "", "", "", "", "", f"unsupported: {why}"])
                continue
            torch_step, alone, in_place = contenders(problem, algo)
            with timing.cold_caches() if args.cold else contextlib.nullcontext():
                t_torch, t_alone, t_in = (t.total for t in timing.time_rounds(
                    [timing.Contender.call(f) for f in (torch_step, alone, in_place)],
                    args.budget, "numpy"))
            n = min(len(t_torch.times_ms), len(t_in.times_ms), len(t_alone.times_ms))
            over = stats.ratio(t_in.times_ms[:n], t_torch.times_ms[:n], paired=True)
            rows.append([layer.name, algo, f"{t_torch.median:.4g}", f"{t_alone.median:.4g}",
                         f"{t_in.median:.4g}", f"{t_in.median - t_alone.median:+.3g}",
                         over.text(), ""])
    print(tabulate(rows, headers=["layer", "algo", "torch ms", "alone ms", "in place ms",
                                  "in place − alone ms", "in place / torch", "note"],
                   tablefmt="github", disable_numparse=True))
    print(f"batch {args.batch}, fp32, forward and both gradients per call; medians of "
          f"{args.budget:g} s of interleaved rounds", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
