"""Render chat answers from `chat_templates/*.jinja`."""

from __future__ import annotations

from pathlib import Path

import jinja2

from engine import Segment, Task, TranscriptionResult

from .formatting import language_name

TEMPLATE_DIR = Path(__file__).resolve().parents[1] / "chat_templates"
DEFAULT_TEMPLATE = TEMPLATE_DIR / "transcript.jinja"


class ChatTemplate:
    """One Jinja template, loaded (and syntax-checked) once at start-up."""

    def __init__(self, path: Path | None = None):
        self.path = Path(path or DEFAULT_TEMPLATE)
        env = jinja2.Environment(
            loader=jinja2.FileSystemLoader(self.path.parent),
            undefined=jinja2.StrictUndefined,  # a typo in a template is a start-up or request error, not ""
            autoescape=False,  # plain text, not HTML
        )
        self.template = env.get_template(self.path.name)
        self.incremental = self._renders_in_order()

    def _renders_in_order(self) -> bool:
        """Whether a stream can send the answer as the transcript grows: the template's text for the first
        segments is the beginning of its text for more, and does not depend on the language (known at the end)."""
        first = Segment(0, 0, 0.0, 1.0, " One.", [], 0.0, 0.0, 1.0, 0.0)
        second = Segment(1, 0, 1.0, 2.0, " Two.", [], 0.0, 0.0, 1.0, 0.0)

        def text(segments: list[Segment], language: str) -> str:
            result = TranscriptionResult("".join(s.text for s in segments), segments, language, 2.0)
            return self.render(result, Task.TRANSCRIBE, "")

        try:
            one = text([first], "en")
            return one == text([first], "de") and text([first, second], "en").startswith(one)
        except jinja2.TemplateError:
            return False

    def render(self, result: TranscriptionResult, task: Task, instruction: str) -> str:
        language = "en" if task is Task.TRANSLATE else result.language
        return self.template.render(
            text=result.text.strip(),
            task=task.value,
            language=language,
            language_name=language_name(language),
            duration=result.duration,
            segments=result.segments,
            instruction=instruction,
        ).strip()
