"""The live text and event streams as a feature (engine/features/streams/, docs/architecture.md
"Extensions"): the kernel's ``live_text`` and ``closers`` hook points, an engine without the
feature, and the feature's handle."""

import json

import pytest

from engine.core.extension import Extension
from engine.core.registry import JobDefinitionRegistry
from engine.extensions import INSTALLED
from engine.features.streams.extension import StreamsExtension
from engine.jobtypes.flashcards import flashcard_definition
from engine.runtime import Runtime
from tests.support.api import JOBS, Harness
from tests.support.backends import reset_tables
from tests.support.fake_openai import json_reply
from tests.support.runtimes import FAST_SETTINGS, wait_terminal

CARDS = {'cards': [{'question': 'The capital of France?', 'answer': 'Paris'}]}
WITHOUT_STREAMS = tuple(e for e in INSTALLED if not isinstance(e, StreamsExtension))


class Sink:
    def __init__(self, job_id):
        self.job_id, self.text, self.closed = job_id, '', False

    def write(self, text):
        assert not self.closed
        self.text += text

    def close(self):
        self.closed = True


class Following(Extension):
    """A feature that follows the live text (a sink per provider call) and has a closer."""

    name = 'following'

    def __init__(self):
        self.sinks = []
        self.closes = 0

    def install(self, kernel, hooks, features):
        hooks.live_text.append(self)
        hooks.closers.append(self.close)
        return self

    def open(self, job_id):
        self.sinks.append(Sink(job_id))
        return self.sinks[-1]

    def close(self):
        self.closes += 1


@pytest.fixture
def flashcards_runtime(backend, fake):
    """Build a runtime of the given extensions whose flashcard jobs call the fake provider."""
    made = []

    def make(extensions):
        registry = JobDefinitionRegistry()
        registry.register(flashcard_definition(timeout_ms=20_000, max_retries=0))
        config = backend.config(
            AIJOB_PROVIDER_BASE_URL=fake.base_url,
            AIJOB_PROVIDER_MODEL='fake-model',
            AIJOB_PLATFORM_API_KEY='sk-platform-feature-0000',
            **FAST_SETTINGS,
        )
        runtime = Runtime(config, role='test', registry=registry, extensions=extensions)
        made.append(runtime)
        runtime.create_schema()
        reset_tables(runtime)
        return runtime

    yield make
    for runtime in made:
        runtime.close()


def run_flashcards(api):
    body = {
        'jobType': 'flashcard_generation',
        'targetType': 'note',
        'targetId': 'n1',
        'input': {'text': 'Paris is the capital of France.', 'maxCards': 5},
    }
    job_id = api.a.post(JOBS, body).json['jobId']
    api.runtime.start_background()
    try:
        with api.runtime.store.connection():
            assert wait_terminal(api.runtime, job_id).lifecycle_status == 'succeeded'
    finally:
        api.runtime.stop_background(timeout_s=5)
    return job_id


@pytest.mark.slow  # a worker and the fake provider
def test_the_engine_opens_a_sink_per_streamed_call_with_each_follower(flashcards_runtime, fake):
    fake.script(json_reply(CARDS, chunks=10))
    following = Following()
    runtime = flashcards_runtime(WITHOUT_STREAMS + (following,))
    api = Harness(runtime)
    job_id = run_flashcards(api)
    (sink,) = following.sinks
    assert (sink.job_id, sink.text, sink.closed) == (job_id, json.dumps(CARDS), True)
    runtime.close()
    assert following.closes == 1


@pytest.mark.slow  # a worker and the fake provider
def test_without_the_feature_a_streamed_call_runs_and_there_is_no_stream(flashcards_runtime, fake):
    fake.script(json_reply(CARDS, chunks=10))
    runtime = flashcards_runtime(WITHOUT_STREAMS)
    assert runtime.hooks.live_text == [] and 'streams' not in runtime.features
    api = Harness(runtime)
    job_id = run_flashcards(api)
    assert api.a.get(JOBS + '/' + job_id + '/stream').status == 404
    assert '/api/ai/jobs/{jobId}/stream' not in api.app_document()['paths']


def test_the_handle_gives_the_text_of_the_latest_attempt(make_runtime):
    streams = make_runtime().features['streams']
    assert streams.text_of('job-none') == ''
    begun = streams.channel.append_many(
        [('job-1', None, 0, 'The capital '), ('job-1', 1, 12, 'is')]
    )
    assert begun == [1, 1]
    assert streams.text_of('job-1') == 'The capital is'
    # A retry begins another attempt: its text replaces the first.
    assert streams.channel.append_many([('job-1', None, 0, 'Paris')]) == [2]
    assert streams.text_of('job-1') == 'Paris'
