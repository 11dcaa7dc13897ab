"""localrun: fast local text generation with llama.cpp."""

from importlib.metadata import PackageNotFoundError, version

try:
    __version__ = version("localrun")
except PackageNotFoundError:  # run from a checkout that is not installed
    __version__ = "0+unknown"
