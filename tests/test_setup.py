"""scripts/setup's source patches: applied when the sources are as expected, and a
stopped build, naming the patch, when a new llama-cpp-python version changed them."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import tarfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
PATCHER = ROOT / "scripts" / "_patch_sdist.py"
NO_AMX = "-mno-amx-tile -mno-amx-int8 -mno-amx-bf16"
COMMON_ON = 'set(LLAMA_BUILD_COMMON ON CACHE BOOL "Build llama.cpp common library" FORCE)'
COMMON_OFF = 'set(LLAMA_BUILD_COMMON OFF CACHE BOOL "Build llama.cpp common library" FORCE)'
NATIVE = "list(APPEND ARCH_FLAGS -march=native)"
GGML_CPU = Path("vendor/llama.cpp/ggml/src/ggml-cpu/CMakeLists.txt")


def _sdist_tree(src: Path, *, common: str = COMMON_ON, native: str = NATIVE) -> Path:
    """A source tree with the two lines the patches target, among lines like the real ones around them."""
    (src / GGML_CPU).parent.mkdir(parents=True)
    (src / "CMakeLists.txt").write_text(
        f"if (LLAMA_BUILD)\n    {common}\n    if (EMSCRIPTEN)\n        {COMMON_OFF}\n    endif()\nendif()\n"
    )
    (src / GGML_CPU).write_text(
        f"if (GGML_NATIVE)\n    {native}\nelse()\n    list(APPEND ARCH_FLAGS -march=native -mtune=native)\nendif()\n"
    )
    return src


def _patch(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, str(PATCHER), *args], capture_output=True, text=True, check=False)


def test_both_patches_apply_to_the_sources_they_were_written_for(tmp_path: Path) -> None:
    src = _sdist_tree(tmp_path / "src")
    done = _patch(str(src), f"--no-amx={NO_AMX}")
    assert done.returncode == 0, done.stderr
    top = (src / "CMakeLists.txt").read_text()
    assert COMMON_ON not in top
    assert top.count(COMMON_OFF) == 2
    cpu = (src / GGML_CPU).read_text()
    assert f"list(APPEND ARCH_FLAGS -march=native {NO_AMX})" in cpu
    assert "-march=native -mtune=native)" in cpu  # the other target's line is left alone


def test_the_amx_patch_is_left_out_on_cpus_without_amx(tmp_path: Path) -> None:
    src = _sdist_tree(tmp_path / "src", native="list(APPEND ARCH_FLAGS -march=znver9)")
    done = _patch(str(src))
    assert done.returncode == 0, done.stderr
    assert COMMON_ON not in (src / "CMakeLists.txt").read_text()


@pytest.mark.parametrize(
    ("tree", "name"),
    [
        ({"common": COMMON_ON.replace("common library", "common libraries")}, "LLAMA_BUILD_COMMON off"),
        ({"native": "list(APPEND ARCH_FLAGS -march=native -mfoo)"}, "AMX off"),
        ({"native": f"{NATIVE}\n    {NATIVE}"}, "AMX off"),  # twice: which one is meant is unknown
    ],
)
def test_a_patch_that_does_not_fit_stops_with_its_name_and_writes_nothing(
    tmp_path: Path, tree: dict[str, str], name: str
) -> None:
    src = _sdist_tree(tmp_path / "src", **tree)
    before = {p: p.read_text() for p in (src / "CMakeLists.txt", src / GGML_CPU)}
    done = _patch(str(src), f"--no-amx={NO_AMX}")
    assert done.returncode != 0
    assert f"patch {name!r}" in done.stderr
    assert "nothing was built" in done.stderr
    assert {p: p.read_text() for p in before} == before


def test_the_wheel_key_text_changes_with_the_patches() -> None:
    plain, amx = _patch("--key"), _patch("--key", f"--no-amx={NO_AMX}")
    assert plain.returncode == amx.returncode == 0
    assert COMMON_OFF in plain.stdout
    assert NO_AMX not in plain.stdout
    assert NO_AMX in amx.stdout


def test_setup_stops_before_building_when_a_new_version_moved_a_patched_line(tmp_path: Path) -> None:
    version = re.search(r'"llama-cpp-python==([0-9.]+)"', (ROOT / "pyproject.toml").read_text())
    assert version is not None
    name = f"llama_cpp_python-{version[1]}"
    src = _sdist_tree(tmp_path / name, common="# the common library is now built by default")
    house = tmp_path / "wheelhouse"
    (house / "sdist").mkdir(parents=True)
    with tarfile.open(house / "sdist" / f"{name}.tar.gz", "w:gz") as tar:
        tar.add(src, arcname=name)
    env = {**os.environ, "LOCALRUN_WHEELHOUSE": str(house), "PYTHON": sys.executable}
    done = subprocess.run(
        [str(ROOT / "scripts" / "setup")], capture_output=True, text=True, env=env, check=False, timeout=120
    )
    assert done.returncode != 0
    assert "patch 'LLAMA_BUILD_COMMON off'" in done.stderr
    assert not list(house.glob("llama-cpp-python-*/*.whl"))


def _stub(folder: Path, name: str, script: str) -> None:
    path = folder / name
    path.write_text(f"#!/bin/sh\n{script}\n")
    path.chmod(0o755)


def test_detect_prints_the_backend_and_why_and_builds_nothing(tmp_path: Path) -> None:
    """`scripts/setup --detect` on a copy of the project whose PATH has only
    stubs of the GPU tools (llvmpipe, Mesa's CPU-type Vulkan driver, beside
    glslc) and the shell tools setup reads with: no .venv, no wheelhouse."""
    import shutil

    project = tmp_path / "project"
    (project / "scripts").mkdir(parents=True)
    for name in ("scripts/setup", "scripts/_backend.py", "scripts/_patch_sdist.py", "pyproject.toml"):
        shutil.copy2(ROOT / name, project / name)
    tools = tmp_path / "bin"
    tools.mkdir()
    for tool in ("bash", "sed", "grep", "cut", "cat", "dirname", "ls", "sha256sum", "nproc", "getconf"):
        found = shutil.which(tool)
        if found:
            (tools / tool).symlink_to(found)
    _stub(tools, "uname", 'case "$1" in -s) echo Linux;; -m) echo x86_64;; esac')
    _stub(tools, "glslc", "exit 0")
    summary = "GPU0:\n\tdeviceType = PHYSICAL_DEVICE_TYPE_CPU\n\tdeviceName = llvmpipe (LLVM 15.0.6, 256 bits)\n"
    _stub(tools, "vulkaninfo", f"printf '{summary}'")
    house = tmp_path / "wheelhouse"
    env = {"PATH": str(tools), "PYTHON": sys.executable, "LOCALRUN_WHEELHOUSE": str(house), "HOME": str(tmp_path)}
    done = subprocess.run(
        ["bash", str(project / "scripts" / "setup"), "--detect"],
        capture_output=True,
        text=True,
        env=env,
        check=False,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr
    lines = dict(line.split(None, 1) for line in done.stdout.splitlines())
    assert lines["backend"] == "cpu"
    assert "llvmpipe" in lines["why"]
    assert "-DGGML_RPC=ON" in lines["cmake"] and "-DGGML_VULKAN=ON" not in lines["cmake"]
    assert lines["wheel"].startswith("not built yet")
    assert not (project / ".venv").exists()
    assert not house.exists()


IGNORED = "WARNING: Location 'file:///opt/pypi/simple/{}/' is ignored: it is neither a file nor a directory."
PIP_STANDIN = """#!/bin/bash
# python, except `-m pip` and `-m venv`: pip warns as a shared pip.conf makes it, and builds an empty wheel
if [ "$1" = -m ] && [ "$2" = pip ]; then
  for name in numpy typer llama-cpp-python; do printf '%s\\n' "{ignored}" | sed "s/{{}}/$name/" >&2; done
  echo "WARNING: a real warning" >&2
  if [ "$3" = wheel ]; then
    while [ "$#" -gt 0 ]; do
      [ "$1" = -w ] && mkdir -p "$2" && touch "$2/llama_cpp_python-{version}-py3-none-any.whl"
      shift
    done
  fi
  [ -z "${{PIP_FAILS:-}}" ] || {{ echo "ERROR: No matching distribution found" >&2; exit 1; }}
  exit 0
fi
if [ "$1" = -m ] && [ "$2" = venv ]; then mkdir -p "$3/bin" && cp "$0" "$3/bin/python" && exit 0; fi
exec {python} "$@"
"""


def _setup_with_a_noisy_pip(tmp_path: Path, **extra: str) -> subprocess.CompletedProcess[str]:
    """scripts/setup on a copy of the project, with a stand-in for pip (in
    PYTHON, then in the .venv it makes): no real build, no real install."""
    import shutil

    version = re.search(r'"llama-cpp-python==([0-9.]+)"', (ROOT / "pyproject.toml").read_text())
    assert version is not None
    project = tmp_path / "project"
    (project / "scripts").mkdir(parents=True)
    for name in ("scripts/setup", "scripts/_backend.py", "scripts/_patch_sdist.py", "pyproject.toml"):
        shutil.copy2(ROOT / name, project / name)
    name = f"llama_cpp_python-{version[1]}"
    house = tmp_path / "wheelhouse"
    (house / "sdist").mkdir(parents=True)
    with tarfile.open(house / "sdist" / f"{name}.tar.gz", "w:gz") as tar:
        tar.add(_sdist_tree(tmp_path / name), arcname=name)
    python = tmp_path / "python"
    python.write_text(PIP_STANDIN.format(ignored=IGNORED, version=version[1], python=sys.executable))
    python.chmod(0o755)
    env = {**os.environ, "LOCALRUN_WHEELHOUSE": str(house), "PYTHON": str(python), "LOCALRUN_BACKEND": "cpu", **extra}
    return subprocess.run(
        [str(project / "scripts" / "setup")], capture_output=True, text=True, env=env, check=False, timeout=120
    )


def test_setup_drops_pips_warnings_about_locations_that_are_not_here(tmp_path: Path) -> None:
    done = _setup_with_a_noisy_pip(tmp_path)
    assert done.returncode == 0, done.stderr
    assert "is ignored: it is neither a file nor a directory" not in done.stderr + done.stdout
    assert done.stderr.count("WARNING: a real warning") == 3  # the build and the two installs: pip's others stay
    assert "setup: ready:" in done.stderr


def test_setup_still_stops_on_pips_errors_and_shows_them(tmp_path: Path) -> None:
    done = _setup_with_a_noisy_pip(tmp_path, PIP_FAILS="1")
    assert done.returncode != 0
    assert "ERROR: No matching distribution found" in done.stderr
    assert "is ignored" not in done.stderr and "setup: ready:" not in done.stderr
