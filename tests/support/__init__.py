"""Test support, one module per kind of fixture (conftest.py loads them as pytest plugins).

- ``tests.support.backends``: the backend pairs (``backend`` fixture), ``require_servers``,
  ``MYSQL_URL`` (this xdist worker's database), ``REDIS_URL``, ``WORKER``, ``delete_redis_keys``,
  ``reset_tables``.
- ``tests.support.runtimes``: runtimes on the backend: ``make_runtime``, ``runtime``,
  ``engine_rt`` / ``make_engine_rt`` (fast intervals and fast synthetic definitions),
  ``provider_runtime`` (a platform provider configured, unreachable), ``keyed_runtime`` (that plus a
  credential master key); ``FAST_SETTINGS``, ``fast_registry``, ``wait_terminal``, ``run_job``.
- ``tests.support.api``: the API harness: ``api``, ``keyed_api``, ``live_api``; ``Harness``,
  ``job_body``, ``poll_until``, ``run_to_running``, ``run_to_failed``, ``JOBS``, ``ADMIN_JOBS``.
- ``tests.support.fake_openai``: the loopback OpenAI-compatible server (``fake`` fixture),
  ``Reply``, ``json_reply``, ``error_reply``.
- ``tests.support.fake_batch_api``: the same server plus OpenAI's files and batches API
  (``batch_fake`` fixture, ``FakeBatchApi``): batch states a test drives, failed and expired lines,
  hooks before each reply.
- ``tests.support.dashboard``: ``FormClient`` (the dashboard in-process, with cookies and forms)
  and the ``chromium`` fixture (Playwright; a missing browser skips locally, fails under CI).
- ``tests.support.wsgi``: the in-process WSGI client and the OpenAPI response check.
- ``tests.support.worker_processes``: ``Worker`` (a real ``python aijob.py worker`` with its JSON
  log in a file) and the ``spawn`` fixture, which closes every worker it started.
- ``tests.support.rate_limited``: the rate-limit run of
  tests/features/rate_limits/test_ratelimit_processes.py and benchmarks/ratelimit_rate.py:
  ``limit_fake``, ``settings``, ``create_jobs``, ``CARDS``.
- ``tests.support.helpers``: ``create_job``, ``new_request``, ``wait_until``, ``run_threads``,
  ``row``.
"""
