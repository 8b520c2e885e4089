"""MkDocs hook: the reference pages generated from the code, so they cannot drift.

``docs/reference/cli.md`` holds the marker ``<!-- cli-reference -->``, replaced
by every command and option of :func:`evorl_pop.cli.build_parser`;
``docs/reference/config.md`` holds ``<!-- config-reference -->``, replaced by
every field of :class:`~evorl_pop.run.config.RunConfig` and of each registered
algorithm's config dataclass (type, default, meaning from the class's
``Attributes:`` docstring or the field's comment). The repository's
``figures/`` are served under ``figures/`` beside the pages.

:class:`ApiNames` is the griffe extension of the Python API pages: it puts the top-level
``algorithms/`` folder under its installed name ``evorl_pop.algorithms`` and turns the
docstrings' Sphinx roles and ``::`` literal blocks into Markdown (links and code blocks).
"""

from __future__ import annotations

import argparse
import dataclasses
import inspect
import re
import textwrap
import typing
from pathlib import Path

import griffe

ROOT = Path(__file__).resolve().parents[1]
CLI_MARKER = "<!-- cli-reference -->"
CONFIG_MARKER = "<!-- config-reference -->"


# --- the command line ---------------------------------------------------------------


def _cell(text: str) -> str:
    """Text for a table cell: one line, its pipes escaped, ``<...>`` shown as written
    (not taken for an HTML tag)."""
    text = " ".join(str(text).split()).replace("|", "\\|")
    return text.replace("<", "&lt;").replace(">", "&gt;")


def _subparsers(parser: argparse.ArgumentParser) -> dict[str, argparse.ArgumentParser]:
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            return dict(action.choices)
    return {}


def cli_options(parser: argparse.ArgumentParser) -> list[tuple[str, ...]]:
    """A parser's arguments: option strings (or the positional's name), help action left out."""
    rows = []
    for action in parser._actions:
        if isinstance(action, argparse._HelpAction | argparse._SubParsersAction):
            continue
        rows.append(tuple(action.option_strings) or (action.metavar or action.dest,))
    return rows


def _default_of(action: argparse.Action) -> tuple[str, str]:
    """``(meaning, default)`` of an option's row: its parser default, else the one its
    help names (``(default: X)``, taken out of the meaning); a flag that is off shows none."""
    meaning = action.help or ""
    default = action.default
    if default not in (None, False, [], argparse.SUPPRESS):
        return meaning, f"`{default}`"
    named = re.search(r"(?:^|\s*\(|,?\s+)default: (.+?)\)?$", meaning)
    if not named or action.nargs == 0 and "default" not in meaning:
        return meaning, ""
    shown = named.group(1)
    meaning = meaning[: named.start()].rstrip(" ,;")
    return meaning, f"`{shown}`" if re.fullmatch(r"[\w./<>:-]+", shown) else shown


def cli_markdown() -> str:
    """Every ``evorl-pop`` command with a table of its options, from the parser itself."""
    from evorl_pop.cli import build_parser

    parser = build_parser()
    out = [f"`{parser.prog}`: {parser.description}", ""]
    own = [
        a for a in parser._actions if a.option_strings and not isinstance(a, argparse._HelpAction)
    ]
    out += ["| option | meaning |", "|---|---|"]
    out += [
        f"| {', '.join(f'`{f}`' for f in a.option_strings)} | {_cell(a.help or '')} |" for a in own
    ]
    out.append("")
    for name, sub in _subparsers(parser).items():
        out += [f"## `evorl-pop {name}`", "", _cell(sub.description), ""]
        out += ["| option | value | meaning | default |", "|---|---|---|---|"]
        for action in sub._actions:
            if isinstance(action, argparse._HelpAction):
                continue
            flags = ", ".join(f"`{f}`" for f in action.option_strings)
            if not flags:
                flags = f"`{action.metavar or action.dest}` (positional)"
            if action.choices:
                value = " \\| ".join(f"`{c}`" for c in action.choices)
            elif action.nargs == 0:
                value = "(flag)"
            else:
                value = f"`{action.metavar or action.dest.upper()}`"
            meaning, shown = _default_of(action)
            out.append(f"| {flags} | {value} | {_cell(meaning)} | {shown} |")
        notes = [g for g in sub._action_groups if g.description and g._group_actions]
        for group in notes:  # e.g. the processes' defaults from the environment
            out += ["", f"*{group.title}*: {_cell(group.description)}"]
        if sub.epilog:
            out += ["", "```text", sub.epilog.strip(), "```"]
        out.append("")
    return "\n".join(out)


# --- config dataclasses ---------------------------------------------------------------


def _attributes(cls) -> dict[str, str]:
    """Field meanings: the ``Attributes:`` sections of the class and its bases' docstrings,
    then ``name: type = default  # comment`` lines of their source."""
    meanings: dict[str, str] = {}
    for klass in reversed(cls.__mro__):
        doc = inspect.getdoc(klass) or ""
        if klass is object:
            continue
        match = re.search(r"^Attributes:\n((?:[ \t]+.*\n?|\n)*)", doc, re.M)
        if match:
            current = None
            for line in match.group(1).splitlines():
                field = re.match(r"^ {2}(\w+): ?(.*)$", line)
                if field:
                    current = field.group(1)
                    meanings[current] = field.group(2).strip()
                elif current and line.strip():
                    meanings[current] += " " + line.strip()
        try:
            source = inspect.getsource(klass)
        except (OSError, TypeError):
            continue
        for name, comment in re.findall(r"^    (\w+): [^\n#]*#\s*(.*)$", source, re.M):
            meanings.setdefault(name, comment.strip())
        for comment, name in re.findall(r"^    # (.*)\n    (\w+): ", source, re.M):
            meanings.setdefault(name, comment.strip())
    return {name: _plain(text) for name, text in meanings.items()}


def _plain(text: str) -> str:
    """Sphinx roles and double backticks as Markdown code."""
    text = re.sub(r":\w+:`~?([^`]+)`", r"`\1`", text)
    return text.replace("``", "`")


def _type_name(hint) -> str:
    if isinstance(hint, type):
        return hint.__name__
    return re.sub(r"\b(?:typing|evorl_pop(?:\.\w+)*)\.", "", str(hint))


def _default(field: dataclasses.Field) -> str:
    if field.default is not dataclasses.MISSING:
        value = field.default
    elif field.default_factory is not dataclasses.MISSING:
        value = field.default_factory()
    else:
        return "(required)"
    if dataclasses.is_dataclass(value):  # the fields that differ from its class's defaults
        base = type(value)()
        changed = [f"{f.name}={getattr(value, f.name)!r}" for f in dataclasses.fields(value)
                   if getattr(value, f.name) != getattr(base, f.name)]  # fmt: skip
        return f"{type(value).__name__}({', '.join(changed)})"
    return repr(value)


def config_classes() -> list[tuple[str, type]]:
    """``(title, class)``: the run settings, then each registered algorithm's config and the
    nested config dataclasses their fields hold (e.g. ``td3``)."""
    from evorl_pop.run import config as config_lib

    out = [("Run settings (`RunConfig`)", config_lib.RunConfig)]
    seen = {config_lib.RunConfig}
    for spec in config_lib.specs():
        cls = spec.config_class
        out.append((f"`{spec.name}`: {spec.description} (`{cls.__module__}.{cls.__name__}`)",
                    cls))  # fmt: skip
        seen.add(cls)
    for _, cls in list(out):
        hints = typing.get_type_hints(cls)
        for field in dataclasses.fields(cls):
            nested = hints[field.name]
            if dataclasses.is_dataclass(nested) and nested not in seen:
                seen.add(nested)
                out.append((f"`{field.name}`: `{nested.__module__}.{nested.__name__}`", nested))
            args = typing.get_args(nested)
            if args and dataclasses.is_dataclass(args[0]) and args[0] not in seen:
                seen.add(args[0])
                out.append((f"`{field.name}` entries: `{args[0].__module__}."
                            f"{args[0].__name__}`", args[0]))  # fmt: skip
    return out


def config_markdown() -> str:
    """A table per config dataclass: every field with its type, default and meaning."""
    out = []
    for title, cls in config_classes():
        hints = typing.get_type_hints(cls)
        meanings = _attributes(cls)
        out += [f"## {title}", "", "| field | type | default | meaning |", "|---|---|---|---|"]
        for field in dataclasses.fields(cls):
            kind, meaning = _cell(_type_name(hints[field.name])), meanings.get(field.name, "")
            out.append(f"| `{field.name}` | {kind} | `{_cell(_default(field))}` | "
                       f"{_cell(meaning)} |")  # fmt: skip
        out.append("")
    return "\n".join(out)


# --- the Python API pages -----------------------------------------------------------

ROLE = re.compile(r":(?:func|class|meth|attr|data|mod|obj|exc|const):`(~?)\.?([^`]+)`")


def _find(collection, name: str, scope) -> str | None:
    """The path of the object ``name`` means inside ``scope``: as written, then relative to
    each enclosing object and to the package; ``None`` if it is not one of the package's."""
    candidates = [name]
    while scope is not None:
        candidates.append(f"{scope.path}.{name}")
        scope = scope.parent
    candidates.append(f"evorl_pop.{name}")
    for path in candidates:
        if not path.startswith("evorl_pop"):
            continue
        try:
            found = collection[path]
            return found.final_target.path if found.is_alias else found.path
        except (KeyError, griffe.AliasResolutionError, griffe.CyclicAliasError):
            continue
    return None


def _literal_blocks(text: str) -> str:
    """reST ``paragraph::`` and its indented block as a paragraph ending in ``:`` and a
    fenced text block (kept indented where it sits inside a docstring section)."""
    lines = text.split("\n")
    out = []
    i = 0
    while i < len(lines):
        line = lines[i]
        i += 1
        if not line.rstrip().endswith("::"):
            out.append(line)
            continue
        base = len(line) - len(line.lstrip())
        head = line.rstrip()[:-2].rstrip()
        if head.strip():
            out.append(head + ":")
        block = []
        while i < len(lines) and (
            not lines[i].strip() or len(lines[i]) - len(lines[i].lstrip()) > base
        ):
            block.append(lines[i])
            i += 1
        while block and not block[-1].strip():
            block.pop()
        body = textwrap.dedent("\n".join(block)).strip("\n").split("\n")
        indent = " " * base if base > 2 else ""
        out += ["", indent + "```text", *(indent + b if b else b for b in body), indent + "```", ""]
    return "\n".join(out)


def markdown_docstring(text: str, obj, collection) -> str:
    """A docstring with its Sphinx roles as links (or code, for names outside the package)
    and its literal blocks as code blocks."""

    def link(match: re.Match) -> str:
        written = match.group(2).strip()
        name = written.removesuffix("()")
        shown = name.rpartition(".")[2] if match.group(1) else name
        if written.endswith("()"):
            shown += "()"
        target = _find(collection, name, obj)
        if target is None:
            return f"`{shown}`"
        return f'<autoref identifier="{target}" optional><code>{shown}</code></autoref>'

    return ROLE.sub(link, _literal_blocks(text))


class ApiNames(griffe.Extension):
    """Griffe extension: ``algorithms`` as ``evorl_pop.algorithms``; Markdown docstrings."""

    def on_package(self, *, pkg, loader, **kwargs) -> None:
        if pkg.path != "evorl_pop":
            return
        if "algorithms" not in pkg.members:
            pkg.set_member("algorithms", loader.load("algorithms"))
        collection = loader.modules_collection
        stack = [pkg]
        while stack:
            obj = stack.pop()
            if obj.docstring is not None:
                obj.docstring.value = markdown_docstring(obj.docstring.value, obj, collection)
            stack += [m for m in obj.members.values() if not m.is_alias]


# --- the hook -------------------------------------------------------------------------


def on_files(files, config):
    """Serves the repository's figures under ``figures/``."""
    from mkdocs.structure.files import File

    for path in sorted((ROOT / "figures").glob("*.png")):
        files.append(File(f"figures/{path.name}", str(ROOT), config["site_dir"],
                          config["use_directory_urls"]))  # fmt: skip
    return files


def on_page_markdown(markdown, page, config, files):
    """Fills the reference pages' markers."""
    if CLI_MARKER in markdown:
        markdown = markdown.replace(CLI_MARKER, cli_markdown())
    if CONFIG_MARKER in markdown:
        markdown = markdown.replace(CONFIG_MARKER, config_markdown())
    return markdown
