"""A sweep sharded over the ranks torchrun starts, each on its own GPU, into one run folder.

    torchrun --nproc-per-node 4 -m convbench bench --device cuda --out my-runs/my-run
    torchrun --nnodes 2 --nproc-per-node 8 --rdzv-backend c10d --rdzv-endpoint HOST:PORT \\
        -m convbench bench --device cuda --out my-runs/my-run

Every rank builds the same list of cases, drops those the run folder already holds, and takes
every world-size-th of the rest from its rank on (round robin: consecutive cases, often the
same layer and pass with another algorithm, go to different ranks, which spreads the slow layers
evenly). Each rank streams its rows into a partial file of its own in the run folder
(`results.partial_csv`, as `CsvSink` streams measurements.csv), so a rank that dies loses only
the case it was measuring. At the end the ranks send their rows to rank 0 (torch.distributed,
gloo), which alone writes measurements.csv — the rows of the folder, of the partial files it
sees and of the ranks, one per case, in the order of the unsharded sweep — and the report.

After an interruption (a rank killed, and torchrun stopping the others), `--resume` merges the
partial files first: each rank sends rank 0 the rows of the partial files it can see, so the
folder need not be shared between nodes, and then the cases still missing are shared out
again. Rows are the unsharded run's (the same columns and values, times apart).

A batch sweep skips the larger batches of a series that ran out of memory only within a rank:
another rank may still try one.
"""

from __future__ import annotations

import dataclasses
import datetime
import os
from dataclasses import dataclass
from pathlib import Path

from ..analysis import report
from ..core import results
from ..core.results import CsvSink, Row, RunFolder, frame, load_run, row_key
from ..core.runspec import RunSpec
from ..measure import runner
from . import run

#: How long a rank waits for the others: at the end, the fastest waits for the slowest.
TIMEOUT = datetime.timedelta(hours=24)


@dataclass(frozen=True)
class Shard:
    """This process's place among the ranks: rank `rank` of `world`."""

    rank: int
    world: int

    def share(self, cases: list) -> list:
        """This rank's cases: every world-th, from its rank on."""
        return cases[self.rank::self.world]

    def gather(self, obj) -> list | None:
        """Every rank's `obj` on rank 0 (in rank order), None elsewhere."""
        import torch.distributed as dist

        out = [None] * self.world if self.rank == 0 else None
        dist.gather_object(obj, out, dst=0)
        return out

    def broadcast(self, obj):
        """Rank 0's `obj` on every rank."""
        import torch.distributed as dist

        box = [obj]
        dist.broadcast_object_list(box, src=0)
        return box[0]

    def barrier(self) -> None:
        import torch.distributed as dist

        dist.barrier()

    def open(self, path: str | Path, env: dict, resume: bool = False) -> RunFolder:
        """`RunFolder.open` on rank 0, after merging every rank's partial files, with the same
        errors on every rank; each rank's rows then go to its own partial file."""
        path = Path(path)
        seen = self.gather(results.partial_rows(path))
        answer = None
        if self.rank == 0:
            try:
                results.merge_rows(path, [r for rows in seen for r in rows])
                env = {**env, "run": {**env.get("run", {}), "ranks": self.world}}
                folder = RunFolder.open(path, env, resume)
                answer = (None, folder.env, folder.measured)
            except ValueError as exc:  # FolderInUse too: every rank raises it
                answer = (exc, None, None)
        error, env, measured = self.broadcast(answer)
        if error is not None:
            raise error
        results.drop_partials(path)  # merged: what this rank saw is in measurements.csv
        self.barrier()  # no rank writes a partial file before every rank has dropped the old
        return RunFolder(path, env, measured, CsvSink(results.partial_csv(path, self.rank)))


def _env_int(name: str, default: int) -> int:
    text = os.environ.get(name, str(default))
    try:
        return int(text)
    except ValueError:
        raise ValueError(f"{name}={text!r} is not an integer (torchrun sets it)") from None


def _gpu_count() -> int:
    import cupy

    return cupy.cuda.runtime.getDeviceCount()


def from_env(backend: str) -> Shard | None:
    """This rank's Shard when torchrun started several ranks (its environment says so), with
    the process group joined (gloo) and, on `cuda`, the GPU of its local rank selected; else
    None: an unsharded run, no process group. ValueError, in one line, for an environment that
    cannot be: a rank variable that is not an integer, a local rank without a GPU of its own."""
    world = _env_int("WORLD_SIZE", 1)
    if world <= 1:
        return None
    local = _env_int("LOCAL_RANK", 0)
    if backend == "cuda":
        gpus = _gpu_count()
        if not 0 <= local < gpus:
            raise ValueError(f"LOCAL_RANK={local}, but this node has {gpus} GPU(s): start at "
                             "most one rank per GPU (torchrun --nproc-per-node)")
    elif local < 0:
        raise ValueError(f"LOCAL_RANK={local} is negative")
    import torch.distributed as dist

    if backend == "cuda":
        import cupy
        import torch

        cupy.cuda.Device(local).use()
        torch.cuda.set_device(local)
    if not dist.is_initialized():
        dist.init_process_group("gloo", timeout=TIMEOUT)
    return Shard(dist.get_rank(), world)


def follower() -> bool:
    """Whether this process is a rank other than 0 of a sharded run (torchrun's environment
    says so), known before the process group is joined: rank 0 alone says what the run chose,
    found and took, so a sweep over N ranks reads as one run, not N."""
    return _env_int("WORLD_SIZE", 1) > 1 and _env_int("RANK", 0) > 0


def host_threads(shard: Shard | None, cores: int) -> int | None:
    """Host threads per rank: the ranks on one node (LOCAL_WORLD_SIZE) share its `cores`, so
    each rank's float64 references and CPU algorithms use its share, not every core each; None
    for an unsharded run (the thread policy's own default)."""
    if shard is None:
        return None
    local = _env_int("LOCAL_WORLD_SIZE", shard.world)
    return max(1, cores // max(1, local))


class Run(run.Run):
    """`run.Run` over this rank's share of the cases left; rank 0 writes the folder at the end.
    `todo` is this rank's share; only rank 0 reports progress (`on_row`)."""

    def __init__(self, shard: Shard, spec: RunSpec, cases: list,
                 folder: RunFolder | None = None):
        super().__init__(spec, cases, folder)
        self.shard, self.order = shard, [c.key() for c in cases]
        # competing cases stay together, so they are timed side by side on one rank
        self.todo = [c for group in shard.share(list(runner.competing(self.todo))) for c in group]

    def measure(self, on_row=None) -> run.Outcome:
        return super().measure(on_row if self.shard.rank == 0 else None)

    def finish(self, rows: list[Row], interrupted: bool, fault: str | None) -> run.Outcome:
        """Every rank's rows to rank 0, which merges them into the folder and writes its
        report; the others keep their own rows. Rank 0's seconds run to the end of all that,
        so they cover the slowest rank's share too. The process group ends here."""
        import torch.distributed as dist

        mine = run.Outcome(frame(rows), None, interrupted, self._skip.skipped, fault,
                            rows, self.seconds())
        outcomes = self.shard.gather((rows, interrupted, self._skip.skipped, fault))
        if self.shard.rank == 0:
            everything = [r for o in outcomes for r in o[0]]
            mine = dataclasses.replace(
                mine, rows=everything, interrupted=any(o[1] for o in outcomes),
                skipped=sum(o[2] for o in outcomes),
                fault="; ".join(o[3] for o in outcomes if o[3]) or None)
            if self.folder is None:
                rank = {key: i for i, key in enumerate(self.order)}
                mine.frame = frame(sorted(everything, key=lambda r: rank[row_key(r)]))
            else:
                results.merge_rows(self.folder.path, everything, self.order)
                mine.frame, _ = load_run(self.folder.path)
                self.note_load("end")
                mine.report = report.write(self.folder.path, mine.frame, self.folder.env)
            mine.seconds = self.seconds()  # after the slowest rank's rows came in
        self.shard.barrier()
        if self.folder is not None:
            results.drop_partials(self.folder.path)  # rank 0 has them all now
        dist.destroy_process_group()
        return mine
