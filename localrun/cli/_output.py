"""What a command shows besides the model's text: results on stdout, notes
and warnings on stderr, JSON and tables, through the current Environment."""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, Any

from localrun.cli._env import Environment, current

if TYPE_CHECKING:
    from rich.console import Console

    from localrun.ui.stream import Renderer

PIPE_WIDTH = 200  # tables into a pipe are not squeezed to 80 columns


class Output:
    def __init__(self, env: Environment | None = None) -> None:
        self.env = env or current()

    def result(self, text: str) -> None:
        """A line the user asked for, on stdout."""
        self.env.stdout.write(text + "\n")

    def json(self, record: Any, *, indent: int | None = None) -> None:
        self.env.stdout.write(json.dumps(record, indent=indent) + "\n")

    def note(self, text: str) -> None:
        self.env.stderr.write(text + "\n")

    def warn(self, text: str) -> None:
        self.env.stderr.write(f"warning: {text}\n")

    def table(self, *renderables: object) -> None:
        """Rich renderables on stdout, each line without the padding Rich leaves at its end."""
        console = self._console()
        with console.capture() as captured:
            for renderable in renderables:
                console.print(renderable)
        self.env.stdout.write("".join(line.rstrip() + "\n" for line in captured.get().splitlines()))

    def _console(self) -> Console:
        """A Rich console on stdout: the terminal's width, or PIPE_WIDTH into a pipe."""
        from rich.console import Console

        return Console(file=self.env.stdout, width=None if self.env.stdout_isatty else PIPE_WIDTH)


def out() -> Output:
    return Output(current())


def pick_renderer(
    as_json: bool,
    show_stats: bool,
    title: str,
    settings: dict[str, object] | None = None,
    *,
    show_thinking: bool = False,
) -> Renderer:
    """How generated text is shown, for local and remote runs alike: JSON, a
    live view on a terminal (a reasoning model's thinking in its own dimmed
    section), or plain text (the answer alone unless ``show_thinking``)."""
    from rich.console import Console

    from localrun.ui.stream import JsonRenderer, LiveRenderer, PlainRenderer

    env = current()
    if as_json:
        return JsonRenderer(env.stdout, settings=settings)
    if env.stdout_isatty:
        return LiveRenderer(Console(file=env.stdout), title=title)
    return PlainRenderer(env.stdout, env.stderr, show_stats=show_stats, show_thinking=show_thinking)
