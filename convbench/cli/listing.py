"""`convbench list`: the nets and their layers, and per backend what each algorithm supports
on them, with the reasons for what it does not."""

from __future__ import annotations

from .. import layers, registry, report
from ..problem import LAYOUTS, PASSES, PRECISIONS
from ..tables import tabulate


def cmd_list(args) -> int:
    """Nets and their layers; per backend, each algorithm, its precisions and what it supports
    on the layers of `--net`, with the reasons for what it does not."""
    nets = [args.net] if args.net else list(layers.NETS)
    for net in nets:
        print(f"## {net}\n")
        rows = [(layer.name, layer.problem.spec(), f"{layer.problem.flops / 1e9:.4g}")
                for layer in layers.net_layers(net)]
        print(tabulate(rows, headers=["layer", "problem", "GFLOP"], tablefmt="github"))
        print()
    net_layers = layers.net_layers(args.net or "alexnet")
    for backend in registry.BACKENDS:
        reason = registry.available(backend)
        print(f"## backend {backend}: {'available' if reason is None else reason}\n")
        impls = registry.implementations(backend)
        if not impls:
            print("no implementations\n")
            continue
        table, reasons = [], {}
        for impl in impls:
            cells = []
            for layer in net_layers:
                ok, why_not = [], {}
                for pass_ in PASSES:
                    for layout in LAYOUTS:
                        why = registry.supports(impl, layer.problem, pass_, layout,
                                                args.precision)
                        if why is None:
                            ok.append(f"{pass_}/{layout}")
                        else:
                            why_not.setdefault(why, []).append(f"{pass_} {layout}")
                cells.append("yes" if not why_not else ", ".join(ok) or "no")
                for why, cases in why_not.items():
                    reasons.setdefault((impl.algo, why), []).extend(
                        (layer.name, *case.split()) for case in cases)
            avail = registry.impl_available(impl)
            table.append([impl.algo, "/".join(impl.precisions), avail or "yes", *cells])
        print(tabulate(table, headers=["algo", "precisions", "runs here",
                                       *[layer.name for layer in net_layers]],
                       tablefmt="github"))
        print()
        for (algo, why), cases in reasons.items():
            print(f"- {algo}: {why} ({report.where(cases, len(PASSES) * len(LAYOUTS))})")
        print()
    return 0


def add_parsers(sub) -> None:
    p = sub.add_parser("list", help="nets, layers, and what each algo supports")
    p.add_argument("--net", choices=layers.NETS, help="only this net (support shown on it; "
                   "default: every net listed, support on alexnet)")
    p.add_argument("--precision", default="fp32", choices=PRECISIONS)
    p.set_defaults(func=cmd_list)
