"""Versioned prompt templates (PromptTemplateService): per job type, each version kept forever so
a job created with ``promptVersion`` "v1" renders the same prompt after "v2" ships. A rendered
prompt holds user content: it is sent to the provider and never logged."""

import json
from dataclasses import dataclass

from ..core.errors import ProviderRequestError

GENERIC = '*'  # the template for job types that have none of their own


@dataclass(frozen=True)
class PromptTemplate:
    job_type: str
    version: str
    system: str  # str.format fields: {schema}
    user: str  # str.format fields: the input's keys (after ``defaults``), {input_json}
    defaults: tuple = ()  # (name, value) pairs for optional input fields

    def render(self, input, output_schema=None, attempt=1):
        """Chat messages for ``input``. A retry (``attempt`` > 1) follows a failed attempt, often
        output that did not parse or validate (contracts §5.2: retry with an adjusted prompt)."""
        values = dict(self.defaults)
        values.update(input)
        values['input_json'] = json.dumps(input, ensure_ascii=False, sort_keys=True)
        system = self.system.format(
            schema=json.dumps(output_schema or {'type': 'object'}, sort_keys=True)
        )
        if attempt > 1:
            system += (
                '\nYour previous answer was not a JSON object matching the schema. '
                'Answer with the JSON object only.'
            )
        return [
            {'role': 'system', 'content': system},
            {'role': 'user', 'content': self.user.format_map(values)},
        ]


class PromptLibrary:
    def __init__(self, templates=()):
        self._versions = {}  # job_type -> {version: template}, in registration order
        for template in templates:
            self.add(template)

    def add(self, template):
        self._versions.setdefault(template.job_type, {})[template.version] = template

    def versions(self, job_type):
        """The versions a job of ``job_type`` may ask for: its own, else the generic ones."""
        return list(self._templates_for(job_type))

    def _templates_for(self, job_type):
        return self._versions.get(job_type) or self._versions.get(GENERIC) or {}

    def get(self, job_type, version=None):
        """The template ``version`` of ``job_type`` (default: the latest registered), else the
        generic template. An unknown version is a request the provider cannot serve."""
        versions = self._templates_for(job_type)
        if version is None:
            if not versions:
                raise ProviderRequestError('no prompt template for %s' % job_type)
            return list(versions.values())[-1]
        try:
            return versions[version]
        except KeyError:
            raise ProviderRequestError(
                'unknown promptVersion %r for %s' % (version, job_type),
                public_message='Unknown promptVersion %r.' % (version,),
            ) from None

    def render(self, request):
        """Messages for a ProviderRequest: its job type, promptVersion, input and attempt."""
        template = self.get(request.job_type, request.prompt_version)
        schema = getattr(getattr(request.definition, 'output', None), 'validator', None)
        return template.render(request.input, schema, request.attempt)


GENERIC_V1 = PromptTemplate(
    job_type=GENERIC,
    version='v1',
    system=(
        'You are a careful assistant inside an automated pipeline. Reply with one JSON '
        'object, and nothing else, that validates against this JSON Schema: {schema}'
    ),
    user='Input (JSON):\n{input_json}',
)


def default_library():
    return PromptLibrary([GENERIC_V1])
