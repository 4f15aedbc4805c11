"""Resident-memory growth, for the tests that check nothing accumulates."""

import gc
import os


def rss_bytes():
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def rss_growth(cycle, runs, warmup=3):
    """Bytes the resident set grew over `runs` calls of cycle(), measured after
    `warmup` calls that fill the allocators' pools."""
    for _ in range(warmup):
        cycle()
    gc.collect()
    start = rss_bytes()
    for _ in range(runs):
        cycle()
    gc.collect()
    return rss_bytes() - start
