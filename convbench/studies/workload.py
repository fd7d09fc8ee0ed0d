"""What every training-step study trains: one `Workload`, resolved once, and its one step.

    load = Workload.parse("alexnet")                      # or "alexnet-fcfree",
    load = Workload.parse("torchvision.models:resnet18@3,224,224")   # a user's model and image
    run = load.prepare(batch=2, device="cpu")             # model, SGD, seeded batch, on a device
    run.step()                                            # forward, loss, backward, SGD update

A workload is a frozen value: a catalog net (its conv layers as the catalog has them, with
ReLU and 3x3/2 max-pooling after conv1, conv2 and conv5, then fc6-fc8 — 4096, 4096, 1000; no
dropout, so every configuration computes the same thing), the study's variant of it without
fully connected layers (`-fcfree`), or a user's `MODULE:CALLABLE` with the shape of one image.
Its text form (`name`, `parse`) is for the process boundary only: the JSON a worker or probe
process receives, and the net name a report and env.json carry.

The recipe is here and nowhere else: the model seeded with `torch.manual_seed(0)`, images and
labels from a generator seeded with 1 (the same in every process), SGD with lr 0.01 and
momentum 0.9, cross-entropy for a classifier's (N, classes) output (the mean square for any
other output, so every output element gets a gradient), zero the gradients (freeing them),
forward, loss, backward, update.
"""

from __future__ import annotations

import contextlib
import os
import warnings
from collections.abc import Callable
from dataclasses import dataclass
from functools import cached_property

from ..catalogs import layers
from ..machine.devices import backend_of
from ..machine.threads import CPU_THREAD_ENV
from ..planning import apply, models

#: The catalog nets a training step is built from.
NETS = ("alexnet", "alexnet-owt")
#: Suffix of the study's variant without fully connected layers (fc6-fc8 as 1x1 convolutions).
FC_FREE = "-fcfree"
#: The catalog nets and each as its FC-free variant.
VARIANTS = (*NETS, *(f"{net}{FC_FREE}" for net in NETS))
#: Conv layers followed by a 3x3, stride-2 max-pool, as in AlexNet.
POOLED = ("conv1", "conv2", "conv5")
CLASSES = 1000
#: Separates a user's model from its image shape in a workload's text form.
_INPUT_SEP = "@"
#: CPU defaults, so a study ends within minutes on 2 cores: two images per step (the study's
#: batch was 256) of full size, and a 0.02 s timing budget per conv measurement a study makes
#: (tuning, the workspace choice; each still gets its 3 repetitions).
CPU_STEP_BATCH = 2
CPU_TUNE_BUDGET_S = 0.02
#: The optimizer's settings: SGD with momentum, as the study trained.
LEARNING_RATE = 0.01
MOMENTUM = 0.9


#: glibc's malloc, held to one rule in every worker process that steps a model (train-step's
#: configurations and its tuning, memplan's probes): every block from the heap, none mapped
#: on its own (`MALLOC_MMAP_MAX_=0`), and freed memory kept for the next step, never handed
#: back (`MALLOC_TRIM_THRESHOLD_`). Left alone, glibc maps large blocks afresh, moves that
#: threshold with the largest block a process has freed, and trims its heap by another, so
#: whether a step's tensors take fresh pages, faulted in and zeroed by the kernel, depended on
#: what that process had run before: a plan's worker, whose `apply` check had run the model in
#: float64, stepped with thousands fewer page faults than `eager`'s and read faster with no
#: layer replaced. Other allocators ignore the variables; each row's page faults per step say
#: what happened.
MALLOC_ENV = {"MALLOC_MMAP_MAX_": "0", "MALLOC_TRIM_THRESHOLD_": str(1 << 40)}


def worker_environment(device: str) -> dict:
    """The environment of the worker processes (tuning, training, memplan's probes): this
    one's, with glibc's malloc thresholds fixed (`MALLOC_ENV`) and, on the CPU, idle threads
    sleeping (`threads.CPU_THREAD_ENV`); a variable already set is left as it is."""
    cpu = CPU_THREAD_ENV if backend_of(device) == "numpy" else {}
    return {**MALLOC_ENV, **cpu, **os.environ}


def _whole(heavy, cheap, x):
    """A stage run as it is: the heavy layer, then the cheap ones after it."""
    return cheap(heavy(x))


@dataclass(frozen=True)
class Workload:
    """A model to train and the images it trains on: `net`, a catalog net (`NETS`), or a
    user's `MODULE:CALLABLE` (`models.load`) with `image`, the (C, H, W) of one image;
    `fc_free`: the catalog net's variant with fc6-fc8 as 1x1 convolutions. Pickles by value:
    data-parallel ranks and probe processes rebuild it."""

    net: str
    image: tuple[int, int, int] | None = None
    fc_free: bool = False

    @classmethod
    def parse(cls, text: str) -> Workload:
        """The workload of its text form (`name`): `alexnet`, `alexnet-fcfree`,
        `MODULE:CALLABLE@C,H,W`; ValueError for a net the catalog lacks."""
        spec, sep, chw = text.partition(_INPUT_SEP)
        if sep:
            return cls(spec, tuple(int(t) for t in chw.split(",")))
        if text not in VARIANTS:
            raise ValueError(f"unknown net {text!r}; valid: {', '.join(VARIANTS)}")
        return cls(text.removesuffix(FC_FREE), None, text.endswith(FC_FREE))

    @classmethod
    def of_model(cls, spec: str, chw: tuple[int, ...]) -> Workload:
        """A user's model (`MODULE:CALLABLE`) trained on images of `chw`."""
        return cls(spec, tuple(chw))

    @property
    def name(self) -> str:
        """The text form: `alexnet`, `alexnet-fcfree`, `torchvision.models:resnet18@3,224,224`."""
        if self.user:
            return f"{self.net}{_INPUT_SEP}{','.join(map(str, self.image))}"
        return self.net + (FC_FREE if self.fc_free else "")

    @property
    def user(self) -> bool:
        """Whether the model is a user's (`MODULE:CALLABLE`) rather than a catalog net."""
        return self.image is not None

    def counterpart(self) -> Workload:
        """A catalog net's variant with fully connected layers if this one has none, and the
        other way round."""
        return Workload(self.net, None, not self.fc_free)

    # --- what it is made of -----------------------------------------------------------------
    @cached_property
    def conv_layers(self) -> list:
        """The catalog's conv layers of the net (`layers.Layer`); a user's model has none here
        (`models.conv_layers` finds them by running it)."""
        return [] if self.user else layers.net_layers(self.net)

    @cached_property
    def image_shape(self) -> tuple[int, int, int]:
        """(C, H, W) of one image."""
        if self.user:
            return self.image
        first = self.conv_layers[0].problem
        return first.c, first.h, first.w

    @cached_property
    def classes(self) -> int:
        """How many classes the labels are drawn from: the model's output width (found on
        `meta`, so nothing is computed), 1 where the output is not (N, classes)."""
        if not self.user:
            return CLASSES
        import torch

        try:
            with torch.device("meta"):
                out = self.build()(torch.empty(1, *self.image_shape))
        except (NotImplementedError, RuntimeError, ValueError):
            # a model whose construction copies data (RegNet's) cannot be made on meta: made
            # for real, in eval mode (batch statistics of one image do not exist)
            with torch.no_grad():
                out = self.build().eval()(torch.zeros(1, *self.image_shape))
        return out.shape[1] if out.dim() == 2 else 1

    def default_batch(self, backend: str) -> int:
        """Images per step unless told: `CPU_STEP_BATCH` on the CPU, else the catalog's."""
        return CPU_STEP_BATCH if backend == "numpy" else self.conv_layers[0].problem.n

    def conv_passes(self) -> list[tuple[str, str]]:
        """The conv passes a training step of a catalog net runs: all three of every layer but
        the first, whose input (the images) needs no gradient, so no bwd_data."""
        names = [layer.name for layer in self.conv_layers]
        return [(name, p) for i, name in enumerate(names)
                for p in ("fwd", "bwd_data", "bwd_filter") if i or p != "bwd_data"]

    def build(self):
        """The model, not yet on a device (`prepare` seeds it first). A catalog net's conv
        layers are named as in the catalog, so a plan from `convbench advise` of that net's run
        applies to it by name; a user's model is as its callable returns it (whose forward has
        no stages: `memplan`'s strategies wrap its modules instead).

        `fc_free` is the study's variant without fully connected layers: fc6-fc8 become 1x1
        convolutions over the last pooled feature map, and the class scores are averaged over
        its positions. fc6 then sees one position's channels instead of the whole map, which
        is most of AlexNet's parameters (and of the gradient data-parallel training
        exchanges); fc7 and fc8 run at every position, which costs compute.

        A catalog model's forward pass is a chain of stages, each a heavy layer (a
        convolution, a fully connected layer) and the cheap ones after it (ReLU, pooling):
        `forward(x, run)` hands each stage to `run(heavy, cheap, x)`, which is how `memplan`'s
        strategies recompute or offload what a stage keeps for backward without a second copy
        of the network."""
        if self.user:
            return models.load(self.net)
        return _alexnet_shaped(self.conv_layers, self.fc_free)

    def example_batch(self, batch: int, device: str):
        """Seeded images and labels, the same in every process; on `meta`, their shapes only."""
        import torch

        if device == "meta":
            return (torch.empty(batch, *self.image_shape, device="meta"),
                    torch.empty(batch, dtype=torch.long, device="meta"))
        g = torch.Generator().manual_seed(1)
        x = torch.randn(batch, *self.image_shape, generator=g)
        return x.to(device), torch.randint(0, self.classes, (batch,), generator=g).to(device)

    # --- the recipe -------------------------------------------------------------------------
    @staticmethod
    def optimizer(model):
        """SGD with momentum over `model`'s parameters."""
        import torch

        return torch.optim.SGD(model.parameters(), lr=LEARNING_RATE, momentum=MOMENTUM)

    @staticmethod
    def loss(output, target):
        """Cross-entropy against the labels for a classifier's (N, classes) output; for any
        other output (a user's model: a segmentation, features) the mean square."""
        import torch.nn.functional as F

        if output.dim() == 2:
            return F.cross_entropy(output, target)
        return output.float().pow(2).mean()

    def prepare(self, batch: int, device: str, plan=None, check: bool = False) -> Training:
        """The model seeded and on `device` (`meta`: made there directly, so no weights are
        initialized and no image is drawn), `plan` applied if given (`apply.apply`: a Plan or
        a plan file), its optimizer and a batch: ready to step. `check`: each replaced layer
        is run against the original on the batch first (`apply`'s check); the memory studies
        leave it off, as its runs would allocate the workspaces before their profile starts."""
        import torch

        torch.manual_seed(0)
        if device == "meta":
            with torch.device("meta"):
                model = self.build()
        else:
            model = self.build().to(device)
        x, target = self.example_batch(batch, device)
        checked = x if check and device != "meta" else None  # a meta tensor has no values
        applied = apply.apply(model, plan, check=checked) if plan is not None else None
        return Training(self, model, self.optimizer(model), x, target, applied)


@dataclass
class Training:
    """A workload resolved on a device: its model, optimizer and batch, and the step."""

    load: Workload
    model: object
    opt: object
    x: object
    target: object
    applied: apply.Summary | None = None  # what applying the plan did, if one was given

    def step(self, forward: Callable | None = None, around=contextlib.nullcontext,
             on_loss: Callable[[object], None] | None = None):
        """One step: zero the gradients (freeing them), forward (`forward`, default the
        model; `around()` around it and the loss: memplan's, where what backward needs is
        kept; train-step's, bf16 autocast), the loss, `on_loss(loss)`, backward, the SGD
        update; returns the loss."""
        self.opt.zero_grad(set_to_none=True)
        with around():
            loss = self.load.loss((self.model if forward is None else forward)(self.x), self.target)
        if on_loss is not None:
            on_loss(loss)
        with warnings.catch_warnings():
            # conv1's input needs no gradient, so its full backward hook fires on its outputs.
            warnings.filterwarnings("ignore", "Full backward hook is firing")
            loss.backward()
        self.opt.step()
        return loss

    def infer(self, forward: Callable | None = None, around=contextlib.nullcontext):
        """One inference: forward without gradients (the caller puts the model in eval
        mode; `around()` around it, as in `step`); returns the output's mean, as `step`
        returns its loss."""
        import torch

        with torch.no_grad(), around():
            out = (self.model if forward is None else forward)(self.x)
        out = out[0] if isinstance(out, (tuple, list)) else out
        return out.float().mean()

    def gradient(self):
        """Every parameter's gradient, flattened into one float64 vector."""
        import torch

        return torch.cat([p.grad.flatten().double() for p in self.model.parameters()])


def build_model(net: str = "alexnet"):
    """A catalog net's model as `MODULE:CALLABLE` names one for `tune`, `memplan` and
    `models.load`: `--model convbench.studies.workload:build_model --input 2,3,227,227`."""
    return Workload.parse(net).build()


def _alexnet_shaped(convs: list, fc_free: bool):
    """The AlexNet-shaped model of a catalog's conv layers (`Workload.build`)."""
    import torch
    from torch import nn

    class AlexNetShaped(nn.Module):
        def __init__(self):
            super().__init__()
            for layer in convs:
                p = layer.problem
                setattr(self, layer.name, nn.Conv2d(p.c, p.k, (p.r, p.s), **p.torch_args()))
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

            stages = [(getattr(self, name), relu_pool if name in POOLED else torch.relu)
                      for name in self.names]
            if fc_free:
                return [*stages, (self.fc6, torch.relu), (self.fc7, torch.relu),
                        (self.fc8, lambda t: t.mean((2, 3)))]
            return [*stages, (lambda t: self.fc6(torch.flatten(t, 1)), torch.relu),
                    (self.fc7, torch.relu), (self.fc8, lambda t: t)]

        def forward(self, x, run=_whole):
            for heavy, cheap in self.stages():
                x = run(heavy, cheap, x)
            return x

    return AlexNetShaped()
