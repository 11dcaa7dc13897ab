"""Chat's `/model NAME`: the session goes on with another model.

The model named is resolved first (an unknown name changes nothing), then
the one loaded is closed (memory for one model at a time) and the new one
loaded in its place; the conversation, the system prompt, the sampling
settings and the schema carry over. Where the new one does not load, the
previous one is loaded again and the session goes on with it.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any

from localrun.cli import _options as opt
from localrun.cli._output import out
from localrun.errors import LocalrunError, UsageError
from localrun.settings import MODEL_BOUND, SPEC_MODES, Options

if TYPE_CHECKING:
    from localrun.history.record import Recorder
    from localrun.runtime.chat import ChatSession
    from localrun.runtime.placement import Placement
    from localrun.settings import RunSettings

# chat's: the plan of the model named (with these options; whether replies follow a schema or grammar)
Resolve = Callable[[str, Options, bool], "opt.PlannedRun"]
# chat's: the settings a turn's record shows
Report = Callable[["RunSettings", "Placement", "ChatSession"], dict[str, Any]]

# a draft model named for one model is not another's, nor is its MTP head (the next model's auto uses its own)
KEPT_DRAFTS = (None, *(mode for mode in SPEC_MODES if mode not in MODEL_BOUND))


class NoModelLeft(LocalrunError):
    """/model NAME failed, and the model before it did not load again: nothing is loaded."""


@dataclass(frozen=True)
class Switched:
    """The session on the model now loaded, what the panel calls it, and the settings its turns record."""

    session: ChatSession
    title: str
    resolved: opt.PlannedRun
    failed: LocalrunError | None = None  # the model named did not load: the session is back on its previous one


class ModelSwitch:
    """Loads and closes chat's model: ``stack`` holds the one loaded (its
    engine and drafter), ``resolved`` its plan; called with a name and the
    session, it gives the session on the model named (``resolve`` plans it
    as chat plans its first)."""

    def __init__(
        self,
        resolved: opt.PlannedRun,
        stack: contextlib.ExitStack,
        options: Options,
        *,
        resolve: Resolve,
        report: Report,
        think: str,
        reasoning_budget: int | None,
        recorder: Recorder | None = None,
    ) -> None:
        self.resolved = resolved
        self.stack = stack
        self.options = replace(
            options,
            template=None,  # --template was the first model's
            draft=options.draft if options.draft in KEPT_DRAFTS else None,
        )
        self.resolve, self.turn_report = resolve, report
        self.think, self.reasoning_budget = think, reasoning_budget
        self.recorder = recorder

    def __call__(self, name: str, session: ChatSession) -> Switched:
        if not name:
            raise UsageError("/model needs a model's name", hint="/model NAME; localrun list shows the pulled ones")
        resolved = self.resolve(name, self.options, session.output is not None)
        previous = self.resolved
        self.stack.close()  # the model loaded goes first: memory for one
        try:
            return self._open(resolved, session)
        except (LocalrunError, OSError) as exc:
            self.stack.close()
            error = exc if isinstance(exc, LocalrunError) else LocalrunError(f"{name} did not load: {exc}")
            try:
                reopened = self._open(previous, session)
            except (LocalrunError, OSError) as again:
                raise NoModelLeft(
                    f"{name} did not load ({error.message}), nor did the model before it: {again}"
                ) from again
            return replace(reopened, failed=error)

    def _open(self, resolved: opt.PlannedRun, session: ChatSession) -> Switched:
        from localrun.cli import _history
        from localrun.cli._draft import open_draft

        opt.warn_past_training(resolved)
        opt.say_template(resolved, refused=True)
        title = opt.title(resolved)
        try:
            thinking = opt.thinking(self.think, self.reasoning_budget, resolved.info.chat_template, title)
        except UsageError as exc:  # --think off for a model that has no switch: the model's own way
            out().note(f"{exc.message}; {title} thinks as its template says")
            thinking = opt.thinking("auto", None, resolved.info.chat_template, title)
        engine = self.stack.enter_context(opt.load(resolved))
        speculation = self.stack.enter_context(open_draft(resolved, engine))
        fresh = opt.chat_session(
            resolved,
            engine,
            speculation,
            session.sampling,
            thinking,
            system=session.system,
            max_tokens=session.max_tokens,
            output=session.output,
        )
        fresh.turns, fresh.totals = session.turns, session.totals
        fresh.use_draft, fresh.prompt_tools = session.use_draft, session.prompt_tools
        self.resolved = resolved
        if self.recorder is not None:
            self.recorder.context = _history.context("chat", resolved, output=session.output, engine=engine)
        return Switched(fresh, title, resolved)

    def report(self, session: ChatSession) -> dict[str, Any]:
        """The settings a turn's record shows, for the model loaded now."""
        return self.turn_report(self.resolved.settings, self.resolved.config.placement, session)
