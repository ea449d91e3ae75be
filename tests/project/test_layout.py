"""The import arrows go one way. The kernel: core at the bottom; execution on core; dispatch on
both; the job types on core and execution; http (the job API) on those. The features above the
kernel, each importing another only where its ``USES`` says so; extensions (the installed list)
above the features; runtime above them; the server and bench on top; aijob.py above all. Every
import counts, function-level ones too (docs/architecture.md, "Layout")."""

import ast
import pathlib

from tests.support import paths

ROOT = pathlib.Path(paths.ROOT)

# What each part may import from the engine (besides itself).
KERNEL = {'core', 'execution', 'dispatch', 'jobtypes', 'http'}
ALLOWED = {
    'core': set(),
    'execution': {'core'},
    'dispatch': {'core', 'execution'},
    'jobtypes': {'core', 'execution'},
    'http': {'core', 'execution', 'dispatch'},
    'features': KERNEL,
    'extensions': KERNEL | {'features'},
    'runtime': KERNEL | {'features', 'extensions'},
    'server': KERNEL | {'runtime', 'extensions'},
    'bench': KERNEL | {'runtime', 'features', 'extensions'},
}


def part_of(module):
    """'engine.core.store' -> 'core'; 'engine.runtime' -> 'runtime'."""
    return module.split('.')[1] if module.startswith('engine.') else None


def engine_imports(path):
    """The engine modules a file imports, resolved to absolute names."""
    module = '.'.join(path.relative_to(ROOT).with_suffix('').parts)
    package = module.rsplit('.', 1)[0] if path.name != '__init__.py' else module
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            yield from (alias.name for alias in node.names if alias.name.startswith('engine'))
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split('.')[: len(package.split('.')) - node.level + 1]
                name = '.'.join(base + ([node.module] if node.module else []))
            else:
                name = node.module or ''
            if name.startswith('engine'):
                yield name


def test_no_module_imports_a_higher_part_of_the_engine():
    wrong = []
    for path in sorted((ROOT / 'engine').rglob('*.py')):
        here = part_of('.'.join(path.relative_to(ROOT).with_suffix('').parts))
        for imported in engine_imports(path):
            there = part_of(imported)
            if there and there != here and there not in ALLOWED.get(here, set()):
                wrong.append('%s imports %s' % (path.relative_to(ROOT), imported))
    assert wrong == []


def feature_of(module):
    """'engine.features.budgets.guard' -> 'budgets'; None outside engine/features/."""
    parts = module.split('.')
    return parts[2] if len(parts) > 2 and parts[1] == 'features' else None


def declared_uses(feature):
    """The features ``feature``'s __init__ says it imports (its ``USES``)."""
    tree = ast.parse((ROOT / 'engine' / 'features' / feature / '__init__.py').read_text())
    for node in tree.body:
        if isinstance(node, ast.Assign) and [t.id for t in node.targets] == ['USES']:
            return set(ast.literal_eval(node.value))
    raise AssertionError('engine/features/%s/__init__.py declares no USES' % feature)


def test_a_feature_imports_another_only_where_it_says_so():
    wrong = []
    for path in sorted((ROOT / 'engine' / 'features').rglob('*.py')):
        here = feature_of('.'.join(path.relative_to(ROOT).with_suffix('').parts))
        if here is None:
            continue
        for imported in engine_imports(path):
            there = feature_of(imported)
            if there and there != here and there not in declared_uses(here):
                wrong.append('%s imports %s' % (path.relative_to(ROOT), imported))
    assert wrong == []


def test_every_feature_is_installed_by_one_line():
    """Each feature folder's extension is in engine/extensions.py, and nothing else is."""
    from engine.extensions import INSTALLED

    folders = {
        path.name
        for path in (ROOT / 'engine' / 'features').iterdir()
        if (path / '__init__.py').exists()
    }
    installed = {type(extension).__module__.split('.')[2] for extension in INSTALLED}
    assert installed == folders


# The sibling folder a checkout of the team's workspace has and a clone does not; spelled in two
# parts so that this file does not name it itself.
OUTSIDE = '..' + '/shared'


def test_no_file_points_outside_the_repository():
    outside = []
    for path in ROOT.rglob('*'):
        if path.suffix in ('.py', '.md', '.sql', '.toml', '.txt') and '.git' not in path.parts:
            if OUTSIDE in path.read_text(errors='replace'):
                outside.append(str(path.relative_to(ROOT)))
    assert outside == []
