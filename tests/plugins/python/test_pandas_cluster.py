"""The per-client setup plugins/python/README.md documents, without pickle
(Client(serializers=gser.dask.SERIALIZERS, deserializers=gser.dask.DESERIALIZERS)),
runs the workloads of the project's examples: dask.array reductions (numpy
scalar results) and dask.dataframe results (groupby, sums, head,
value_counts, a task shuffle and a shuffle by Dask's default method: P2P
from 2024 on), on LocalCluster(protocol="gser") and on a
tcp:// LocalCluster with the family on. The client refuses pickled data,
so every result it gets came through gser (or Dask's "dask" family)."""

import pytest

import gser

np = pytest.importorskip("numpy")
pd = pytest.importorskip("pandas")
pytest.importorskip("distributed")
pytest.importorskip("dask.dataframe")

import gser.dask  # noqa: E402
from netcluster import task_shuffle  # noqa: E402  (tests/plugins/python: the suite's own folder)

pytestmark = [
    pytest.mark.filterwarnings("ignore:make_current is deprecated:DeprecationWarning"),
    pytest.mark.filterwarnings("ignore::DeprecationWarning"),
]


def frame(n=6000):
    rng = np.random.default_rng(3)
    return pd.DataFrame({
        "k": np.arange(n) % 17,
        "v": rng.random(n),
        "i": pd.array([None if j % 5 == 0 else j for j in range(n)], dtype="Int64"),
        "s": [f"name-{i % 7}" for i in range(n)],
        "t": pd.date_range("2020-01-01", periods=n, freq="min", tz="UTC"),
        "c": pd.Categorical([("x", "y", "z")[i % 3] for i in range(n)]),
    })


def workloads(client):
    """The examples' workloads: each result as the client receives it."""
    import dask.array as da
    import dask.dataframe as dd

    x = da.random.RandomState(42).random((600, 600), chunks=200)
    pdf = frame()
    ddf = dd.from_pandas(pdf, npartitions=6)
    out = {
        "array_sum": (x + x.T).sum(),
        "array_mean_axis": x.mean(axis=0),
        "groupby_sum": ddf.groupby("k").v.sum(),
        "groupby_agg": ddf.groupby("s").agg({"v": ["mean", "max"], "i": "sum"}),
        "col_sum": ddf.v.sum(),
        "nullable_sum": ddf.i.sum(),
        "t_max": ddf.t.max(),
        "value_counts": ddf.s.value_counts(),
        "frame": ddf[ddf.v > 0.5],
        "shuffle": task_shuffle(ddf, "k"),
        "shuffle_default": ddf.shuffle(on="k"),
    }
    results = dict(zip(out, client.compute(list(out.values()), sync=True)))
    results["head"] = ddf.head(7, npartitions=2)
    results["expected_frame"] = pdf[pdf.v > 0.5]
    results["expected_shuffle_len"] = len(pdf)
    return results


def check(results, reference):
    """Results equal pandas' own and the reference cluster's (tcp, pickle allowed)."""
    assert type(results["array_sum"]) is np.float64
    assert results["array_sum"] == reference["array_sum"]
    np.testing.assert_array_equal(results["array_mean_axis"], reference["array_mean_axis"])
    for k in ("groupby_sum", "value_counts"):
        pd.testing.assert_series_equal(results[k].sort_index(), reference[k].sort_index(), check_exact=True)
    pd.testing.assert_frame_equal(results["groupby_agg"].sort_index(), reference["groupby_agg"].sort_index(),
                                  check_exact=True)
    for k in ("col_sum", "nullable_sum", "t_max"):
        assert type(results[k]) is type(reference[k]) and results[k] == reference[k], k
    # pandas' values; the dtypes of Dask's own path (Dask >= 2023 makes str
    # columns string[pyarrow], dataframe.convert-string)
    pd.testing.assert_frame_equal(results["frame"], results["expected_frame"], check_exact=True, check_dtype=False)
    pd.testing.assert_frame_equal(results["frame"], reference["frame"], check_exact=True)
    pd.testing.assert_frame_equal(results["head"], reference["head"], check_exact=True)
    for k in ("shuffle", "shuffle_default"):
        sh = results[k]
        assert len(sh) == results["expected_shuffle_len"], k
        pd.testing.assert_frame_equal(sh.sort_values(["t"]), reference[k].sort_values(["t"]), check_exact=True)


@pytest.fixture(scope="module")
def reference():
    """The same workloads on tcp:// without gser, pickle allowed (Dask's own path)."""
    from distributed import Client, LocalCluster

    with LocalCluster(n_workers=2, threads_per_worker=1, processes=False, protocol="tcp", host="127.0.0.1",
                      dashboard_address=None) as cluster, Client(cluster) as client:
        return workloads(client)


def test_workloads_on_tcp_with_the_family_without_pickle(reference):
    from distributed import Client, LocalCluster

    gser.dask.register(default=True)
    try:
        with LocalCluster(n_workers=2, threads_per_worker=1, processes=False, protocol="tcp", host="127.0.0.1",
                          dashboard_address=None) as cluster, \
             Client(cluster, serializers=list(gser.dask.SERIALIZERS),
                    deserializers=list(gser.dask.DESERIALIZERS)) as client:
            before = gser.dask.stats()
            check(workloads(client), reference)
            assert gser.dask.stats()["loads"] > before["loads"]
    finally:
        gser.dask.unregister()


@pytest.mark.skipif(not gser.HAVE_UCX, reason="gser built without gser::ucx (libucx-dev)")
def test_workloads_on_gser_protocol_without_pickle(reference):
    from distributed import Client, LocalCluster

    with LocalCluster(n_workers=2, threads_per_worker=1, processes=True, protocol="gser", host="127.0.0.1",
                      dashboard_address=None) as cluster, \
         Client(cluster, serializers=list(gser.dask.SERIALIZERS),
                deserializers=list(gser.dask.DESERIALIZERS)) as client:
        check(workloads(client), reference)
        # the shuffle's pieces went worker to worker through gser
        stats = client.run(gser.dask.stats)
        assert all(s["loads"] > 0 for s in stats.values()), stats
