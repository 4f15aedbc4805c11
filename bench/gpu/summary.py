#!/usr/bin/env python3
"""Print one table row per benchmark JSON line read from stdin.

Each line is what bench_util.h (or bench/python) prints with --json:
name, value, unit, anchor, anchor_value, ratio = value / anchor_value, target.
Exit status 1 if any ratio misses its target, so run.sh can report it.
"""
import json
import sys


def meets(ratio, target):
    op = target[:2] if target[1] == "=" else target[:1]
    bound = float(target[len(op):])
    return {"<=": ratio <= bound, "<": ratio < bound,
            ">=": ratio >= bound, ">": ratio > bound}[op]


def main():
    missed = 0
    for line in sys.stdin:
        if not line.startswith("{"):
            continue
        r = json.loads(line)
        ok = meets(r["ratio"], r["target"])
        missed += not ok
        name, unit, anchor = r["name"], r["unit"], r["anchor"][:36]
        print(f"{name:<30} {r['value']:10.4f} {unit:<4} vs {anchor:<36} "
              f"{r['anchor_value']:10.4f}  ratio {r['ratio']:7.3f} "
              f"{r['target']:>7} {'ok' if ok else 'MISSED'}")
    return 1 if missed else 0


if __name__ == "__main__":
    sys.exit(main())
