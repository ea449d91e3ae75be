"""Where the repository is, for tests that run its files (aijob.py, README.md, examples/)."""

import os

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
