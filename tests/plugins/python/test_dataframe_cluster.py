"""dask.dataframe on a real LocalCluster (worker processes, nannies) over
gser:// against the same on tcp://: a groupby, a task shuffle and a merge
of two frames whose partitions must move between workers. Results must be
equal, dtypes included, on every Dask the project supports (Debian's
2022.12 with pandas 1.5; PyPI's current with pandas 3 and 2, in the venvs
tools/test.sh makes)."""

import pytest

import gser
from netcluster import task_shuffle  # tests/plugins/python: the suite's own folder

np = pytest.importorskip("numpy")
pd = pytest.importorskip("pandas")
pytest.importorskip("distributed")
dd = pytest.importorskip("dask.dataframe")

pytestmark = [
    pytest.mark.skipif(not gser.HAVE_UCX, reason="gser built without gser::ucx (libucx-dev)"),
    pytest.mark.filterwarnings("ignore::DeprecationWarning"),
]


def frames(n=40_000):
    rng = np.random.default_rng(11)
    left = pd.DataFrame({
        "k": rng.integers(0, 500, n),
        "v": rng.random(n),
        "i": pd.array([None if j % 7 == 0 else j for j in range(n)], dtype="Int64"),
        "s": [f"name-{j % 13}" for j in range(n)],
        "t": pd.date_range("2024-01-01", periods=n, freq="s", tz="UTC"),
    })
    right = pd.DataFrame({"k": np.arange(500), "w": rng.random(500), "label": [f"L{j}" for j in range(500)]})
    return left, right


def workloads(client):
    left, right = frames()
    a = dd.from_pandas(left, npartitions=8)
    b = dd.from_pandas(right, npartitions=3)
    out = {
        "groupby": a.groupby("s").agg({"v": "sum", "i": "max", "k": "count"}),
        "shuffle": task_shuffle(a, "k"),
        "merge": a.merge(b, on="k", how="inner"),
    }
    results = dict(zip(out, client.compute(list(out.values()), sync=True)))
    return results, left, right


def check(results, left, right):
    """Values as pandas computes them (dtypes aside: current Dask turns
    strings into its own string dtype, dataframe.convert-string)."""
    loose = dict(check_dtype=False, check_index_type=False)
    expected_groupby = left.groupby("s").agg({"v": "sum", "i": "max", "k": "count"})
    pd.testing.assert_frame_equal(results["groupby"].sort_index(), expected_groupby.sort_index(),
                                  check_exact=False, rtol=1e-12, **loose)
    pd.testing.assert_frame_equal(results["shuffle"].sort_values("t").reset_index(drop=True),
                                  left.sort_values("t").reset_index(drop=True), check_exact=True, **loose)
    expected_merge = left.merge(right, on="k", how="inner")
    pd.testing.assert_frame_equal(results["merge"].sort_values(["t", "k"]).reset_index(drop=True),
                                  expected_merge.sort_values(["t", "k"]).reset_index(drop=True), check_exact=True,
                                  **loose)


def same(results, reference):
    """What gser:// delivered is what tcp:// delivered, dtypes and index included."""
    pd.testing.assert_frame_equal(results["groupby"].sort_index(), reference["groupby"].sort_index(),
                                  check_exact=False, rtol=1e-12)
    for k, by in (("shuffle", ["t"]), ("merge", ["t", "k"])):
        pd.testing.assert_frame_equal(results[k].sort_values(by), reference[k].sort_values(by), check_exact=True)


def run_on(protocol):
    from distributed import Client, LocalCluster

    with LocalCluster(n_workers=2, threads_per_worker=1, processes=True, protocol=protocol, host="127.0.0.1",
                      dashboard_address=None) as cluster, Client(cluster) as client:
        workers = client.scheduler_info()["workers"]
        assert len(workers) == 2 and all(w.startswith(f"{protocol}://127.0.0.1:") for w in workers)
        results, left, right = workloads(client)
        check(results, left, right)
        stats = None
        if protocol == "gser":
            stats = client.run(lambda: __import__("gser.dask", fromlist=["stats"]).stats())
        return results, stats


def test_dataframe_workloads_over_gser_as_over_tcp():
    reference, _ = run_on("tcp")
    results, stats = run_on("gser")
    same(results, reference)
    # Every worker has the family, and the data that moved between the
    # workers went through it.
    assert len(stats) == 2 and sum(s["dumps"] for s in stats.values()) > 0, stats
