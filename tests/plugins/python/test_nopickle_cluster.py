"""The documented no-pickle client on a real LocalCluster (worker processes,
TCP): Client(serializers=gser.dask.SERIALIZERS,
deserializers=gser.dask.DESERIALIZERS), with gser.dask preloaded in the
scheduler and the workers (gser.dask.register(default=True) before the
cluster starts does what `--preload gser.dask` does). dask.bag, dask.array,
dask.dataframe and futures whose results are plain data, Python's standard
types among them, come back as they are computed in-process. The client
cannot unpickle: what it receives came through gser (or Dask's own "dask"
family), and the processes' gser counters say gser carried it."""

import datetime as dt
import decimal
import uuid

import pytest

import gser

pytest.importorskip("distributed")
np = pytest.importorskip("numpy")
db = pytest.importorskip("dask.bag")
da = pytest.importorskip("dask.array")

pytestmark = pytest.mark.filterwarnings("ignore::DeprecationWarning")

T0 = dt.datetime(2024, 1, 1, tzinfo=dt.timezone.utc)


def mixed(i):
    """A bag partition: floats, ints and strs (and None), 3,000 items."""
    return [(j * 0.5, j, f"s{j}", None)[j % 4] for j in range(i * 3000, (i + 1) * 3000)]


def record(j):
    return {"id": j, "name": f"n{j % 50}", "t": T0 + dt.timedelta(seconds=j),
            "price": decimal.Decimal(j) / 100, "tags": {j % 3, j % 5}, "key": ("x", j % 7)}


def std_result(i):
    """A task result of the standard types: datetimes, Decimals, sets, tuple keys, ..."""
    return {
        ("part", i): [T0 + dt.timedelta(minutes=j) for j in range(100)],
        "decimals": [decimal.Decimal(j) / 8 for j in range(50)],
        "set": set(range(i, i + 20)),
        "frozen": frozenset({("a", i), ("b", i)}),
        "big": 2**100 + i,
        "complex": complex(i, -i),
        "uuid": uuid.UUID(int=i),
        "span": (dt.date(2024, 1, 1), dt.timedelta(days=i), dt.time(12, i % 60)),
        "range": range(i),
    }


def test_no_pickle_client_runs_plain_data_workloads():
    from distributed import Client, LocalCluster

    import gser.dask

    gser.dask.register(default=True)  # the cluster's processes preload gser.dask
    try:
        with LocalCluster(n_workers=2, threads_per_worker=1, processes=True, dashboard_address=None,
                          host="127.0.0.1") as cluster, \
             Client(cluster, serializers=list(gser.dask.SERIALIZERS),
                    deserializers=list(gser.dask.DESERIALIZERS)) as client:
            assert "pickle" not in gser.dask.DESERIALIZERS
            assert all(client.run(gser.dask.registered).values())
            before = gser.dask.stats()["loads"]

            # dask.bag: partitions of mixed floats, ints and strs; a bag of
            # dicts; a bag of sets
            bag = db.from_sequence(range(8), npartitions=8).map_partitions(lambda p: [x for i in p for x in mixed(i)])
            got = bag.compute()
            assert got == [x for i in range(8) for x in mixed(i)]
            assert [type(x) for x in got[:4]] == [float, int, str, type(None)]
            recs = db.from_sequence(range(2000), npartitions=4).map(record)
            assert recs.compute() == [record(j) for j in range(2000)]
            by_name = recs.foldby("name", lambda acc, r: acc + r["price"], decimal.Decimal(0),
                                  lambda a, b: a + b, decimal.Decimal(0)).compute()
            assert dict(by_name) == {f"n{k}": sum((record(j)["price"] for j in range(2000) if j % 50 == k),
                                                  decimal.Decimal(0)) for k in range(50)}
            sets = db.from_sequence(range(100), npartitions=5).map(lambda j: {j, j + 1, ("t", j)})
            assert sets.compute() == [{j, j + 1, ("t", j)} for j in range(100)]
            assert recs.pluck("t").max().compute() == T0 + dt.timedelta(seconds=1999)

            # dask.array
            x = da.arange(200_000, chunks=25_000).reshape(400, 500)
            assert float((x * 2).sum().compute()) == float(np.arange(200_000).sum() * 2)
            assert np.array_equal((x + 1)[::7].compute(), (np.arange(200_000).reshape(400, 500) + 1)[::7])

            # futures whose results are the standard types
            futs = client.map(std_result, range(6), pure=False)
            assert client.gather(futs) == [std_result(i) for i in range(6)]
            assert client.submit(lambda: {(1, 2): {3}, (4,): frozenset()}, pure=False).result() == \
                {(1, 2): {3}, (4,): frozenset()}
            assert client.submit(lambda: [T0] * 50_000, pure=False).result() == [T0] * 50_000

            # dask.dataframe (pandas objects: gser._pandas)
            dd = pytest.importorskip("dask.dataframe")
            pd = pytest.importorskip("pandas")
            df = pd.DataFrame({"k": np.arange(4000) % 13, "v": np.arange(4000) * 0.25,
                               "t": pd.date_range("2024-01-01", periods=4000, freq="min")})
            g = dd.from_pandas(df, npartitions=4).groupby("k").v.sum().compute()
            pd.testing.assert_series_equal(g.sort_index(), df.groupby("k").v.sum().sort_index(),
                                           check_exact=False, rtol=1e-12)
            rows = dd.from_pandas(df, npartitions=4).t.max().compute()
            assert rows == df.t.max()

            # where the data went through gser: the client loaded gser
            # messages (it cannot unpickle), and so did the workers
            assert gser.dask.stats()["loads"] > before
            worker_stats = client.run(gser.dask.stats)
            assert all(s["dumps"] > 0 for s in worker_stats.values()), worker_stats
    finally:
        gser.dask.unregister()
