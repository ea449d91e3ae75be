"""The runtime part of requirements.txt is complete: a fresh virtual environment with only those
lines installed (no test packages to bring a missing one along, as pytest brought `packaging`,
which gunicorn's gevent worker imports) runs `python aijob.py serve` to a healthy server."""

import os
import subprocess
import venv

import pytest

from tests.support.paths import ROOT
from tests.support.servers import free_port, http, wait_healthy

INSTALL_TIMEOUT_S = 600  # a bound on pip, should an index stall
START_TIMEOUT_S = 60


def runtime_lines():
    """The requirement lines between requirements.txt's '# Runtime' and '# Tests' headings."""
    lines, part = [], None
    with open(os.path.join(ROOT, 'requirements.txt')) as requirements:
        for line in requirements:
            line = line.strip()
            if line.startswith('#'):
                part = line.lstrip('# ').lower()
            elif line and part == 'runtime':
                lines.append(line)
    return lines


def bare_environment(**extra):
    """This process's environment without what could lend the venv another's packages, nor
    the aijob settings of the shell the tests run from."""
    skipped = ('PYTHONPATH', 'PYTHONHOME')
    env = {k: v for k, v in os.environ.items() if k not in skipped and not k.startswith('AIJOB_')}
    env.update(PYTHONNOUSERSITE='1', **extra)
    return env


@pytest.mark.slow
def test_serve_starts_from_the_runtime_requirements_alone(tmp_path):
    lines = runtime_lines()
    assert 'gunicorn==' in ' '.join(lines) and not any(line.startswith('pytest') for line in lines)
    folder = tmp_path / 'venv'
    venv.create(folder, with_pip=True)
    python = str(folder / 'bin' / 'python')
    runtime_txt = tmp_path / 'runtime.txt'
    runtime_txt.write_text('\n'.join(lines) + '\n')
    installed = subprocess.run(
        [python, '-m', 'pip', 'install', '--quiet', '-r', str(runtime_txt)],
        env=bare_environment(),
        capture_output=True,
        text=True,
        timeout=INSTALL_TIMEOUT_S,
    )
    assert installed.returncode == 0, installed.stderr[-4000:]

    port = free_port()
    log_path = tmp_path / 'serve.log'
    env = bare_environment(
        AIJOB_PORT=str(port), AIJOB_DATABASE_URL='sqlite:///%s' % (tmp_path / 'aijob.db')
    )
    with open(log_path, 'w') as log:
        proc = subprocess.Popen(
            [python, os.path.join(ROOT, 'aijob.py'), 'serve'],
            cwd=str(tmp_path),
            env=env,
            stdout=log,
            stderr=subprocess.STDOUT,
        )
    try:
        base = 'http://127.0.0.1:%d' % port
        wait_healthy(base, proc, timeout_s=START_TIMEOUT_S, log_path=log_path)
        assert http('GET', base + '/healthz').status == 200
    finally:
        proc.terminate()
        exit_code = proc.wait(30)
    assert exit_code == 0, log_path.read_text()
