"""The import arrows go one way: core at the bottom; execution on core; dispatch on both; the job
types and the gateway on core and execution only; runtime and bench above them; http on top;
aijob.py above all. Every import counts, function-level ones too (docs/architecture.md,
"Layout")."""

import ast
import pathlib

ROOT = pathlib.Path(__file__).resolve().parent.parent

# What each part may import from the engine (besides itself).
ALLOWED = {
    'core': set(),
    'execution': {'core'},
    'dispatch': {'core', 'execution'},
    'jobtypes': {'core', 'execution'},
    'gateway': {'core', 'execution'},
    'extensions': {'core', 'execution', 'dispatch', 'gateway'},
    'runtime': {'core', 'execution', 'dispatch', 'gateway', 'extensions'},
    'bench': {'core', 'execution', 'dispatch', 'runtime', 'gateway'},
    'http': {'core', 'execution', 'dispatch', 'runtime', 'gateway'},
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
