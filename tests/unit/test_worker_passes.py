"""Realtime appends decoded in batched worker passes (server/realtime/passes.py, audio_input.decode_appends): many
sessions' appends in one pass off the event loop's thread, each session's audio what decoding it alone gives, and
one session's bad base64 its own error only."""

import asyncio
import base64
import threading

import numpy as np

from server.realtime.audio_input import AudioFormatError, InputAudio, decode_appends
from server.realtime.passes import WorkerPasses


def test_appends_of_many_sessions_decode_together_off_the_loop_and_in_order():
    rng = np.random.default_rng(0)
    chunks = [[(rng.standard_normal(2400) * 3000).astype("<i2").tobytes() for _ in range(5)] for _ in range(20)]
    alone = [np.concatenate([InputAudio("audio/pcm").append(b"".join(c))]) for c in chunks]
    threads: set[int] = set()
    passes = []

    def decode_recording_thread(work):
        threads.add(threading.get_ident())
        return decode_appends(work)

    async def body():
        appends = WorkerPasses(decode_recording_thread)
        loop_thread = threading.get_ident()

        async def session(pieces):
            audio = InputAudio("audio/pcm")
            out = []
            for piece in pieces:  # one append in flight per session, as a connection reads its events
                (samples,) = await appends.run((audio, [base64.b64encode(piece).decode()]))
                out.append(samples)
            return np.concatenate(out)

        original = asyncio.to_thread

        async def counting(fn, *args):
            passes.append(len(args[0]))
            return await original(fn, *args)

        asyncio.to_thread = counting
        try:
            got = await asyncio.gather(*(session(c) for c in chunks))
        finally:
            asyncio.to_thread = original
        return loop_thread, got

    loop_thread, got = asyncio.run(body())
    assert loop_thread not in threads
    for a, b in zip(got, alone):
        np.testing.assert_array_equal(a, b)  # a stream decoded in pieces is the stream decoded whole
    assert sum(passes) == 100 and max(passes) > 1  # 100 appends, several in one pass


def test_bad_base64_is_its_own_appends_error_and_the_stream_goes_on():
    async def body():
        appends = WorkerPasses(decode_appends)
        good, bad = InputAudio("audio/pcm"), InputAudio("audio/pcm")
        pcm = base64.b64encode(bytes(4800)).decode()
        return await asyncio.gather(appends.run((good, [pcm])), appends.run((bad, [pcm, "not base64!", pcm])))

    (ok,), (first, err, then) = asyncio.run(body())
    assert isinstance(ok, np.ndarray) and len(ok) > 1500 and isinstance(err, AudioFormatError)
    # the appends around the bad one are the stream two good appends make
    np.testing.assert_array_equal(np.concatenate([first, then]), InputAudio("audio/pcm").append(bytes(9600)))
