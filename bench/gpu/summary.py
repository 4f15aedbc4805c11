#!/usr/bin/env python3
"""Print one table row per benchmark JSON line read from stdin.

Each line is what bench_util.h (or bench/python) prints with --json:
name, value, unit, anchor, anchor_value, ratio = value / anchor_value, target.
A benchmark whose anchor failed prints nan (not JSON); such a line, a line
that cannot be read at all, or a missing or non-finite ratio is a row that
says so, never a crash. A row whose target is null explains another and is
not judged. Exit status 1 if any row missed its target or had no value, so
run.sh can report it.
"""
import json
import math
import re
import sys

# bench_print writes C's "%g" of a NaN or an infinity: nan, -nan, inf, -inf.
_NONFINITE = re.compile(r'(?<![\w."])-?(nan|inf)(?![\w"])', re.IGNORECASE)


def parse(line):
    """The result as a dict, or None when the line cannot be read."""
    try:
        return json.loads(line)
    except ValueError:
        pass
    try:
        return json.loads(_NONFINITE.sub("null", line))
    except ValueError:
        return None


def number(x):
    """x as a finite float, or None."""
    if isinstance(x, bool) or not isinstance(x, (int, float)):
        return None
    return float(x) if math.isfinite(x) else None


def meets(ratio, target):
    """Whether ratio meets "<= x", "< x", ">= x" or "> x"; None if unreadable."""
    m = re.fullmatch(r"\s*(<=|>=|<|>)\s*([-+0-9.eE]+)\s*", str(target))
    if ratio is None or not m:
        return None
    op, bound = m.group(1), float(m.group(2))
    return {"<=": ratio <= bound, "<": ratio < bound, ">=": ratio >= bound, ">": ratio > bound}[op]


def fmt(x, width):
    return f"{x:{width}.4f}" if x is not None else f"{'n/a':>{width}}"


def row(r):
    """One table line, and whether it counts as missed."""
    value, anchor_value = number(r.get("value")), number(r.get("anchor_value"))
    ratio = number(r.get("ratio"))
    if ratio is None and value is not None and anchor_value:
        ratio = value / anchor_value
    target = r.get("target", "?")
    # A null target: a row that explains another (bench_util.h), shown, never judged.
    judged = not ("target" in r and target is None)
    ok = meets(ratio, target) if judged else None
    verdict = "" if not judged else "ok" if ok else ("MISSED" if ok is False else "NO VALUE")
    name, unit, anchor = str(r.get("name", "?")), str(r.get("unit", "")), str(r.get("anchor", "?"))[:36]
    return (f"{name:<30} {fmt(value, 10)} {unit:<4} vs {anchor:<36} {fmt(anchor_value, 10)}  "
            f"ratio {fmt(ratio, 7)} {str(target) if judged else '-':>7} {verdict}".rstrip()), judged and ok is not True


def summarize(lines, out):
    missed = 0
    for line in lines:
        line = line.strip()
        if not line.startswith("{"):
            continue
        r = parse(line)
        if r is None or not isinstance(r, dict):
            print(f"{'(unreadable result)':<30} {line[:80]}  NO VALUE", file=out)
            missed += 1
            continue
        text, bad = row(r)
        print(text, file=out)
        missed += bad
    return missed


def main():
    return 1 if summarize(sys.stdin, sys.stdout) else 0


if __name__ == "__main__":
    sys.exit(main())
