"""What the Python benchmarks share: a target check and the report that
prints one row per case (a table, or one JSON line with name, ratio and
target), so every benchmark's rows read alike."""

import json
import os
import sys
import time


def meets(x, target):
    """Whether x meets a target written as "<= 0.8", ">= 1.1", "< 1", ..."""
    op, v = (target[:2], target[2:]) if target[1] == "=" else (target[:1], target[1:])
    v = float(v)
    return {"<=": x <= v, "<": x < v, ">=": x >= v, ">": x > v}[op]


class Report:
    """Rows of gser's time (ms) against an anchor measured in the same run.

    target_on="ratio" checks gser/anchor against the target; "value" checks
    gser's own time (a bound in ms, such as a mapped load's)."""

    def __init__(self, as_json, anchor_title="anchor ms", width=16):
        self.json = as_json
        self.width = width
        self.missed = 0
        if not as_json:
            print(f"{'case':<{width}} {'gser ms':>10} {anchor_title:>11} {'ratio':>8}  target")

    def add(self, name, value, anchor, anchor_value, target, note="", target_on="ratio"):
        ratio = value / anchor_value
        ok = meets(ratio if target_on == "ratio" else value, target)
        self.missed += not ok
        if self.json:
            row = {"name": name, "value": round(value, 6), "unit": "ms", "anchor": anchor,
                   "anchor_value": round(anchor_value, 6), "ratio": round(ratio, 6), "target": target, "target_on": target_on}
            print(json.dumps(row))
        else:
            t = target if target_on == "ratio" else f"{target} ms"
            print(f"{name:<{self.width}} {value:>10.3f} {anchor_value:>11.3f} {ratio:>8.4f}  {t:<8} "
                  f"{'ok' if ok else 'MISSED'}{'  ' + note if note else ''}")
        sys.stdout.flush()


def machine_line(extra):
    """The last line of a table run: the date, the machine, Python, gser and
    what else the benchmark's numbers depend on (extra)."""
    import gser

    print(f"# {time.strftime('%Y-%m-%d')}, {os.cpu_count()} CPUs, Python {sys.version.split()[0]}, "
          f"gser {gser.__version__}, {extra}")


def row_clients(stack, schemes):
    """{scheme: Client} of the comm rows' clusters, one per scheme, all up at
    once (their runs alternate): LocalCluster(n_workers=2,
    threads_per_worker=1, processes=True), entered on stack (an ExitStack)."""
    from distributed import Client, LocalCluster

    clients = {}
    for scheme in schemes:
        cluster = stack.enter_context(LocalCluster(n_workers=2, threads_per_worker=1, processes=True,
                                                   protocol=scheme, dashboard_address=":0"))
        clients[scheme] = stack.enter_context(Client(cluster))
    return clients
