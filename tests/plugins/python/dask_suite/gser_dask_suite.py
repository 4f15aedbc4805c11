"""A pytest plugin that runs Dask's own protocol tests (distributed/protocol/tests
from Debian's python3-distributed) with gser as the default serializer family,
as `--preload gser.dask` makes it in a cluster.

    python3 -m pytest -p gser_dask_suite /usr/lib/python3/dist-packages/distributed/protocol/tests

expected_failures.txt (in the folder of the installed distributed's version
next to this file: 2022.12/, 2026.7/) lists, one per line, the tests
expected to fail with gser, and why: `<file>::<test id>  # <reason>`. They are
marked xfail(strict=True), so that a listed test that starts passing fails
the run (the list stays true), as does any failure not listed, and a listed
test that no longer exists. Lines `ignore <file>  # <reason>` name test files
that cannot be collected here; lines `skip <file>::<test id>  # <reason>`
tests that are not run, and say why in the report (a test that could only
wait for a timeout); lines `flaky <file>::<test id>  # <reason>` tests that
run but whose outcome depends on timing, marked xfail(strict=False): either
outcome is reported as such (XFAIL or XPASS), neither as a pass.

GSER_DASK_SUITE_LIST names another list (a file name, looked up the same way): the comm and cluster suites run
Dask's distributed/tests/test_core.py, test_batched.py, test_worker.py,
test_failed_workers.py, test_nanny.py and test_scheduler.py with gser:// as
the default scheme (DASK_DISTRIBUTED__COMM__DEFAULT_SCHEME=gser) against
expected_comm_failures.txt.
"""

import os

import pytest

HERE = os.path.dirname(os.path.abspath(__file__))


def list_path(name=None, version=None):
    """The list for the installed distributed: NAME (GSER_DASK_SUITE_LIST,
    default expected_failures.txt) in the folder named by the longest
    prefix of its version (2022.12/ for Debian's 2022.12.1+ds.1, 2026.7/
    for 2026.7.1). A version with no folder has no list: the run stops,
    rather than count unknown failures as gser's."""
    import distributed

    name = name or os.environ.get("GSER_DASK_SUITE_LIST") or "expected_failures.txt"
    version = version or distributed.__version__
    folders = [d for d in os.listdir(HERE) if os.path.isfile(os.path.join(HERE, d, name))]
    matching = [d for d in folders if version == d or version.startswith(d + ".")]
    if not matching:
        raise pytest.UsageError(f"gser_dask_suite: no {name} for distributed {version} (lists for: "
                                f"{', '.join(sorted(folders))}): run Dask's suites without gser, then write one")
    return os.path.join(HERE, max(matching, key=len), name)


# The kinds of entry after "ignore" (a file): a test id with no prefix is
# an expected failure.
MARKS = {
    "": lambda reason: pytest.mark.xfail(strict=True, reason=f"with gser: {reason}"),
    "skip": lambda reason: pytest.mark.skip(reason=f"with gser: {reason}"),
    "flaky": lambda reason: pytest.mark.xfail(strict=False, reason=f"with gser, timing: {reason}"),
}


def read_list(path):
    """({file name: reason}, {kind: {test key: reason}}): the files to
    ignore, and the tests of each kind in MARKS."""
    ignored, tests = {}, {kind: {} for kind in MARKS}
    with open(path) as f:
        for n, line in enumerate(f, 1):
            line = line.strip()
            if not line or line.startswith("#"):
                continue
            entry, sep, reason = line.partition("#")
            entry, reason = entry.strip(), reason.strip()
            if not sep or not reason:
                raise pytest.UsageError(f"{path}:{n}: every entry needs a reason after '#'")
            kind, _, rest = entry.partition(" ")
            if kind == "ignore":
                ignored[rest.strip()] = reason
            elif kind in MARKS and rest:
                tests[kind][rest.strip()] = reason
            else:
                tests[""][entry] = reason
    return ignored, tests


def key(item):
    """<file name>::<test id>, whatever directory pytest runs from."""
    return f"{item.path.name}::{item.nodeid.split('::', 1)[1]}"


def pytest_configure(config):
    import gser.dask

    gser.dask.register(default=True)
    # The fixtures Dask's conftest.py takes from distributed.utils_test
    # (loop, c, s, a, b, cleanup, ...): Debian does not ship that conftest.
    config.pluginmanager.import_plugin("distributed.utils_test")
    # The loopback-only namespace has no route to 8.8.8.8: Dask's get_ip()
    # warns and answers 127.0.0.1, under Dask's settings (warnings are
    # errors) an error, for tcp:// as for gser://.
    config.addinivalue_line("filterwarnings", "ignore:Couldn't detect a suitable IP address:RuntimeWarning")
    config._gser_list = list_path()
    config._gser_ignored, config._gser_tests = read_list(config._gser_list)


def pytest_ignore_collect(collection_path, config):
    return collection_path.name in config._gser_ignored or None


def pytest_collection_modifyitems(config, items):
    left = {kind: dict(tests) for kind, tests in config._gser_tests.items()}
    for item in items:
        for kind, tests in left.items():
            reason = tests.pop(key(item), None)
            if reason is not None:
                item.add_marker(MARKS[kind](reason))
    files = {item.path.name for item in items}
    stale = sorted(k for tests in left.values() for k in tests if k.split("::", 1)[0] in files)
    if stale and not config.getoption("keyword") and not config.getoption("markexpr"):
        raise pytest.UsageError(f"{config._gser_list} lists tests that no longer exist: " + ", ".join(stale))


def pytest_report_header(config):
    import gser

    return (f"gser {gser.__version__} is the default serializer family (gser.dask.register(default=True)); "
            f"expected failures: {config._gser_list}")
