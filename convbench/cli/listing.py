"""`convbench list`: the catalogs, in one table; with `--net`, a catalog's problems; per backend,
what each algorithm supports on them, with the reasons for what it does not.

A catalog of more than `MANY` problems (`convset`) is shown by class: its most frequent
problems (`--all`: every one), and per algorithm how many problems of each class it runs.
"""

from __future__ import annotations

import re

from ..algos import registry
from ..analysis import report
from ..catalogs import convset, layers, selection
from ..core.fmt import tabulate
from ..core.problem import LAYOUTS, PASSES, PRECISIONS
from ..machine.backends import BACKENDS, available

#: A catalog with more problems than this is listed by class, not problem by problem.
MANY = 40
#: How many of a large catalog's problems `list --net` shows (the most frequent).
SHOWN = 15
CASES = len(PASSES) * len(LAYOUTS)


def _batch(found: list[layers.Layer], net: str) -> str:
    batches = sorted({la.problem.n for la in found})
    own = " (each problem's own)" if net in layers.OWN_BATCH else ""
    return (", ".join(map(str, batches)) if len(batches) <= 3
            else f"{batches[0]}-{batches[-1]}") + own


def _classes(found: list[layers.Layer]) -> str:
    return ", ".join(f"{c} {n}" for c, n in selection.class_counts(found).items() if n)


def catalogs_table() -> str:
    rows = []
    for net in layers.NETS:
        found = layers.net_layers(net)
        note = ""
        if net == convset.NAME:
            left = convset.load().skipped_counts()
            note = "; ".join(f"{n} more left out ({reason})" for reason, n in left.items())
        rows.append((net, len(found), sum(la.count for la in found), _batch(found, net),
                     _classes(found), note))
    return tabulate(rows, headers=["net", "problems", "conv layers", "batch", "classes",
                                   "note"], tablefmt="github")


def problems_table(net: str, found: list[layers.Layer], every: bool) -> str:
    shown = found
    if len(found) > MANY and not every:
        shown = sorted(found, key=lambda la: -la.count)[:SHOWN]
    rows = [(la.name, la.problem.spec(), selection.classify(la.problem), la.count,
             f"{la.problem.flops / 1e9:.4g}") for la in shown]
    text = tabulate(rows, headers=["layer", "problem", "class", "count", "GFLOP"],
                    tablefmt="github")
    if len(shown) < len(found):
        text += (f"\n\nThe {len(shown)} most frequent of {len(found)} problems ({_classes(found)}"
                 f"); every one: `convbench list --net {net} --all`.")
    return text


def _columns(found: list[layers.Layer]) -> dict[str, list[layers.Layer]]:
    """The layers of each column: one layer a column, or for a large catalog a class (each
    layer classified once, not once per implementation)."""
    if len(found) <= MANY:
        return {la.name: [la] for la in found}
    groups: dict[str, list[layers.Layer]] = {c: [] for c in selection.CLASSES}
    for la in found:
        groups[selection.classify(la.problem)].append(la)
    return groups


def _support(impls: list, groups: dict[str, list[layers.Layer]], by_class: bool,
             precision: str) -> list[tuple[list[str], dict]]:
    """Per implementation: per column (a layer, or for a large catalog a class) the cell, and
    reason -> cases. The implementations are asked about each case back to back: an algorithm's
    `cuda` and `emu` wrappers, one class, share their checks (`KernelImplementation`'s cache)."""
    out = [([], {}) for _ in impls]
    for group in groups.values():
        ok_cases, runs = [[] for _ in impls], [0] * len(impls)
        for layer in group:
            ok = [[] for _ in impls]
            for pass_ in PASSES:
                for layout in LAYOUTS:
                    for i, impl in enumerate(impls):
                        why = registry.supports(impl, layer.problem, pass_, layout, precision)
                        if why is None:
                            ok[i].append(f"{pass_}/{layout}")
                        else:
                            out[i][1].setdefault(why, []).append((layer.name, pass_, layout))
            for i in range(len(impls)):
                runs[i] += len(ok[i]) == CASES
                ok_cases[i] = ok[i]
        for i, (cells, _) in enumerate(out):
            if not group:
                cells.append("")
            elif by_class:
                cells.append("yes" if runs[i] == len(group) else f"{runs[i]} of {len(group)}")
            else:
                cells.append("yes" if runs[i] else ", ".join(ok_cases[i]) or "no")
    return out


def _alike(algo: str, reasons: dict) -> list[str]:
    """For a large catalog: one line per kind of reason (reasons that differ only in their
    numbers, such as `groups 2` and `groups 4`), with one example and the problems it covers."""
    kinds: dict[str, list] = {}
    for why, cases in reasons.items():
        kinds.setdefault(re.sub(r"\d[\d,]*", "#", why), []).append((why, cases))
    out = []
    for group in kinds.values():
        problems = len({c[0] for _, cases in group for c in cases})
        more = f"; {len(group) - 1} more alike with other numbers" if len(group) > 1 else ""
        out.append(f"- {algo}: {group[0][0]} ({problems} problems{more})")
    return out


def support_tables(net: str, found: list[layers.Layer], precision: str,
                   backends: tuple[str, ...] = BACKENDS) -> list[str]:
    out = []
    by_class = len(found) > MANY
    groups = _columns(found)
    columns = list(groups)
    every = {b: registry.implementations(b) for b in backends}
    algos = list(dict.fromkeys(impl.algo for b in backends for impl in every[b]))
    support = {}
    for algo in algos:
        same = [impl for b in backends for impl in every[b] if impl.algo == algo]
        support.update(zip([(i.backend, algo) for i in same],
                           _support(same, groups, by_class, precision)))
    for backend in backends:
        reason = available(backend)
        impls = every[backend]
        head = f"## backend {backend} on {net}: {'available' if reason is None else reason}"
        if not impls:
            out += [head, "", "no implementations", ""]
            continue
        table, notes = [], []
        for impl in impls:
            cells, reasons = support[backend, impl.algo]
            own = registry.impl_available(impl)
            table.append([impl.algo, "/".join(impl.precisions),
                          *([] if reason else [own or "yes"]), *cells])
            if by_class:
                notes += _alike(impl.algo, reasons)
            else:
                notes += [f"- {impl.algo}: {why} ({report.where(cases, CASES)})"
                          for why, cases in reasons.items()]
        headers = ["algo", "precisions", *([] if reason else ["runs here"]), *columns]
        out += [head, "", ("Problems of each class it runs in every pass and layout:"
                           if by_class else "Passes and layouts it runs per layer:"), "",
                tabulate(table, headers=headers, tablefmt="github"), "", *notes, ""]
    return out


def cmd_list(args) -> int:
    """The catalogs; `--net`'s problems; per backend what each algorithm supports on them."""
    print("## catalogs\n")
    print(catalogs_table())
    print("\n`--net NET` for a catalog's problems and what each algorithm runs of them; "
          "`bench --net NET --class CLASS --sample N` measures a part of one.\n")
    net = args.net or "alexnet"
    found = layers.net_layers(net)
    if args.net:
        print(f"## {net}\n")
        print(problems_table(net, found, args.all))
        print()
    # the emulator runs small problems only: its table is worth reading for a chosen catalog
    backends = BACKENDS if args.net else ("numpy", "cuda")
    print("\n".join(support_tables(net, found, args.precision, backends)).rstrip())
    if not args.net:
        print("\n(backend emu, the CUDA sources run on the CPU for small problems: "
              "`convbench list --net NET`)")
    return 0


def add_parsers(sub) -> None:
    p = sub.add_parser("list", help="catalogs, their problems, and what each algo supports")
    p.add_argument("--net", choices=layers.NETS, help="this catalog's problems, and support "
                   "shown on them (default: the catalogs summarised, support on alexnet)")
    p.add_argument("--all", action="store_true",
                   help=f"with --net: every problem, also of a catalog of more than {MANY}")
    p.add_argument("--precision", default="fp32", choices=PRECISIONS)
    p.set_defaults(func=cmd_list)
