"""The client of an OpenAI-compatible files and batches API (the Batch API of OpenAI, Azure OpenAI
and the hosts that copy it): upload a JSONL file, create, retrieve, list and cancel a batch, read a
result file. Every ``openai`` exception is translated here into ``BatchApiError``; none leaves this
module, and the answers are plain dicts so no ``openai`` type travels further either."""

import contextlib
import json
import logging

import openai

from ...core.errors import AiJobError
from ...core.logs import log_event

ENDPOINT = '/v1/chat/completions'  # the only endpoint aijob batches
COMPLETION_WINDOW = '24h'  # the only window OpenAI offers
METADATA_KEY = 'aijob_batch'  # the batch's metadata names our batch row, so a resume can find it
PAGE_SIZE = 100  # the largest page OpenAI's batch list accepts


class BatchApiError(AiJobError):
    """A files or batches call that failed. ``retryable``: the same call may succeed later (no
    answer, a timeout, 408, 429, 5xx); otherwise the provider refused it (4xx) or broke the
    protocol. ``status`` is the HTTP status, None when there was no answer."""

    code = 'PROVIDER_BATCH_ERROR'

    def __init__(self, message, retryable, status=None):
        super().__init__(message)
        self.retryable = retryable
        self.status = status


class BatchApi:
    def __init__(self, base_url, api_key, timeout_s=30.0):
        # max_retries=0: the batcher's own backoff decides when to try again.
        self._client = openai.OpenAI(
            api_key=api_key or 'unset', base_url=base_url, timeout=timeout_s, max_retries=0
        )

    def find_file(self, filename, since=None):
        """The id of an uploaded batch input file named ``filename``, or None. ``since`` (Unix
        seconds): the file cannot be older, so the listing (newest first) stops at the first
        file older than that instead of paging through every file the account ever made."""
        with _translated('list files'):
            for item in self._client.files.list(purpose='batch', limit=PAGE_SIZE, order='desc'):
                if since is not None and (item.created_at or 0) < since:
                    return None
                if item.filename == filename:
                    return item.id
        return None

    def upload(self, filename, jsonl):
        """Upload ``jsonl`` (bytes) as a batch input file; its file id."""
        with _translated('upload %s' % filename):
            return self._client.files.create(file=(filename, jsonl), purpose='batch').id

    def find_batch(self, aijob_batch_id, since=None):
        """The batch created for our batch row ``aijob_batch_id`` (its metadata), or None.
        ``since`` as in ``find_file``: OpenAI lists batches newest first."""
        wanted = str(aijob_batch_id)
        with _translated('list batches'):
            for batch in self._client.batches.list(limit=PAGE_SIZE):
                if since is not None and (batch.created_at or 0) < since:
                    return None
                if (batch.metadata or {}).get(METADATA_KEY) == wanted:
                    return _batch_dict(batch)
        return None

    def create(self, input_file_id, aijob_batch_id):
        """Create the batch of chat completions for an uploaded input file."""
        _require_id(input_file_id)
        with _translated('create batch'):
            batch = self._client.batches.create(
                input_file_id=input_file_id,
                endpoint=ENDPOINT,
                completion_window=COMPLETION_WINDOW,
                metadata={METADATA_KEY: str(aijob_batch_id)},
            )
        return _batch_dict(batch)

    def retrieve(self, provider_batch_id):
        _require_id(provider_batch_id)
        with _translated('retrieve batch %s' % provider_batch_id):
            return _batch_dict(self._client.batches.retrieve(provider_batch_id))

    def lines(self, file_id):
        """An output or error file's JSONL, one dict per line."""
        _require_id(file_id)
        with _translated('read file %s' % file_id):
            data = self._client.files.content(file_id).content
        return _parse_jsonl(file_id, data)

    def cancel(self, provider_batch_id):
        _require_id(provider_batch_id)
        with _translated('cancel batch %s' % provider_batch_id):
            return _batch_dict(self._client.batches.cancel(provider_batch_id))


@contextlib.contextmanager
def _translated(action):
    try:
        yield
    except openai.APIStatusError as exc:
        status = exc.status_code
        retryable = status in (408, 429) or status >= 500
        raise BatchApiError(
            '%s: HTTP %d: %s' % (action, status, _message(exc)), retryable, status
        ) from None
    except openai.APIConnectionError as exc:  # no answer (a timeout is one of these)
        raise BatchApiError('%s: %s' % (action, exc.__class__.__name__), True) from None
    except openai.OpenAIError as exc:  # an answer that is not the documented object
        raise BatchApiError('%s: %s' % (action, exc.__class__.__name__), False) from None


def _message(exc):
    body = exc.body if isinstance(exc.body, dict) else {}
    message = body.get('message') if isinstance(body.get('message'), str) else exc.message
    return (message or '')[:300]


def _require_id(value):
    # The openai package raises a bare ValueError for an empty id; keep to our one error.
    if not value:
        raise BatchApiError('an empty provider id', False)


def _parse_jsonl(file_id, data):
    """The lines that are JSON objects; any other line is skipped (logged by number, never its
    text), so one malformed line costs its own item (retried as a missing line) and not the
    file's answered lines."""
    lines = []
    for number, text in enumerate(data.splitlines(), 1):
        if not text.strip():
            continue
        try:
            line = json.loads(text)
        except ValueError:
            line = None
        if not isinstance(line, dict):
            log_event('batch.line_skipped', logging.WARNING, file_id=file_id, line=number)
            continue
        lines.append(line)
    return lines


def _batch_dict(batch):
    counts = batch.request_counts
    errors = (batch.errors.data or []) if batch.errors else []
    return {
        'id': batch.id,
        'status': batch.status,
        'input_file_id': batch.input_file_id,
        'output_file_id': batch.output_file_id,
        'error_file_id': batch.error_file_id,
        'request_counts': {
            'total': counts.total if counts else 0,
            'completed': counts.completed if counts else 0,
            'failed': counts.failed if counts else 0,
        },
        'metadata': dict(batch.metadata or {}),
        # Why a batch failed (validation): the provider's messages, for the operator.
        'errors': [error.message or error.code or '' for error in errors],
    }
