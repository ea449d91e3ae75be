"""JobDefinitionRegistry (contracts §2.2): every start-up rule, duplicates, unknown types, and
the plugin entry point."""

import dataclasses
import sys
import types

import pytest

from engine.core.errors import (
    DuplicateJobDefinitionError,
    InvalidCredentialPolicyError,
    InvalidDefinitionError,
    InvalidJobTypeError,
    InvalidPriorityError,
    InvalidQueueError,
    InvalidRetryPolicyError,
    InvalidTimeoutError,
    UnknownJobTypeError,
)
from engine.core.registry import (
    CredentialPolicy,
    JobDefinitionRegistry,
    Metadata,
    OutputSpec,
    QueuePolicy,
    RetryBackoff,
)
from engine.execution.services import build_ai_services
from engine.extensions import load_config
from engine.jobtypes.synthetic import SYNTHETIC_JOB_DEFINITION, synthetic_definition
from engine.runtime import load_job_types


def variant(**changes):
    return dataclasses.replace(synthetic_definition(job_type='variant'), **changes)


def execution(**changes):
    return dataclasses.replace(SYNTHETIC_JOB_DEFINITION.execution, **changes)


@pytest.mark.parametrize(
    'definition,error',
    [
        (variant(job_type='Upper'), InvalidJobTypeError),
        (variant(job_type='a'), InvalidJobTypeError),  # too short
        (variant(job_type='9lives'), InvalidJobTypeError),
        (variant(job_type='has-dash'), InvalidJobTypeError),
        (variant(job_type='x' * 65), InvalidJobTypeError),
        (variant(queue=QueuePolicy('ai-analysis')), InvalidQueueError),
        (variant(queue=QueuePolicy('ai-interactive', default_priority=101)), InvalidPriorityError),
        (variant(execution=execution(timeout_ms=999)), InvalidTimeoutError),
        (variant(execution=execution(timeout_ms=600_001)), InvalidTimeoutError),
        (variant(execution=execution(max_retries=-1)), InvalidRetryPolicyError),
        (
            variant(execution=execution(retry_backoff=RetryBackoff(delay=100, type='linear'))),
            InvalidRetryPolicyError,
        ),
        (variant(execution=execution(abort_strategy='ignore')), InvalidRetryPolicyError),
        (
            variant(credential=CredentialPolicy(allowed_modes=('magic',), default_mode='magic')),
            InvalidCredentialPolicyError,
        ),
        (
            variant(
                credential=CredentialPolicy(
                    allowed_modes=('platform_key',), default_mode='user_deepseek_key'
                )
            ),
            InvalidCredentialPolicyError,
        ),
        (variant(metadata=Metadata('x', 'y', 'gaming', '1')), InvalidDefinitionError),
        (variant(output=OutputSpec('v1', validator={'type': 'nonsense'})), InvalidDefinitionError),
    ],
)
def test_each_rule_rejects_with_its_own_error(definition, error):
    registry = JobDefinitionRegistry()
    with pytest.raises(error):
        registry.register(definition)
    assert registry.get_all() == []


@pytest.mark.parametrize('timeout_ms', [1_000, 600_000])
def test_timeout_bounds_are_inclusive(timeout_ms):
    JobDefinitionRegistry().register(variant(execution=execution(timeout_ms=timeout_ms)))


def test_duplicate_registration_is_refused():
    registry = JobDefinitionRegistry()
    registry.register(variant())
    with pytest.raises(DuplicateJobDefinitionError):
        registry.register(variant())


def test_unknown_job_type():
    with pytest.raises(UnknownJobTypeError) as raised:
        JobDefinitionRegistry().get('nope')
    assert raised.value.http_status == 400


def job_types(env):
    """The registry the plugins fill, as a process built from ``env`` would have it."""
    config = load_config(env)
    return load_job_types(config, JobDefinitionRegistry(), build_ai_services(config, None)).registry


def test_the_built_in_job_types_register_through_the_plugin_entry_point():
    registry = job_types({})
    assert registry.get('synthetic') is SYNTHETIC_JOB_DEFINITION
    assert SYNTHETIC_JOB_DEFINITION.execution.timeout_ms == 30_000
    assert registry.get('flashcard_generation').projector == 'flashcards'


def test_application_job_types_load_from_the_configured_modules(monkeypatch):
    for name, job_type in (('myapp_jobs', 'quiz_generation'), ('myapp_more', 'summary')):
        module = types.ModuleType(name)
        module.register = lambda app, t=job_type: app.add_job_type(variant(job_type=t))
        monkeypatch.setitem(sys.modules, name, module)
    registry = job_types({'AIJOB_DEFINITIONS': 'myapp_jobs, myapp_more'})
    assert {d.job_type for d in registry.get_all()} == {
        'synthetic',
        'flashcard_generation',
        'quiz_generation',
        'summary',
    }


def test_a_module_without_register_is_an_error(monkeypatch):
    monkeypatch.setitem(sys.modules, 'empty_mod', types.ModuleType('empty_mod'))
    with pytest.raises(InvalidDefinitionError):
        job_types({'AIJOB_DEFINITIONS': 'empty_mod'})
