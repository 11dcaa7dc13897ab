"""localrun: fast local text generation with llama.cpp."""

from localrun import openmp
from localrun.runtime.load import runnable_others

__version__ = "0.1.0"  # the one place the version is written (pyproject.toml reads it)

openmp.configure(load=runnable_others)  # before any module loads llama.cpp (see localrun/openmp.py)
