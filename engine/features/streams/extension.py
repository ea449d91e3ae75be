"""How the live text and the event streams join a runtime."""

import functools

from ...core.errors import TooManyStreamsError
from ...core.extension import Extension
from ...http.waiter import Watch
from . import stream
from .channel import TEXT, open_text_channel
from .pump import DeltaPump
from .routes import JobStreams
from .settings import SETTINGS, TOGETHER
from .text_feed import TextFeed


class StreamsExtension(Extension):
    """The job event streams and the live text: the pump among the engine's ``live_text`` (a
    sink per provider call), the stream route among the API's resources, and the pump and the
    channel stopped when the runtime closes."""

    name = 'streams'
    settings = SETTINGS
    together = TOGETHER

    def install(self, kernel, hooks, features):
        streams = LiveStreams(kernel.config, kernel.store)
        hooks.live_text.append(streams.pump)
        hooks.http_resources.append(functools.partial(JobStreams, streams))
        hooks.closers.append(streams.close)
        return streams


class LiveStreams:
    """The feature's handle (``runtime.features['streams']``): the channel the worker's pump
    writes the live text to and the streams read it from, the pump, and this process's text feed
    and watch of its open streams (capped like the long poll's waiters)."""

    def __init__(self, config, store):
        self.channel = open_text_channel(config)
        self.pump = DeltaPump(self.channel)
        self.feed = TextFeed(self.channel)
        self.watch = Watch(
            store,
            config.status_wait_poll_ms / 1000.0,
            config.max_streams,
            config.max_streams_per_user,
            read=stream.watch_reader(store),
            too_many=TooManyStreamsError,
        )

    def text_of(self, job_id):
        """The text of the job's latest attempt as the channel holds it now ('' when none; its
        beginning may be trimmed or expired). Raises a public error when Redis is away. Job
        output: show it only to whom may see the job, never log it."""
        entries = self.channel.read(job_id)
        latest = max((entry.attempt for entry in entries), default=None)
        return ''.join(e.text for e in entries if e.kind == TEXT and e.attempt == latest)

    def close(self):
        self.pump.stop()
        self.channel.close()
