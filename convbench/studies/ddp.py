"""The data-parallel machinery `scale` measures with, apart from the job and its summary:
ranks and their process group (`torchrun`'s, or one node's through torch's launcher API), where
a rank's work is timed (`Clock`), the communication hooks (`comm_hook`), the hook DDP calls
wrapped so its exchange can be waited for and timed or stamped (`Exchange`, whose modes are
context managers), and one rank's DDP training step of a workload (`RankTrainer`).
"""

from __future__ import annotations

import contextlib
import datetime
import functools
import os
import socket
import time
import uuid
from collections.abc import Callable

from ..machine.host import cpu_model
from .workload import Workload

#: PowerSGD: exact all-reduces before compressing (it refuses fewer than 2 with error
#: feedback).
POWERSGD_START = 2
#: Instrumented steps per timeline; the one with the median time is drawn.
TIMELINE_STEPS = 3
#: How long a rank may wait for the others (idle ranks wait while a subgroup measures).
TIMEOUT = datetime.timedelta(hours=2)


def launched() -> bool:
    """Whether this process is a rank torchrun started (its environment names the group)."""
    return all(k in os.environ for k in ("RANK", "WORLD_SIZE", "LOCAL_RANK"))


def devices_here(device: str) -> int:
    """How many ranks one node can give a device each: GPUs, or CPU cores."""
    if device == "cuda":
        import torch

        return torch.cuda.device_count()
    return os.cpu_count() or 1


class Clock:
    """Time stamps where the work runs: the host's clock on the CPU, CUDA events on the GPU
    (recorded on the current stream, read after a synchronize)."""

    def __init__(self, cuda: bool):
        self.cuda = cuda

    def stamp(self):
        if not self.cuda:
            return time.perf_counter()
        import torch

        event = torch.cuda.Event(enable_timing=True)
        event.record()
        return event

    def ms(self, a, b) -> float:
        return a.elapsed_time(b) if self.cuda else (b - a) * 1e3

    def sync(self) -> None:
        if self.cuda:
            import torch

            torch.cuda.synchronize()


def one_at_a_time(hook: Callable) -> Callable:
    """`hook`, each bucket's exchange starting when the previous one's has ended. PowerSGD
    issues its second and third all-reduces from the completion callback of the one before;
    gloo runs those callbacks on its own threads, so with two buckets in flight the ranks could
    issue their collectives in different orders (gloo aborts: "collective mismatch"). NCCL runs
    them where they were enqueued, and needs none of this."""
    import torch

    last = []

    def settle(out, value: Callable) -> None:
        """`out` takes `value()`, or what it raised: DDP waits on `out`, it must hear of it."""
        try:
            out.set_result(value())
        except Exception as exc:  # noqa: BLE001 - handed on, not swallowed
            out.set_exception(exc)

    def call(state, bucket):
        out = torch.futures.Future()

        def start(_=None):  # on gloo's thread when the last bucket's exchange ends: no waiting
            try:
                hook(state, bucket).add_done_callback(lambda f: settle(out, f.value))
            except Exception as exc:  # noqa: BLE001 - handed on, not swallowed
                out.set_exception(exc)

        if last:
            last.pop().add_done_callback(start)
        else:
            start()
        last.append(out)
        return out

    return call


def comm_hook(name: str, group, powersgd_rank: int) -> tuple[Callable, object, int]:
    """(the hook, its state, how many exact iterations it starts with)."""
    import torch.distributed as dist
    from torch.distributed.algorithms.ddp_comm_hooks import default_hooks, powerSGD_hook

    if name == "powersgd":
        state = powerSGD_hook.PowerSGDState(process_group=group,
                                            matrix_approximation_rank=powersgd_rank,
                                            start_powerSGD_iter=POWERSGD_START)
        hook = powerSGD_hook.powerSGD_hook
        if dist.get_backend(group) == "gloo":
            hook = one_at_a_time(hook)
        return hook, state, POWERSGD_START
    hooks = {"allreduce": default_hooks.allreduce_hook, "fp16": default_hooks.fp16_compress_hook,
             "bf16": default_hooks.bf16_compress_hook}
    return hooks[name], group, 0


class Exchange:
    """The comm hook DDP calls per bucket, wrapping the hook measured: as it is (overlapping the
    rest of the backward pass), or inside `serial()` waited for before backward goes on and
    timed, or inside `timeline()` with the bucket's ready and done stamped."""

    def __init__(self, hook: Callable, clock: Clock):
        self._mode, self.clock = None, clock
        self.spent: list[float] = []  # ms per bucket, in serial()
        self.stamps: list[tuple] = []  # (ready, done) per bucket, in timeline()

        def exchange(state, bucket):  # DDP asks for a function with a `bucket` parameter
            if self._mode == "serial":
                clock.sync()
                t0 = time.perf_counter()
                fut = hook(state, bucket)
                fut.wait()
                clock.sync()
                self.spent.append((time.perf_counter() - t0) * 1e3)
                return fut
            if self._mode == "timeline":
                ready = clock.stamp()

                def done(f):
                    self.stamps.append((ready, clock.stamp()))
                    return f.value()

                return hook(state, bucket).then(done)
            return hook(state, bucket)

        self.hook = exchange

    @contextlib.contextmanager
    def _in(self, mode: str):
        self._mode = mode
        try:
            yield self
        finally:
            self._mode = None

    def serial(self):
        """Within: each bucket's exchange waited for, the GPU synchronized around it, and its
        ms appended to `spent`."""
        return self._in("serial")

    def timeline(self):
        """Within: each bucket's (ready, done) time stamps appended to `stamps`."""
        return self._in("timeline")


class RankTrainer:
    """One rank's DDP model of the workload with one hook, the workload's optimizer and loss,
    and the rank's share of the batch."""

    def __init__(self, load: Workload, device: str, hook: str, powersgd_rank: int, group, x, y):
        import torch
        from torch.nn.parallel import DistributedDataParallel

        cuda = device == "cuda"
        self.load = load
        torch.manual_seed(0)
        module = load.build().to(device)
        ids = [torch.cuda.current_device()] if cuda else None
        self.ddp = DistributedDataParallel(module, device_ids=ids, process_group=group)
        fn, state, self.exact_iters = comm_hook(hook, group, powersgd_rank)
        self.clock = Clock(cuda)
        self.exchange = Exchange(fn, self.clock)
        self.ddp.register_comm_hook(state, self.exchange.hook)
        self.opt = load.optimizer(self.ddp)
        self.group, self.x, self.y = group, x, y

    def backward(self) -> None:
        self.opt.zero_grad(set_to_none=True)
        self.load.loss(self.ddp(self.x), self.y).backward()

    def step(self) -> None:
        self.backward()
        self.opt.step()

    def compute_step(self) -> None:
        with self.ddp.no_sync():
            self.step()

    def gradient(self):
        import torch

        return torch.cat([p.grad.flatten().double() for p in self.ddp.parameters()])

    def gradient_error(self) -> float:
        """The averaged gradient of one backward pass through the hook against the exact
        average of the same local gradients (no_sync, then one all-reduce), at the hook's first
        compressed iteration; nothing is updated."""
        import torch.distributed as dist

        for _ in range(self.exact_iters):
            self.backward()
        with self.ddp.no_sync():
            self.backward()
        exact = self.gradient().float()
        dist.all_reduce(exact, group=self.group)
        exact = exact.double() / dist.get_world_size(self.group)
        self.backward()
        return float((self.gradient() - exact).norm() / exact.norm())

    def against_one_process(self, x, y) -> float:
        """The last backward pass's averaged gradient against one process's gradient of the
        whole global batch (`x`, `y`) from the same initial weights: data parallelism with the
        exact all-reduce computes the same gradient, to rounding."""
        import torch

        torch.manual_seed(0)
        model = self.load.build().to(x.device)
        self.load.loss(model(x), y).backward()
        one = torch.cat([p.grad.flatten().double() for p in model.parameters()])
        return float((self.gradient() - one).norm() / one.norm())

    def times(self, step: Callable[[], None], steps: int, barrier: Callable[[], None]) -> list:
        """ms of each of `steps` steps, every rank starting each at a barrier."""
        out = []
        for _ in range(steps):
            self.clock.sync()
            barrier()
            t0 = time.perf_counter()
            step()
            self.clock.sync()
            out.append((time.perf_counter() - t0) * 1e3)
        return out

    def serial_times(self, steps: int, barrier: Callable[[], None]) -> tuple[list, list]:
        """(ms of each of `steps` steps with every bucket's exchange waited for, ms of the
        exchanges alone in each), every rank starting each step at a barrier."""
        serial, spent = [], []
        with self.exchange.serial():
            for _ in range(steps):
                self.exchange.spent = []
                serial += self.times(self.step, 1, barrier)
                spent.append(sum(self.exchange.spent))
        return serial, spent

    def timeline(self, barrier: Callable[[], None]) -> dict:
        """One instrumented step (the median of `TIMELINE_STEPS`): when forward ended, when each
        bucket was ready and its exchange done, when backward returned and the step ended, in
        ms from its start."""
        seen = []
        with self.exchange.timeline():
            for _ in range(TIMELINE_STEPS):
                self.exchange.stamps = []
                self.clock.sync()
                barrier()
                start = self.clock.stamp()
                self.opt.zero_grad(set_to_none=True)
                loss = self.load.loss(self.ddp(self.x), self.y)
                forward = self.clock.stamp()
                loss.backward()
                backward = self.clock.stamp()
                self.opt.step()
                end = self.clock.stamp()
                self.clock.sync()
                ms = functools.partial(self.clock.ms, start)
                seen.append({"forward": ms(forward), "backward": ms(backward), "end": ms(end),
                             "buckets": sorted((ms(a), ms(b)) for a, b in self.exchange.stamps)})
        return sorted(seen, key=lambda t: t["end"])[len(seen) // 2]


def rank_info(device: str) -> dict:
    """Where this rank ran: host, local rank, device."""
    import torch

    local = int(os.environ.get("LOCAL_RANK", "0"))
    name = (torch.cuda.get_device_name(local) if device == "cuda" else cpu_model())
    return {"host": socket.gethostname(), "local_rank": local, "device": name}


def interconnect(backend: str) -> dict:
    """What torch says about the links between ranks on this node."""
    import torch

    info = {"backend": backend,
            "env": {k: v for k, v in sorted(os.environ.items())
                    if k.startswith(("NCCL_", "GLOO_", "MASTER_", "TORCHELASTIC_RUN"))}}
    if backend == "nccl":
        count = torch.cuda.device_count()
        info.update(cuda_devices=[torch.cuda.get_device_name(i) for i in range(count)],
                    nccl=".".join(map(str, torch.cuda.nccl.version())),
                    peer_access=[[i == j or torch.cuda.can_device_access_peer(i, j)
                                  for j in range(count)] for i in range(count)])
    return info


@contextlib.contextmanager
def process_group(device: str):
    """This rank in the group its environment names (torchrun's, or the launcher's): a GPU of
    its own (TF32 off) and NCCL, or one CPU thread and gloo; yields the backend's name."""
    import torch
    import torch.distributed as dist

    cuda = device == "cuda"
    if cuda:
        torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", "0")))
        torch.backends.cudnn.allow_tf32 = False
        torch.backends.cuda.matmul.allow_tf32 = False
    else:
        torch.set_num_threads(1)
    backend = "nccl" if cuda else "gloo"
    dist.init_process_group(backend, timeout=TIMEOUT)
    try:
        yield backend
    finally:
        dist.destroy_process_group()


def launch(ranks: int, fn: Callable, *args):
    """`fn(*args)` on `ranks` processes of this node started through torch's launcher API
    (`elastic_launch`, what `torchrun --standalone` runs); rank 0's answer."""
    from torch.distributed.launcher.api import LaunchConfig, elastic_launch

    config = LaunchConfig(min_nodes=1, max_nodes=1, nproc_per_node=ranks,
                          run_id=str(uuid.uuid4()), rdzv_backend="c10d",
                          rdzv_endpoint="127.0.0.1:0", max_restarts=0)
    return elastic_launch(config, fn)(*args)[0]
