"""localrun: fast local text generation with llama.cpp."""

from localrun import openmp
from localrun.runtime.load import runnable_others
from localrun.system import cpu_count, default_threads

__version__ = "0.1.0"  # the one place the version is written (pyproject.toml reads it)

# before any module loads llama.cpp (see localrun/openmp.py)
openmp.configure(load=runnable_others, spare=lambda: max(0, cpu_count() - default_threads()))
