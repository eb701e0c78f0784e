"""The command line's help as it should read at any terminal width.

Typer keeps a docstring's line breaks (a paragraph wrapped at 88 columns in the source
then breaks mid-sentence at 80), shows ``<bool>`` beside every flag and writes a
required argument as ``{model}`` in the usage line. The command classes here join
each paragraph into one line (the help wraps it to the terminal), list a command by
its first sentence, show no type for a flag, a repeatable option's element type
(``<str>``, not ``<list[str]>``), and arguments in capitals: ``MODEL [FILE]``.

Typer cannot declare a repeatable option of several values each (``list[tuple[str,
str]]``): an option declared ``RepeatedValues`` takes here as many values as its metavar
names (``--pair FIRST SECOND``, repeatable), and each use arrives as a tuple.
"""

from __future__ import annotations

import inspect
import re

from typer.core import TyperArgument, TyperCommand, TyperGroup, TyperOption

# Typer releases differ here. Those that type their options (a ``type_descriptor``)
# keep a ``list[tuple]`` option's values together; older ones refuse a tuple annotation
# when the app is built (a GPU node's did, so no command ran there), but pass a
# ``list[str]`` option's click tuples through unchanged once ``_tidy`` sets its nargs.
RepeatedValues = (
    list[tuple] if "type_descriptor" in inspect.signature(TyperOption.__init__).parameters else list[str]
)


def reflow(text: str | None) -> str | None:
    """Each paragraph of ``text`` on one line (blank lines still part them)."""
    if not text:
        return text
    return "\n\n".join(" ".join(p.split()) for p in inspect.cleandoc(text).split("\n\n"))


def _element_type(param) -> str:
    """``<str>`` for a ``list[str]`` option: typer 0.29 displays its type, 0.27 (a GPU
    node's) keeps click's (``text`` for a str)."""
    if hasattr(param, "display_type"):
        return re.sub(r"^<list\[(.*)\]>$", r"<\1>", param.display_type(None))
    name = {"text": "str", "integer": "int"}.get(param.type.name, param.type.name)
    return f"<{name}>"


def _tidy(param) -> None:
    if isinstance(param, TyperArgument) and param.metavar is None:
        param.metavar = param.name.upper()
    elif isinstance(param, TyperOption) and param.multiple and len((param.metavar or "").split()) > 1:
        param.nargs = len(param.metavar.split())
    elif isinstance(param, TyperOption) and param.metavar is None:
        if param.is_flag:
            param.metavar = ""
        elif param.multiple:
            param.metavar = _element_type(param)


class _Tidy:
    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.help = reflow(self.help)
        if self.help and not self.short_help:
            self.short_help = re.split(r"(?<=[.!?])\s", self.help.split("\n\n")[0], maxsplit=1)[0]
        for param in self.params:
            _tidy(param)

    def get_help_option(self, ctx):
        option = super().get_help_option(ctx)
        if option is not None:
            _tidy(option)
        return option

    def collect_usage_pieces(self, ctx) -> list[str]:
        return [re.sub(r"^\{(.*)\}", r"\1", piece) for piece in super().collect_usage_pieces(ctx)]


class Command(_Tidy, TyperCommand):
    """A command whose help reads cleanly (see the module's docstring)."""


class Group(_Tidy, TyperGroup):
    """The command group, likewise."""
