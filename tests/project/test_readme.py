"""The README stays true to the code: every setting with its default, every engine path it names,
every error code the API can answer."""

import pathlib
import re

from engine.extensions import SETTINGS
from tests.support import paths

ROOT = pathlib.Path(paths.ROOT)
README = (ROOT / 'README.md').read_text()
QUOTED = set(re.findall(r'`([^`\n]+)`', README))


def test_every_setting_has_a_table_row_with_its_default():
    rows = set(re.findall(r'^\| `(AIJOB_\w+)` \| (.+?) \|', README, re.M))
    wanted = {(s.env, '`%s`' % s.default if s.default else 'unset') for s in SETTINGS}
    assert sorted(wanted - rows) == []


def test_every_engine_path_named_exists():
    paths = sorted(text for text in QUOTED if text.startswith('engine/'))
    assert paths, 'the README names no engine path'
    assert [path for path in paths if not (ROOT / path).exists()] == []


def test_every_public_error_code_is_documented():
    from engine.core.errors import public_error_codes

    missing = [
        '%d %s' % (status, code)
        for status, codes in sorted(public_error_codes().items())
        for code in codes
        if code not in QUOTED
    ]
    assert missing == []


def layout_paths():
    """The paths the README's Layout block lists, folders included (``engine/core/``)."""
    section = README.split('## Layout', 1)[1].split('\n## ', 1)[0]
    paths, stack = [], []
    for line in section.splitlines():
        if not line.startswith('    ') or not line.strip():
            continue
        depth = (len(line) - len(line.lstrip(' ')) - 4) // 2
        name = line.split()[0]
        stack[depth:] = [name]
        paths.append(''.join(stack))
    return paths


def test_the_layout_lists_every_module_and_nothing_else():
    listed = layout_paths()
    modules = {
        str(path.relative_to(ROOT))
        for path in (ROOT / 'engine').rglob('*.py')
        if path.name != '__init__.py'
    }
    assert sorted(modules - set(listed)) == [], 'modules the Layout leaves out'
    assert [path for path in listed if not (ROOT / path).exists()] == [], 'entries not in the tree'


def test_ci_runs_the_readme_s_test_commands_verbatim():
    """`.ci/run` ends with the README's whole-suite command (the first command of "Commands"),
    and the everyday run the README names selects by the marker pytest.ini registers."""
    commands = README[README.index('## Commands') :]
    whole = re.search(r'^    (.*python -m pytest)$', commands, re.M).group(1)
    ci = (ROOT / '.ci' / 'run').read_text().strip().splitlines()
    assert ci[-1] == whole
    assert '    python -m pytest -m "not slow"\n' in commands
    assert re.search(r'^    slow: ', (ROOT / 'pytest.ini').read_text(), re.M)
