"""BatchApi (engine/features/batches/api.py) against the fake OpenAI batch API: the `openai`
package's real files and batches calls over loopback HTTP, every failure a BatchApiError."""

import json

import openai
import pytest

from engine.features.batches.api import BatchApi, BatchApiError
from tests.support.fake_openai import json_reply


def jsonl(custom_ids):
    """A batch input file as the batcher writes it: one chat completion request per line."""
    lines = [
        {
            'custom_id': custom_id,
            'method': 'POST',
            'url': '/v1/chat/completions',
            'body': {
                'model': 'fake-model',
                'messages': [{'role': 'user', 'content': 'line %s' % custom_id}],
                'response_format': {'type': 'json_object'},
            },
        }
        for custom_id in custom_ids
    ]
    return b''.join(json.dumps(line).encode() + b'\n' for line in lines)


@pytest.fixture
def api(batch_fake):
    return BatchApi(batch_fake.base_url, 'sk-test', timeout_s=5.0)


def submit(api, row_id, custom_ids):
    file_id = api.upload('aijob-%s.jsonl' % row_id, jsonl(custom_ids))
    return api.create(file_id, row_id)


def by_custom_id(lines):
    return {line['custom_id']: line for line in lines}


def test_upload_then_find_file_across_pages(api, batch_fake):
    batch_fake.page_limit = 2  # the server pages files two at a time
    ids = [api.upload('aijob-%d.jsonl' % n, jsonl(['%d:1' % n])) for n in range(1, 6)]

    assert api.find_file('aijob-1.jsonl') == ids[0]  # the oldest: on the last page
    assert api.find_file('aijob-5.jsonl') == ids[4]
    assert api.find_file('aijob-9.jsonl') is None
    assert [u['filename'] for u in batch_fake.uploads] == [
        'aijob-%d.jsonl' % n for n in range(1, 6)
    ]
    assert batch_fake.uploads[0]['content'] == jsonl(['1:1'])


def test_create_then_find_batch_across_pages(api, batch_fake):
    batch_fake.page_limit = 2
    created = [submit(api, row_id, ['%d:1' % row_id, '%d:2' % row_id]) for row_id in range(1, 6)]

    assert created[0]['status'] == 'validating'
    assert created[0]['request_counts'] == {'total': 2, 'completed': 0, 'failed': 0}
    assert created[0]['metadata'] == {'aijob_batch': '1'}
    assert api.find_batch(1)['id'] == created[0]['id']  # the oldest: on the last page
    assert api.find_batch(4)['input_file_id'] == created[3]['input_file_id']
    assert api.find_batch(77) is None
    expected = ['%d:%d' % (row_id, call) for row_id in range(1, 6) for call in (1, 2)]
    assert batch_fake.submitted_custom_ids == expected


def test_auto_mode_walks_the_states_and_answers_every_line(api, batch_fake):
    batch_fake.script(json_reply({'answer': 42}))
    batch = submit(api, 1, ['a:1', 'b:1'])

    statuses = [api.retrieve(batch['id'])['status'] for _ in range(4)]

    assert statuses == ['in_progress', 'finalizing', 'completed', 'completed']
    done = api.retrieve(batch['id'])
    assert done['request_counts'] == {'total': 2, 'completed': 2, 'failed': 0}
    assert done['error_file_id'] is None
    lines = by_custom_id(api.lines(done['output_file_id']))
    assert sorted(lines) == ['a:1', 'b:1']
    response = lines['a:1']['response']
    assert response['status_code'] == 200 and lines['a:1']['error'] is None
    completion = response['body']
    assert completion['object'] == 'chat.completion'
    assert json.loads(completion['choices'][0]['message']['content']) == {'answer': 42}
    assert completion['usage'] == {'prompt_tokens': 11, 'completion_tokens': 7, 'total_tokens': 18}


def test_failed_lines_go_to_the_error_file(api, batch_fake):
    batch_fake.answer = lambda body: {'echo': body['messages'][0]['content']}
    batch_fake.fail_line('b:1')
    batch_fake.fail_line(lambda line: line['custom_id'].startswith('c'), 400, 'invalid_prompt')
    batch = submit(api, 1, ['a:1', 'b:1', 'c:1'])

    batch_fake.mode = 'manual'
    batch_fake.set_status(batch['id'], 'completed')
    done = api.retrieve(batch['id'])

    assert done['request_counts'] == {'total': 3, 'completed': 1, 'failed': 2}
    output = by_custom_id(api.lines(done['output_file_id']))
    content = output['a:1']['response']['body']['choices'][0]['message']['content']
    assert json.loads(content) == {'echo': 'line a:1'}
    errors = by_custom_id(api.lines(done['error_file_id']))
    assert errors['b:1']['response']['status_code'] == 500
    assert errors['b:1']['response']['body']['error']['code'] == 'server_error'
    assert errors['c:1']['response']['status_code'] == 400
    assert errors['c:1']['response']['body']['error']['code'] == 'invalid_prompt'


def test_manual_mode_stays_where_the_test_puts_it(api, batch_fake):
    batch_fake.mode = 'manual'
    batch = submit(api, 1, ['a:1'])
    assert [api.retrieve(batch['id'])['status'] for _ in range(3)] == ['validating'] * 3

    batch_fake.set_status(batch['id'], 'in_progress')
    assert [api.retrieve(batch['id'])['status'] for _ in range(3)] == ['in_progress'] * 3
    assert api.retrieve(batch['id'])['output_file_id'] is None

    batch_fake.set_status(batch['id'], 'finalizing')
    batch_fake.set_status(batch['id'], 'completed')
    assert api.retrieve(batch['id'])['output_file_id'] is not None


def test_cancel_goes_through_cancelling_to_cancelled(api, batch_fake):
    batch_fake.mode = 'manual'
    batch = submit(api, 1, ['a:1', 'b:1'])

    assert api.cancel(batch['id'])['status'] == 'cancelling'
    assert api.cancel(batch['id'])['status'] == 'cancelling'  # asking twice changes nothing
    cancelled = api.retrieve(batch['id'])

    assert cancelled['status'] == 'cancelled'
    assert batch_fake.cancelled_batch_ids == [batch['id']]
    errors = api.lines(cancelled['error_file_id'])
    assert [line['error']['code'] for line in errors] == ['batch_cancelled'] * 2


def test_cancelling_a_completed_batch_is_refused(api, batch_fake):
    batch_fake.mode = 'manual'
    batch = submit(api, 1, ['a:1'])
    batch_fake.set_status(batch['id'], 'completed')

    with pytest.raises(BatchApiError) as refused:
        api.cancel(batch['id'])

    assert (refused.value.status, refused.value.retryable) == (400, False)
    assert batch_fake.cancelled_batch_ids == []


def test_expire_answers_the_first_lines_and_fails_the_rest(api, batch_fake):
    batch = submit(api, 1, ['a:1', 'b:1', 'c:1', 'd:1'])

    batch_fake.expire(batch['id'], complete_first=1)
    expired = api.retrieve(batch['id'])

    assert expired['status'] == 'expired'
    assert expired['request_counts'] == {'total': 4, 'completed': 1, 'failed': 3}
    assert [line['custom_id'] for line in api.lines(expired['output_file_id'])] == ['a:1']
    errors = api.lines(expired['error_file_id'])
    assert [line['custom_id'] for line in errors] == ['b:1', 'c:1', 'd:1']
    assert all(line['response'] is None for line in errors)
    assert {line['error']['code'] for line in errors} == {'batch_expired'}


def test_a_failed_batch_says_why_and_has_no_files(api, batch_fake):
    batch_fake.mode = 'manual'
    batch = submit(api, 1, ['a:1'])

    batch_fake.set_status(batch['id'], 'failed')
    failed = api.retrieve(batch['id'])

    assert failed['status'] == 'failed'
    assert failed['errors'] == ['The batch failed.']
    assert failed['output_file_id'] is None and failed['error_file_id'] is None


def test_hooks_see_each_answer_before_it_is_sent(api, batch_fake):
    seen = []
    for event in ('upload', 'create_batch', 'retrieve_batch', 'content'):
        batch_fake.on(event, lambda obj, event=event: seen.append((event, obj['id'])))

    file_id = api.upload('aijob-1.jsonl', jsonl(['a:1']))
    batch = api.create(file_id, 1)
    for _ in range(3):
        done = api.retrieve(batch['id'])
    api.lines(done['output_file_id'])

    assert seen == [
        ('upload', file_id),
        ('create_batch', batch['id']),
        ('retrieve_batch', batch['id']),
        ('retrieve_batch', batch['id']),
        ('retrieve_batch', batch['id']),
        ('content', done['output_file_id']),
    ]


def test_a_raising_hook_loses_the_answer_but_not_the_work(api, batch_fake):
    def hang_up(obj):
        raise RuntimeError('the caller dies here')

    batch_fake.on('upload', hang_up)
    with pytest.raises(BatchApiError) as lost:
        api.upload('aijob-1.jsonl', jsonl(['a:1']))
    assert (lost.value.retryable, lost.value.status) == (True, None)
    file_id = api.find_file('aijob-1.jsonl')  # a resume finds the upload
    assert file_id == batch_fake.uploads[0]['id']

    batch_fake.on('create_batch', hang_up)
    with pytest.raises(BatchApiError):
        api.create(file_id, 1)
    assert api.find_batch(1)['input_file_id'] == file_id  # ... and the batch
    assert batch_fake.submitted_custom_ids == ['a:1']

    batch_fake.on('content', hang_up)
    for _ in range(3):
        done = api.retrieve(api.find_batch(1)['id'])
    with pytest.raises(BatchApiError) as unread:
        api.lines(done['output_file_id'])
    assert unread.value.retryable
    batch_fake.on('content', None)
    assert [line['custom_id'] for line in api.lines(done['output_file_id'])] == ['a:1']


@pytest.mark.parametrize('status', [500, 503, 429])
def test_a_server_error_or_rate_limit_is_retryable(api, batch_fake, status):
    batch_fake.refuse(status)

    with pytest.raises(BatchApiError) as refused:
        api.upload('aijob-1.jsonl', jsonl(['a:1']))

    assert (refused.value.status, refused.value.retryable) == (status, True)
    assert batch_fake.uploads == []  # a refused request changed nothing
    assert api.upload('aijob-1.jsonl', jsonl(['a:1']))  # the next one goes through


@pytest.mark.parametrize('status', [400, 404])
def test_a_client_error_is_not_retryable(api, batch_fake, status):
    batch_fake.refuse(status)

    with pytest.raises(BatchApiError) as refused:
        api.find_batch(1)

    assert (refused.value.status, refused.value.retryable) == (status, False)


def test_a_wrong_key_is_not_retryable(batch_fake):
    batch_fake.api_key = 'sk-right'

    with pytest.raises(BatchApiError) as refused:
        BatchApi(batch_fake.base_url, 'sk-wrong').find_file('aijob-1.jsonl')

    assert (refused.value.status, refused.value.retryable) == (401, False)
    assert BatchApi(batch_fake.base_url, 'sk-right').find_file('aijob-1.jsonl') is None


def test_an_input_file_cannot_be_downloaded(api):
    file_id = api.upload('aijob-1.jsonl', jsonl(['a:1']))

    with pytest.raises(BatchApiError) as refused:
        api.lines(file_id)

    assert (refused.value.status, refused.value.retryable) == (400, False)


def test_no_answer_is_retryable(batch_fake):
    api = BatchApi(batch_fake.base_url, 'sk-test', timeout_s=2.0)
    batch_fake.stop()

    with pytest.raises(BatchApiError) as unreachable:
        api.retrieve('batch_1')

    assert (unreachable.value.status, unreachable.value.retryable) == (None, True)
    batch_fake.restart()  # the fixture stops it again


def test_an_empty_id_is_refused_without_a_request(api):
    with pytest.raises(BatchApiError) as refused:
        api.retrieve('')
    assert not refused.value.retryable


def test_chat_completions_share_the_base_url(batch_fake):
    batch_fake.script(json_reply({'online': True}))
    client = openai.OpenAI(api_key='sk-test', base_url=batch_fake.base_url, max_retries=0)

    completion = client.chat.completions.create(
        model='fake-model', messages=[{'role': 'user', 'content': 'hi'}]
    )

    assert json.loads(completion.choices[0].message.content) == {'online': True}
