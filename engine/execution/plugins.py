"""The job-type plugin entry point: a module with ``register(app)`` brings a job type's
definition, its projector, its prompt templates, its tables and, if it needs one, its provider.

The built-in job types (engine.jobtypes) register through this same entry point, and so does
every module named in ``AIJOB_DEFINITIONS``.
"""

import importlib

from ..core.errors import InvalidDefinitionError


class PluginApp:
    """What ``register(app)`` receives: one ``add_*`` per kind of thing a job type may bring."""

    def __init__(self, config, registry, ai):
        self.config = config  # the parsed settings, read-only for plugins
        self.registry = registry
        self.ai = ai
        self.models = []  # peewee models whose tables `initdb` creates

    def add_job_type(self, definition):
        """A JobDefinition; validated now, so a bad one stops start-up."""
        self.registry.register(definition)

    def add_projector(self, projector):
        """A ResultProjector, found by its ``key`` from a definition's ``projector``."""
        self.ai.projectors.add(projector)

    def add_prompt(self, template):
        """A PromptTemplate for the OpenAI-compatible provider (and any provider sharing it)."""
        self.ai.prompts.add(template)

    def add_provider(self, provider):
        """A Provider, found by its ``key`` from a definition's ``provider``."""
        self.ai.providers.add(provider)

    def add_models(self, *models):
        """Tables of the plugin's own (a projector writing its own rows)."""
        self.models.extend(models)


def load_plugin(app, name):
    """Import the module ``name`` and call its ``register(app)``."""
    module = importlib.import_module(name)
    register = getattr(module, 'register', None)
    if not callable(register):
        raise InvalidDefinitionError('job type module %s has no register(app)' % name)
    register(app)
