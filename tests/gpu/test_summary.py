#!/usr/bin/env python3
"""bench/gpu/summary.py survives what benchmarks print when an anchor fails
(nan, inf: not JSON), unreadable lines and missing fields, and still says
which rows met their targets. Run: python3 tests/gpu/test_summary.py"""
import io
import os
import subprocess
import sys
import unittest

HERE = os.path.dirname(os.path.abspath(__file__))
SUMMARY = os.path.join(HERE, "..", "..", "bench", "gpu", "summary.py")
sys.path.insert(0, os.path.dirname(SUMMARY))
import summary  # noqa: E402

GOOD = ('{"name": "pack_100x1MiB", "value": 0.06, "unit": "ms", "anchor": "one copy", '
        '"anchor_value": 0.057, "ratio": 1.05, "target": "<= 1.25"}')
MISS = ('{"name": "pack_16x64MiB_vs_cub", "value": 0.7, "unit": "ms", "anchor": "cub", '
        '"anchor_value": 0.6, "ratio": 1.1667, "target": "<= 1"}')
# What bench_print writes when ucx_perftest failed: the anchor is nan.
NAN = ('{"name": "shm_4MiB", "value": 10.2, "unit": "GB/s", "anchor": "ucx_perftest", '
       '"anchor_value": nan, "ratio": nan, "target": ">= 0.9"}')
NEGNAN = ('{"name": "lat", "value": -nan, "unit": "us", "anchor": "ucx_perftest", '
          '"anchor_value": 3.1, "ratio": -nan, "target": "<= 2"}')
INF = ('{"name": "bw", "value": 5, "unit": "GB/s", "anchor": "x", "anchor_value": 0, '
       '"ratio": inf, "target": ">= 0.8"}')


def run(lines):
    out = io.StringIO()
    missed = summary.summarize(lines, out)
    return missed, out.getvalue().splitlines()


class Summary(unittest.TestCase):
    def test_rows_that_meet_and_miss_their_targets(self):
        missed, rows = run([GOOD, MISS])
        self.assertEqual(missed, 1)
        self.assertTrue(rows[0].endswith(" ok"), rows[0])
        self.assertTrue(rows[1].endswith("MISSED"), rows[1])

    def test_nan_and_inf_are_rows_without_a_value_not_a_crash(self):
        missed, rows = run([NAN, NEGNAN, INF, GOOD])
        self.assertEqual(missed, 3)
        self.assertEqual(len(rows), 4)
        for r in rows[:3]:
            self.assertIn("NO VALUE", r)
        self.assertIn("shm_4MiB", rows[0])
        self.assertIn("n/a", rows[0])
        self.assertTrue(rows[3].endswith(" ok"))

    def test_unreadable_lines_and_missing_fields(self):
        missed, rows = run(["{not json at all", '{"name": "x"}', "== a log line, ignored", GOOD])
        self.assertEqual(missed, 2)
        self.assertEqual(len(rows), 3)
        self.assertIn("unreadable", rows[0])
        self.assertIn("NO VALUE", rows[1])

    def test_the_ratio_is_computed_when_only_values_are_given(self):
        line = '{"name": "y", "value": 2, "unit": "ms", "anchor": "a", "anchor_value": 4, "target": "<= 1"}'
        missed, rows = run([line])
        self.assertEqual(missed, 0)
        self.assertIn("0.5000", rows[0])

    def test_a_row_without_a_target_is_shown_and_not_judged(self):
        line = ('{"name": "ucx_shm_lat_8B_frames", "value": 0.8, "unit": "us", "anchor": "ucx_perftest", '
                '"anchor_value": 0.4, "ratio": 2, "target": null}')
        missed, rows = run([line, MISS])
        self.assertEqual(missed, 1)
        self.assertIn("ucx_shm_lat_8B_frames", rows[0])
        self.assertIn("2.0000", rows[0])
        self.assertNotIn("MISSED", rows[0])
        self.assertNotIn("NO VALUE", rows[0])

    def test_as_a_program_exit_status_says_whether_anything_missed(self):
        for text, want in ((GOOD + "\n", 0), (GOOD + "\n" + NAN + "\n", 1)):
            p = subprocess.run([sys.executable, SUMMARY], input=text, capture_output=True, text=True)
            self.assertEqual(p.returncode, want, p.stderr)
            self.assertEqual(p.stderr, "")


if __name__ == "__main__":
    unittest.main()
