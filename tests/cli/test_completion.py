"""Shell completion honours the shell named, and refuses a name it does not know
without touching a file."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.helpers import cli


@pytest.fixture
def home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    home = tmp_path / "user"
    home.mkdir()
    monkeypatch.setenv("HOME", str(home))
    return home


def _files(home: Path) -> list[Path]:
    return sorted(p for p in home.rglob("*") if p.is_file())


def test_show_completion_prints_the_named_shells_script(home: Path) -> None:
    zsh = cli("--show-completion", "zsh")
    assert zsh.returncode == 0, zsh.stderr
    assert zsh.stdout.startswith("#compdef localrun") and "COMPREPLY" not in zsh.stdout
    bash = cli("--show-completion", "bash")
    assert "COMPREPLY" in bash.stdout and "_LOCALRUN_COMPLETE=complete_bash" in bash.stdout
    fish = cli("--show-completion=fish")
    assert fish.stdout.startswith("complete --command localrun")
    assert _files(home) == []


@pytest.mark.parametrize("option", ["--install-completion", "--show-completion"])
def test_an_unknown_shell_is_refused_and_nothing_is_written(home: Path, option: str) -> None:
    res = cli(option, "nosuchshell")
    assert res.returncode == 2
    assert res.stderr.splitlines()[0] == "error: unknown shell 'nosuchshell': nothing was installed"
    assert "hint: name one of: bash, zsh, fish" in res.stderr and res.stdout == ""
    assert _files(home) == []  # no ~/.bashrc, no script


def test_install_completion_writes_the_named_shells_files(home: Path) -> None:
    res = cli("--install-completion", "zsh")
    assert res.returncode == 0, res.stderr
    assert (home / ".zfunc" / "_localrun").read_text().startswith("#compdef localrun")
    assert "compinit" in (home / ".zshrc").read_text()
    assert not (home / ".bashrc").exists()
    assert "zsh completion installed in" in res.stderr
    assert f"2 lines added to {home / '.zshrc'}: `fpath+=~/.zfunc; autoload -Uz compinit; compinit`" in res.stderr


def test_install_completion_says_it_added_a_line_to_bashrc(home: Path) -> None:
    """A startup file of the user's is changed: said, with the line added; a second install adds none."""
    (home / ".bashrc").write_text("alias ll='ls -l'\n")
    res = cli("--install-completion", "bash")
    assert res.returncode == 0, res.stderr
    script = home / ".bash_completions" / "localrun.sh"
    assert "COMPREPLY" in script.read_text()
    assert (home / ".bashrc").read_text().startswith("alias ll='ls -l'\n")
    assert res.stderr == (
        f"bash completion installed in {script}; 1 line added to {home / '.bashrc'}: `source '{script}'`; "
        "it works in shells started from now on\n"
    )
    again = cli("--install-completion", "bash")
    assert again.returncode == 0 and "added to" not in again.stderr and "installed in" in again.stderr
