"""localrun: fast local text generation with llama.cpp."""

from localrun import openmp
from localrun.runtime.load import runnable_others
from localrun.system import cpu_count, default_threads

__version__ = "0.1.0"  # the one place the version is written (pyproject.toml reads it)

# chosen when a run first imports llama_cpp, not here (see localrun/openmp.py)
openmp.before_llama(load=runnable_others, spare=lambda: max(0, cpu_count() - default_threads()))
