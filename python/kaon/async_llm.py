"""AsyncLLM: asyncio front end. One Python thread waits on a waitset for every request's
outputs (the GIL is released while it waits) and hands them to each request's asyncio queue;
`generate` is an async generator of cumulative RequestOutputs, as vLLM's AsyncLLM yields them.
Leaving the generator early (break, cancellation) aborts the request."""
import asyncio
import ctypes as C
import itertools
import threading
from typing import AsyncIterator, Dict, Optional

from ._lib import lib
from .engine import Engine, Tracker
from .outputs import RequestOutput
from .sampling_params import SamplingParams


class _Stream:
    __slots__ = ("tracker", "loop", "queue", "done")

    def __init__(self, tracker, loop, queue):
        self.tracker, self.loop, self.queue, self.done = tracker, loop, queue, False


class AsyncLLM:
    def __init__(self, model: str, **engine_args):
        self.engine = Engine(model, **engine_args)
        self._ws = lib.kaon_waitset_create()
        self._lock = threading.Lock()   # guards _streams and every handle's free
        self._streams: Dict[int, _Stream] = {}
        self._tags = itertools.count(1)
        self._closed = False
        self._thread = threading.Thread(target=self._loop, name="kaon-async", daemon=True)
        self._thread.start()

    def _loop(self):
        tags = (C.c_uint64 * 256)()
        while not self._closed:
            got = lib.kaon_waitset_wait(self._ws, tags, 256, 500)
            for j in range(got):
                with self._lock:
                    st = self._streams.get(tags[j])
                    if st is None or not self.engine.drain(st.tracker):
                        continue
                    t = st.tracker
                    out = self.engine.result(t)
                    if t.finished:
                        self._finish(tags[j], st)
                try:
                    st.loop.call_soon_threadsafe(st.queue.put_nowait, out)
                except RuntimeError:  # its event loop is closed: nobody is listening
                    pass

    def _finish(self, tag, st):
        """Stops watching and frees a request (lock held)."""
        lib.kaon_waitset_remove(self._ws, st.tracker.handle)
        self.engine.release(st.tracker)
        st.done = True
        self._streams.pop(tag, None)

    async def generate(self, prompt, sampling_params: Optional[SamplingParams] = None,
                       request_id: Optional[str] = None) -> AsyncIterator[RequestOutput]:
        if self._closed:
            raise RuntimeError("kaon: AsyncLLM is shut down")
        t: Tracker = self.engine.submit(prompt, sampling_params, request_id)
        loop = asyncio.get_running_loop()
        st = _Stream(t, loop, asyncio.Queue())
        tag = next(self._tags)
        with self._lock:
            self._streams[tag] = st
            lib.kaon_waitset_add(self._ws, t.handle, tag)
        try:
            while True:
                out: RequestOutput = await st.queue.get()
                if out.finished and t.error:
                    raise RuntimeError(f"kaon: request {out.request_id} failed: {t.error}")
                yield out
                if out.finished:
                    return
        finally:
            with self._lock:
                if not st.done:  # left early: abort, and free it here
                    self._finish(tag, st)

    async def abort(self, request_id: str):
        with self._lock:
            for st in self._streams.values():
                if st.tracker.request_id == str(request_id) and st.tracker.handle:
                    lib.kaon_request_abort(st.tracker.handle)

    def get_tokenizer(self):
        from .llm import _Tokenizer
        return _Tokenizer(self.engine)

    def shutdown(self):
        if self._closed:
            return
        self._closed = True
        lib.kaon_waitset_wake(self._ws)
        self._thread.join()
        with self._lock:
            for tag, st in list(self._streams.items()):
                self._finish(tag, st)
        lib.kaon_waitset_destroy(self._ws)
        self.engine.close()

    async def __aenter__(self):
        return self

    async def __aexit__(self, *exc):
        self.shutdown()
