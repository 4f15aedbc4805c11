"""A deserializer that raises while gser's objects hold buffers of the frames
it was given (Dask's log_errors keeps the traceback, and with it the
frames, in a reference cycle) must not crash the interpreter when the
cycle is collected. Each case runs in a child process: the failure this
guards against is a SIGSEGV."""

import os
import subprocess
import sys
import textwrap

import pytest

pytest.importorskip("numpy")
pytest.importorskip("distributed")

_CHILD = textwrap.dedent(
    """
    import asyncio, gc
    import numpy  # imported in every Dask process; gser then views frames through it
    import gser, gser.dask
    from distributed.protocol import to_serialize
    from distributed.protocol.cuda import cuda_deserialize, cuda_serialize
    from distributed.comm.utils import from_frames, to_frames
    from distributed.utils import log_errors

    class Boom:
        pass

    @cuda_serialize.register(Boom)
    def _ser(x):
        return {}, [memoryview(bytearray(b"x" * 100_000)), memoryview(bytearray(b"y" * 1000))]

    @cuda_deserialize.register(Boom)
    def _de(header, frames):
        with log_errors():  # as cuDF's and RMM's deserializers run
            raise AssertionError("the frames are not what this deserializer expects")

    async def main():
        frames = await to_frames({"x": to_serialize(Boom())}, serializers=("cuda",))
        # as gser.comm carries them: one gser message; the frames come back
        # as memoryviews over its memory, which holds the sent frames' buffers
        header, sent = gser.dumps([f if isinstance(f, bytes) else memoryview(f) for f in frames])
        got = gser.loads(header, sent)
        assert all(type(f) in (bytes, memoryview) for f in got), [type(f) for f in got]
        del header, sent, frames
        raised = 0
        for _ in range(3):
            try:
                await from_frames(got, deserializers=("cuda", "dask", "error"))
            except AssertionError as e:
                raised += 1
                print("raised:", e)
        assert raised == 3
        del got
        gc.collect()
        print("survived")

    asyncio.run(main())
    gc.collect()
    """
)


@pytest.mark.parametrize("device", ["emulated", "none"])
def test_raising_deserializer_does_not_crash(device, tmp_path):
    env = {**os.environ, "GSER_DEVICE": device}
    script = tmp_path / "raising_deserializer.py"  # a file: log_errors looks up the raising module
    script.write_text(_CHILD)
    p = subprocess.run([sys.executable, str(script)], env=env, capture_output=True, text=True, timeout=120)
    assert p.returncode == 0, p.stderr[-3000:]
    assert "survived" in p.stdout
    assert "Exception ignored in tp_clear" not in p.stderr, p.stderr[-3000:]
    assert "AssertionError: the frames are not what" in p.stderr  # log_errors logged it
