"""The documentation: the site builds strictly, every code block of docs/ and the README runs
as written (or says on the page why not), the generated references list exactly what the code
has, the README stays short and links the newcomer's pages, and a browser renders the site."""

from __future__ import annotations

import ast
import dataclasses
import functools
import html.parser as html_parser
import http.server
import importlib
import importlib.util
import inspect
import io
import json
import math
import os
import re
import shutil
import socketserver
import subprocess
import sys
import textwrap
import threading
import time
import tokenize
import urllib.parse
from pathlib import Path

import pytest
import yaml
from _env import cli_env

ROOT = Path(__file__).resolve().parents[1]
DOCS = ROOT / "docs"
PAGES = [ROOT / "README.md", *sorted(DOCS.rglob("*.md"))]
FENCE = re.compile(r"^```(\w*)([^\n]*)\n(.*?)^```", re.M | re.S)
RUN_LANGUAGES = {"python": "python", "bash": "shell", "sh": "shell", "shell": "shell"}
NOT_RUN = "not run:"
#: the site build executes the notebooks afresh (no cache of an earlier run)
ENV = cli_env(NO_MKDOCS_2_WARNING="1", EVORL_POP_DOCS_NOTEBOOK_CACHE="false")


#: A block the tests do not run is marked, invisibly to readers, by an HTML comment on the
#: line just before its fence: ``<!-- not run: the reason -->``.
MARKER = re.compile(r"<!--\s*(not run:.*?)\s*-->\s*$")


#: The output a block prints, shown on its page, is a ``text`` block right after it, marked
#: the same way: ``<!-- output -->``. The tests compare it with what the block prints: each
#: shown line is a printed line (a progress bar's redrawn states are lines of their own), in
#: order; text matches exactly, numbers to ``OUTPUT_RTOL`` (``<!-- output: numbers within 5%
#: -->`` states another tolerance), and what varies from machine to machine (times, rates,
#: dates: ``VARIES``) matches any value.
OUTPUT = re.compile(r"<!--\s*output(?::\s*numbers within ([\d.]+)%)?\s*-->\s*$")
OUTPUT_RTOL = 0.01


@dataclasses.dataclass(frozen=True)
class Block:
    page: Path
    line: int
    kind: str  # 'python' or 'shell'
    title: str
    code: str
    marker: str = ""  # "not run: why", from the comment before the fence
    output: str | None = None  # the printed output shown under it, if any
    rtol: float = OUTPUT_RTOL  # the tolerance of its numbers

    @property
    def runs(self) -> bool:
        return not self.marker.startswith(NOT_RUN)

    def __str__(self) -> str:
        return f"{self.page.relative_to(ROOT)}:{self.line}"


@functools.cache
def blocks() -> tuple[Block, ...]:
    """Every Python and shell code block of the README and docs/, in page order."""
    out = []
    for page in PAGES:
        text = page.read_text()
        fences = list(FENCE.finditer(text))
        for m, after in zip(fences, [*fences[1:], None], strict=False):
            kind = RUN_LANGUAGES.get(m.group(1))
            if kind is None:
                continue
            title = re.search(r'title="([^"]*)"', m.group(2))
            line = text[: m.start()].count("\n") + 1
            marker = MARKER.search(_line_before(text, m))
            title = title.group(1) if title else ""
            shown = after and after.group(1) == "text" and OUTPUT.search(_line_before(text, after))
            out.append(
                Block(
                    page,
                    line,
                    kind,
                    title,
                    m.group(3),
                    marker.group(1) if marker else "",
                    after.group(3) if shown else None,
                    float(shown.group(1)) / 100 if shown and shown.group(1) else OUTPUT_RTOL,
                )
            )
    return tuple(out)


def _line_before(text: str, fence: re.Match) -> str:
    """The line just before a fence (where a block's marker is)."""
    return text[: fence.start()].rstrip("\n").rpartition("\n")[2]


#: What varies from machine to machine in printed output, matched by its form alone: a
#: date and time, a progress bar's clock (``00:02<00:00``), a rate (``1.20s/gen``,
#: ``steps/s=1.15e+04``) and elapsed seconds (``2.4s``).
VARIES = (
    r"\d{4}-\d\d-\d\d \d\d:\d\d:\d\d|\d+:\d\d(?::\d\d)?"
    r"|[\d.]+(?:e[-+]?\d+)?(?:s/gen|gen/s|s/it|it/s)|steps/s=[\d.]+(?:e[-+]?\d+)?"
    r"|(?<![\w.])\d+(?:\.\d+)?s\b"
)
NUMBER = r"[-+]?(?:\d{1,3}(?:,\d{3})+|\d+)(?:\.\d+)?(?:e[-+]?\d+)?"
TOKEN = re.compile(f"(?P<varies>{VARIES})|(?P<number>{NUMBER})")


def _line_pattern(shown: str) -> tuple[re.Pattern, list[float]]:
    """A shown line as a pattern of the printed line: its text verbatim (a run of spaces
    any run: a progress bar pads a value to its width), its numbers captured, what
    varies matched by its form; and the shown numbers."""
    pattern, numbers, end = "", [], 0
    literal = lambda text: re.sub(r" +", " +", re.escape(text))  # noqa: E731
    for m in TOKEN.finditer(shown):
        pattern += literal(shown[end : m.start()])
        if m.group("varies"):
            pattern += f"(?:{VARIES})"
        else:
            pattern += f"({NUMBER})"
            numbers.append(float(m.group().replace(",", "")))
        end = m.end()
    return re.compile(pattern + literal(shown[end:])), numbers


def output_differences(shown: str, printed: str, rtol: float) -> list[str]:
    """The shown lines that no printed line matches, in order (see ``OUTPUT``)."""
    lines = [line.rstrip() for line in re.split(r"[\r\n]+", printed)]
    missing, at = [], 0
    for want in (line.rstrip() for line in shown.splitlines()):
        if not want:
            continue
        pattern, numbers = _line_pattern(want)
        for i in range(at, len(lines)):
            m = pattern.fullmatch(lines[i])
            got = [float(g.replace(",", "")) for g in m.groups()] if m else None
            if got is not None and all(
                math.isclose(g, w, rel_tol=rtol) for g, w in zip(got, numbers, strict=True)
            ):
                at = i + 1
                break
        else:
            missing.append(want)
    return missing


def check_output(block: Block, printed: str) -> None:
    """The output shown under ``block`` is what it printed (``printed``)."""
    if block.output is None:
        return
    missing = output_differences(block.output, printed, block.rtol)
    assert not missing, (
        f"{block}: the output shown under the block is not what it prints; shown, not "
        "printed:\n" + "\n".join(missing) + "\nprinted:\n" + printed[-3000:]
    )


def _gen_ref():
    spec = importlib.util.spec_from_file_location("gen_ref", DOCS / "gen_ref.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def site(built_once) -> Path:
    """The site, built once per test session with ``mkdocs build --strict`` (a minute:
    the notebooks run), so the tests of the built site are in the long tier."""

    def build(out: Path) -> None:
        built = subprocess.run(
            [sys.executable, "-m", "mkdocs", "build", "--strict", "-q", "-d", str(out)],
            cwd=ROOT,
            env=ENV,
            capture_output=True,
            text=True,
            timeout=600,
        )
        assert built.returncode == 0, built.stdout[-3000:] + built.stderr[-5000:]

    return built_once("site", build)


# --- code blocks ------------------------------------------------------------------------


def test_every_code_block_runs_or_says_why_not():
    found = blocks()
    assert sum(b.runs and b.kind == "python" for b in found) >= 8
    assert sum(b.runs and b.kind == "shell" for b in found) >= 5
    for block in found:
        if not block.runs:
            assert len(block.marker[len(NOT_RUN) :].strip()) > 5, f"{block}: give the reason"
        assert not block.title.lower().startswith("not run"), f"{block}: mark it, not title it"


@pytest.mark.slow
def test_no_page_shows_a_test_marker(site):
    """The markers of blocks not run are HTML comments: no page shows one to its readers."""
    pages = sorted(site.rglob("*.html"))
    assert len(pages) > 20
    for html in pages:
        shown = re.sub(r"<!--.*?-->", "", html.read_text(), flags=re.S)
        assert not re.search(r"\bnot run:", shown, re.I), html


def test_every_output_shown_under_a_block_is_checked():
    """A ``text`` block right after a runnable block shows what it prints, and is marked so
    (``<!-- output -->``); an output marker stands only under a runnable block."""
    runnable = {(b.page, b.line) for b in blocks() if b.runs}
    shown = 0
    for page in PAGES:
        text = page.read_text()
        fences = list(FENCE.finditer(text))
        for before, m in zip(fences, fences[1:], strict=False):
            where = f"{page.relative_to(ROOT)}:{text[: m.start()].count(chr(10)) + 1}"
            marked = OUTPUT.search(_line_before(text, m))
            under_runnable = (page, text[: before.start()].count("\n") + 1) in runnable
            if marked:
                assert under_runnable and m.group(1) == "text", f"{where}: output of what?"
                shown += 1
            elif under_runnable and m.group(1) == "text":
                raise AssertionError(f"{where}: mark the block's shown output <!-- output -->")
    assert shown == sum(b.output is not None for b in blocks()) >= 3


def test_shown_output_matches_by_line_number_and_form():
    shown = "done: generation 3, 27,553 env steps, best 114.018, 3.8s\nruns/x.png"
    bar = "es: 100%|##| 3/3 [00:03<00:00,  1.26s/gen, best=114]"
    printed = f"run folder\r{bar}\ndone: generation 3, 27,553 env steps, best 114.02, 12.1s\n"
    assert output_differences(shown, printed + "runs/x.png\n", 1e-3) == []
    assert output_differences(shown, printed, 1e-3) == ["runs/x.png"]  # a line missing
    wrong = printed.replace("114.02", "141.34") + "runs/x.png"
    assert output_differences(shown, wrong, 1e-3) == [shown.splitlines()[0]]
    assert output_differences(shown, printed.replace("27,553", "27,554"), 1e-6) != []
    assert output_differences(bar.replace(" 1.26s/gen", "13.5gen/s"), bar, 0) == []
    assert output_differences(bar.replace("3/3", "2/3"), bar, 0) == [bar.replace("3/3", "2/3")]


RUNNER = textwrap.dedent("""\
    import json, sys, traceback
    for name, code in json.load(open(sys.argv[1])):
        print(f"--- {name}", flush=True)
        try:
            exec(compile(code, name, "exec"), {"__name__": "__main__"})
        except BaseException:
            traceback.print_exc()
            print(f"FAILED {name}", flush=True)
            sys.exit(1)
""")


@pytest.mark.slow
def test_python_blocks_run_as_written(tmp_path):
    """Each distinct runnable Python block, as written, in a fresh namespace; blocks that switch
    JAX to 64-bit run in a process of their own, all others share one (it compiles once)."""
    unique: dict[str, str] = {}
    for block in blocks():
        if block.runs and block.kind == "python":
            unique.setdefault(block.code, str(block))
    groups = [[]]
    for code, name in unique.items():
        if "jax_enable_x64" in code:
            groups.append([(name, code)])
        else:
            groups[0].append((name, code))
    (tmp_path / "runner.py").write_text(RUNNER)
    for i, group in enumerate(groups):
        (tmp_path / f"blocks{i}.json").write_text(json.dumps(group))
        out = subprocess.run(
            [sys.executable, "runner.py", f"blocks{i}.json"],
            cwd=tmp_path,
            env=ENV,
            capture_output=True,
            text=True,
            timeout=900,
        )
        assert out.returncode == 0, out.stdout[-2000:] + out.stderr[-4000:]
        assert out.stdout.count("--- ") == len(group)
        names = re.findall(r"^--- (.*)$", out.stdout, re.M)
        outputs = re.split(r"^--- .*$", out.stdout, flags=re.M)[1:]
        printed = dict(zip(names, outputs, strict=True))
        for name, code in group:
            for block in blocks():
                if block.code == code:
                    check_output(block, printed[name])


def _shell_pages() -> list[Path]:
    """The pages with runnable shell blocks, in page order."""
    pages = [b.page for b in blocks() if b.runs and b.kind == "shell"]
    return list(dict.fromkeys(pages))


#: The page whose blocks train ``runs/first``, whose metrics.csv columns must be documented.
FIRST_RUN_PAGE = DOCS / "getting-started.md"


@pytest.mark.slow
@pytest.mark.parametrize("page", _shell_pages(), ids=lambda p: str(p.relative_to(ROOT)))
def test_shell_blocks_run_as_written(page, tmp_path):
    """A page's runnable shell blocks, in order in one folder, with the installed
    evorl-pop (a page per test: the pages share no files); after the getting-started
    page's, the first run's metrics.csv columns are all documented."""
    path = f"{Path(sys.executable).parent}{os.pathsep}{ENV['PATH']}"
    env = {**ENV, "PATH": path, "PYTHONUNBUFFERED": "1"}  # both streams in the order printed
    for block in blocks():
        if block.page == page and block.runs and block.kind == "shell":
            out = subprocess.run(
                ["bash", "-e", "-o", "pipefail", "-c", block.code],
                cwd=tmp_path,
                env=env,
                stdout=subprocess.PIPE,
                stderr=subprocess.STDOUT,
                text=True,
                timeout=600,
            )
            assert out.returncode == 0, f"{block}:\n{out.stdout[-5000:]}"
            check_output(block, out.stdout)
    if page == FIRST_RUN_PAGE:
        header = (tmp_path / "runs" / "first" / "metrics.csv").read_text().splitlines()[0]
        documented = (DOCS / "reference" / "metrics.md").read_text()
        assert all(f"`{c}`" in documented for c in header.split(",")), header


def test_the_first_run_page_has_shell_blocks():
    assert FIRST_RUN_PAGE in _shell_pages()


# --- generated references ---------------------------------------------------------------


def _sections(markdown: str) -> dict[str, str]:
    parts = re.split(r"^## (.*)$", markdown, flags=re.M)
    return dict(zip(parts[1::2], parts[2::2], strict=True))


@pytest.mark.slow
def test_cli_reference_lists_exactly_the_parsers_options(site):
    from evorl_pop.cli import build_parser

    gen = _gen_ref()
    sections = _sections(gen.cli_markdown())
    commands = gen._subparsers(build_parser())
    assert [s.strip("`").split()[-1] for s in sections] == list(commands)
    for body, (name, parser) in zip(sections.values(), commands.items(), strict=True):
        rows = [r for r in body.splitlines() if r.startswith("| `")]
        listed = [tuple(re.findall(r"`([^`]+)`", r.split(" | ")[0].lstrip("| "))) for r in rows]
        assert listed == gen.cli_options(parser), name
    page = (site / "reference" / "cli" / "index.html").read_text()
    assert "--heartbeat-timeout" in page and "--devices-per-process" in page
    assert "cli-reference" not in page


@pytest.mark.slow
def test_config_reference_lists_exactly_every_configs_fields(site):
    from evorl_pop.run import config

    gen = _gen_ref()
    classes = gen.config_classes()
    names = {spec.config_class for spec in config.specs()}
    assert names | {config.RunConfig} <= {cls for _, cls in classes}
    sections = _sections(gen.config_markdown())
    assert list(sections) == [title for title, _ in classes]
    for (title, cls), body in zip(classes, sections.values(), strict=True):
        rows = [r for r in body.splitlines() if r.startswith("| `")]
        fields = [re.match(r"\| `(\w+)`", r).group(1) for r in rows]
        assert fields == [f.name for f in dataclasses.fields(cls)], title
        cells = [re.split(r"(?<!\\)\|", r)[1:-1] for r in rows]
        assert all(len(c) == 4 and c[3].strip() for c in cells), f"{title}: a meaning is missing"
    page = (site / "reference" / "config" / "index.html").read_text()
    assert "updates_per_actor" in page and "checkpoint_every" in page


def test_api_docstrings_become_markdown():
    """The API pages' griffe extension: a reST literal block becomes a fenced block, a role a
    code span (a link where it names one of the package's objects, checked on the site)."""
    text = "A run holds::\n\n    a\n      b\n\nSee :func:`~x.y.z`, :class:`Foo` and :meth:`run()`."
    assert _gen_ref().markdown_docstring(text, None, {}) == (
        "A run holds:\n\n```text\na\n  b\n```\n\nSee `z`, `Foo` and `run()`."
    )


# --- dotted names -----------------------------------------------------------------------

DOTTED = re.compile(r"(?<![\w/.-])evorl_pop(?:\.[A-Za-z_]\w*)+")
PACKAGE = sorted([*(ROOT / "evorl_pop").rglob("*.py"), *(ROOT / "algorithms").rglob("*.py")])


def _prose(path: Path) -> list[tuple[int, str]]:
    """The docstrings (and any other bare string, such as a field's) and the comments of a
    Python file: ``(line, text)``."""
    source = path.read_text()
    out = [
        (node.lineno, node.value.value)
        for node in ast.walk(ast.parse(source))
        if isinstance(node, ast.Expr)
        and isinstance(node.value, ast.Constant)
        and isinstance(node.value.value, str)
    ]
    for token in tokenize.generate_tokens(io.StringIO(source).readline):
        if token.type == tokenize.COMMENT:
            out.append((token.start[0], token.string))
    return out


def _declared(owner, name: str) -> bool:
    """``name`` is a field of the class ``owner`` without a class attribute: a dataclass's
    field without a default, or an annotation (a protocol's or a NamedTuple's member)."""
    if not inspect.isclass(owner):
        return False
    if dataclasses.is_dataclass(owner) and name in {f.name for f in dataclasses.fields(owner)}:
        return True
    return any(name in vars(cls).get("__annotations__", {}) for cls in owner.__mro__)


def _resolves(name: str) -> bool:
    """The longest importable module prefix of ``name``, then the rest by attribute."""
    parts = name.split(".")
    for i in range(len(parts), 0, -1):
        module_name = ".".join(parts[:i])
        try:
            obj = importlib.import_module(module_name)
        except ModuleNotFoundError as err:
            if err.name is None or not (module_name + ".").startswith(err.name + "."):
                raise  # a module that exists but cannot import: that is not a stale name
            continue
        break
    for depth, attr in enumerate(parts[i:], start=i + 1):
        if hasattr(obj, attr):
            obj = getattr(obj, attr)
        elif _declared(obj, attr):
            return depth == len(parts)  # a field's type is not followed further
        else:
            return False
    return True


def _sections_of_several_items(module) -> list[str]:
    """Every Returns or Yields section of ``module``'s docstrings (and its members') that
    parses as several items: a wrapped sentence whose continuation lines start at the
    item's indentation, shown as one row per line on the API pages."""
    found = []
    for member in module.members.values():
        if member.is_alias:
            continue
        for section in member.docstring.parse("google") if member.docstring else ():
            if section.kind.value in ("returns", "yields") and len(section.value) > 1:
                found.append(f"{member.path}: {section.kind.value} in {len(section.value)} rows")
        if member.is_module or member.is_class:
            found += _sections_of_several_items(member)
    return found


def test_each_returns_section_is_one_row():
    """A Returns section is one item (its wrapped lines indented under the first), so the
    API pages show one row with the function's return type, not one row per line."""
    griffe = pytest.importorskip("griffe")
    found = []
    for name in ("evorl_pop", "algorithms"):
        module = griffe.load(name, search_paths=[str(ROOT)], resolve_aliases=False)
        found += _sections_of_several_items(module)
    assert found == [], "\n".join(found)


def test_every_dotted_evorl_pop_name_resolves():
    """Every ``evorl_pop.…`` name in the package's docstrings and comments, the docs and the
    README names a module, or an attribute of one, that exists."""
    from evorl_pop import registry

    texts = [(path, line, text) for path in PACKAGE for line, text in _prose(path)]
    texts += [(page, 1, page.read_text()) for page in PAGES]
    found: dict[str, list[str]] = {}
    for path, line, text in texts:
        for m in DOTTED.finditer(text):
            where = f"{path.relative_to(ROOT)}:{line + text[: m.start()].count(chr(10))}"
            found.setdefault(m.group(), []).append(where)
    assert len(found) > 50
    not_modules = {registry.ENTRY_POINT_GROUP}  # the plug-ins' entry-point group: a name
    stale = [
        f"{name} ({', '.join(where)})"
        for name, where in found.items()
        if name not in not_modules and not _resolves(name)
    ]
    assert not stale, "names that do not resolve:\n" + "\n".join(sorted(stale))


# --- the README -------------------------------------------------------------------------


def _mkdocs_config() -> dict:
    """mkdocs.yml, its ``!ENV [NAME, default]`` values read as their defaults."""

    class Loader(yaml.SafeLoader):
        pass

    Loader.add_constructor("!ENV", lambda loader, node: loader.construct_sequence(node)[-1])
    return yaml.load((ROOT / "mkdocs.yml").read_text(), Loader=Loader)


def _nav_pages(nav) -> dict[str, str]:
    out = {}
    for item in nav:
        for title, value in item.items():
            if isinstance(value, list):
                out.update({f"{title}/{k}": v for k, v in _nav_pages(value).items()})
            else:
                out[title] = value
    return out


def test_readme_is_short_and_links_the_newcomers_pages():
    readme = (ROOT / "README.md").read_text()
    assert len(readme.splitlines()) <= 200
    nav = _nav_pages(_mkdocs_config()["nav"])
    newcomer = [
        p
        for t, p in nav.items()
        if t.split("/")[0] in ("Getting started", "Guides", "Troubleshooting", "Concepts")
    ]
    assert len(newcomer) >= 12
    for page in newcomer:
        assert f"](docs/{page})" in readme, page
    for link in re.findall(r"\]\((docs/[^)#]+)", readme):
        assert (ROOT / link).is_file(), link
    assert sum(b.page.name == "README.md" and b.kind == "python" for b in blocks()) == 4


# --- the built site ---------------------------------------------------------------------


class _Html(html_parser.HTMLParser):
    """A page's ids, link targets, image sources and its text outside code."""

    CODE = {"code", "pre", "script", "style", "kbd"}

    def __init__(self, text: str):
        super().__init__()
        self.ids: set[str] = set()
        self.links: list[str] = []
        self.images: list[str] = []
        self.prose: list[str] = []
        self.blocks: list[str] = []  # the text of the code blocks (<pre>)
        self._in_code = 0
        self._in_pre = 0
        self.feed(text)

    def handle_starttag(self, tag, attrs):
        a = dict(attrs)
        if "id" in a:
            self.ids.add(a["id"])
        if tag == "a" and a.get("href"):
            self.links.append(a["href"])
        if tag == "img":
            self.images.append(a.get("src", ""))
        if tag in self.CODE:
            self._in_code += 1
        if tag == "pre":
            self._in_pre += 1
            self.blocks.append("")

    def handle_endtag(self, tag):
        if tag in self.CODE:
            self._in_code -= 1
        if tag == "pre":
            self._in_pre -= 1

    def handle_data(self, data):
        if not self._in_code:
            self.prose.append(data)
        if self._in_pre:
            self.blocks[-1] += data


@pytest.fixture(scope="module")
def parsed(site) -> dict[Path, _Html]:
    """Every page of the site but the 404 page (its links are absolute, to the site's URL)."""
    return {p: _Html(p.read_text()) for p in site.rglob("*.html") if p.name != "404.html"}


@pytest.mark.slow
def test_no_page_shows_raw_markup(parsed):
    """No Sphinx role or reST literal-block marker left in the prose of a page, and the CLI
    reference's run-folder default shown as written."""
    for page, html in parsed.items():
        prose = " ".join(html.prose)
        for raw in (":func:", ":class:", ":meth:", ":mod:", "::", "RUNS_ROOT/---"):
            assert raw not in prose, f"{page}: {raw!r} near {prose[prose.find(raw) - 80 :][:160]!r}"


@pytest.mark.slow
def test_no_api_code_block_shows_raw_markup(parsed):
    """The API pages' code blocks (docstrings' literal blocks) show neither a role, nor
    the tag a cross-reference becomes inside a block, nor a reST code span's backticks."""
    for page, html in parsed.items():
        if "reference/api" not in str(page):
            continue
        for block in html.blocks:
            for raw in ("<autoref", ":func:`", ":class:`", ":meth:`", ":mod:`", "``"):
                assert raw not in block, f"{page}: {raw!r} in the block {block[:300]!r}"


@pytest.mark.slow
def test_every_internal_link_and_anchor_resolves(parsed, site):
    for page, html in parsed.items():
        for href in html.links:
            url = urllib.parse.urlsplit(href)
            if url.scheme or href.startswith(("//", "mailto:")):
                continue
            path = urllib.parse.unquote(url.path)
            target = (site / path.lstrip("/")) if path.startswith("/") else page.parent / path
            target = target.resolve() if path else page
            if target.is_dir():
                target = target / "index.html"
            assert target.exists(), f"{page.relative_to(site)}: {href}"
            if url.fragment and target.suffix == ".html":
                fragment = urllib.parse.unquote(url.fragment)
                assert fragment in parsed[target].ids, f"{page.relative_to(site)}: {href}"


def _api_modules() -> list[str]:
    names = []
    for path in PACKAGE:
        top = "evorl_pop" if path.is_relative_to(ROOT / "evorl_pop") else "evorl_pop.algorithms"
        base = ROOT / ("evorl_pop" if top == "evorl_pop" else "algorithms")
        parts = path.relative_to(base).with_suffix("").parts
        parts = parts[:-1] if parts[-1] == "__init__" else parts
        names.append(".".join((top, *parts)))
    return names


NOTEBOOKS = sorted((DOCS / "notebooks").glob("*.ipynb"))


def test_the_notebooks_are_kept_without_outputs_and_each_is_in_the_nav():
    """The site build executes them (mkdocs-jupyter, ``execute: true``): the outputs shown are
    those of that run, never ones saved with the notebook."""
    nav = _nav_pages(_mkdocs_config()["nav"])
    assert len(NOTEBOOKS) >= 3
    for path in NOTEBOOKS:
        notebook = json.loads(path.read_text())
        code = [c for c in notebook["cells"] if c["cell_type"] == "code"]
        assert code and all(not c["outputs"] and c["execution_count"] is None for c in code), path
        assert f"notebooks/{path.name}" in nav.values(), path


@pytest.mark.slow
def test_the_notebooks_pages_show_the_outputs_of_their_run(site):
    """Each notebook's page: its printed lines and a figure, from the build's execution."""
    printed = {
        "openes-cartpole": "best fitness:",
        "cmaes-restarts": "converged: True",
        "pbt-pendulum": "member 3: return",
    }
    assert sorted(printed) == [p.stem for p in NOTEBOOKS]
    for name, line in printed.items():
        page = (site / "notebooks" / name / "index.html").read_text()
        assert line in page, name
        assert "data:image/png;base64," in page, f"{name}: no figure"
        assert "Traceback" not in page, name


@pytest.mark.slow
def test_the_python_api_has_a_page_per_layer_and_every_module_once(parsed, site):
    """Each module is on exactly one API page, under its evorl_pop. name; the names the guides
    cite have an entry."""
    pages = sorted((DOCS / "reference" / "api").glob("*.md"))
    assert len(pages) >= 8
    listed = [m for p in pages for m in re.findall(r"^::: (\S+)", p.read_text(), re.M)]
    assert sorted(listed) == sorted(_api_modules())
    ids = set().union(*(h.ids for p, h in parsed.items() if "reference/api" in str(p)))
    assert not [i for i in ids if i.startswith("algorithms.")]
    for name in (
        "evorl_pop.train",
        "evorl_pop.tasks.rollout",
        "evorl_pop.tasks.blackbox.PythonTask",
        "evorl_pop.algorithms.cma_es.CMA_ES_pycma",
        "evorl_pop.algorithms.es.ESConfig",
        "evorl_pop.run.processes.set_host_devices",
        "evorl_pop.run.config.RunConfig",
    ):
        assert name in ids, name
    assert all(p.stat().st_size < 600_000 for p in (site / "reference" / "api").rglob("*.html"))


# --- the site in a browser --------------------------------------------------------------


def _chromium() -> str | None:
    return shutil.which("chromium") or shutil.which("chromium-browser")


class _Browser:
    """Headless Chromium driven over the DevTools protocol on a pipe (fds 3 and 4)."""

    def __init__(self, binary: str, profile: Path):
        to_child_r, self._w = os.pipe()
        self._r, from_child_w = os.pipe()
        a, b = to_child_r, from_child_w  # become the child's fds 3 and 4
        self.proc = subprocess.Popen(
            [
                "bash",
                "-c",
                f'exec "$0" "$@" 3<&{a} 4>&{b} {a}<&- {b}>&-',
                binary,
                "--headless",
                "--no-sandbox",
                "--disable-gpu",
                "--remote-debugging-pipe",
                f"--user-data-dir={profile}",
                "--no-first-run",
                "about:blank",
            ],
            pass_fds=(a, b),
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        os.close(to_child_r)
        os.close(from_child_w)
        self._buffer, self._id = b"", 0
        target = self.call("Target.createTarget", url="about:blank")["targetId"]
        self.session = self.call("Target.attachToTarget", targetId=target, flatten=True)[
            "sessionId"
        ]

    def call(self, method: str, session: str | None = None, **params):
        self._id += 1
        message = {"id": self._id, "method": method, "params": params}
        if session:
            message["sessionId"] = session
        os.write(self._w, json.dumps(message).encode() + b"\0")
        while True:
            while b"\0" not in self._buffer:
                chunk = os.read(self._r, 1 << 16)
                assert chunk, "chromium closed its DevTools pipe"
                self._buffer += chunk
            raw, self._buffer = self._buffer.split(b"\0", 1)
            reply = json.loads(raw)
            if reply.get("id") == self._id:
                assert "error" not in reply, reply
                return reply["result"]

    def open(self, url: str) -> None:
        self.call("Page.navigate", self.session, url=url)

    def wait_for(self, expression: str, timeout: float = 60.0):
        """The value of ``expression`` once it is truthy (polled in the page)."""
        deadline, value = time.monotonic() + timeout, None
        while time.monotonic() < deadline:
            result = self.call(
                "Runtime.evaluate", self.session, expression=expression, returnByValue=True
            )["result"]
            value = result.get("value")
            if value:
                return value
            time.sleep(0.2)
        raise AssertionError(f"timed out waiting for {expression!r} (last value {value!r})")

    def close(self) -> None:
        self.proc.kill()
        self.proc.wait()
        os.close(self._r)
        os.close(self._w)


@pytest.fixture(scope="module")
def browser(site, tmp_path_factory):
    """``(browser, base URL)``: headless Chromium and the built site served over HTTP."""
    binary = _chromium()
    if binary is None:
        if os.environ.get("CI"):
            pytest.fail("chromium is not installed: .ci/run installs Debian's chromium")
        pytest.skip("chromium is not installed (Debian: apt-get install chromium)")

    class Quiet(http.server.SimpleHTTPRequestHandler):
        def __init__(self, *args, **kwargs):
            super().__init__(*args, directory=str(site), **kwargs)

        def log_message(self, *args):
            pass

    with socketserver.TCPServer(("127.0.0.1", 0), Quiet) as server:
        threading.Thread(target=server.serve_forever, daemon=True).start()
        chromium = _Browser(binary, tmp_path_factory.mktemp("profile"))
        try:
            yield chromium, f"http://127.0.0.1:{server.server_address[1]}"
        finally:
            chromium.close()
            server.shutdown()


@pytest.mark.slow
def test_the_site_renders_in_chromium_and_search_finds_a_guide(browser):
    browser, base = browser
    nav = (
        "JSON.stringify([...document.querySelectorAll('nav.md-nav--primary "
        "a.md-nav__link, nav.md-nav--primary label.md-nav__link')]"
        ".map(a => a.textContent.trim()))"
    )
    browser.open(f"{base}/")
    titles = json.loads(browser.wait_for(f"document.readyState == 'complete' && {nav}"))
    for title in (
        "Getting started",
        "Guides",
        "Population-based training",
        "Troubleshooting",
        "Command line",
    ):
        assert title in titles, titles
    assert browser.wait_for("document.querySelector('h1').textContent").startswith("evorl_pop")

    browser.open(f"{base}/guides/hybrid/")
    heading = browser.wait_for(
        "document.readyState == 'complete' && document.querySelector('article h1').textContent"
    )
    assert heading.startswith("Hybrid evolutionary RL")
    assert "Config fields" in json.loads(browser.wait_for(nav))

    # the search box opened from the address, as Material's shared search links do
    browser.open(f"{base}/?q=Population")
    links = (
        "JSON.stringify([...document.querySelectorAll("
        "'.md-search-result__item a')].map(a => a.getAttribute('href')))"
    )
    found = json.loads(
        browser.wait_for(f"document.querySelectorAll('.md-search-result__item').length && {links}")
    )
    assert any("guides/pbt/" in href for href in found), found

    # a wide screen: the content column widens past Material's 61rem, and the reference tables'
    # names (first column) each stay on one line
    browser.call(
        "Emulation.setDeviceMetricsOverride",
        browser.session,
        width=1600,
        height=1000,
        deviceScaleFactor=1,
        mobile=False,
    )
    for page in ("reference/cli/", "reference/config/", "reference/metrics/"):
        browser.open(f"{base}/{page}")
        rems = browser.wait_for(
            "document.readyState == 'complete' && "
            "parseFloat(getComputedStyle(document.querySelector('.md-grid')).maxWidth) / "
            "parseFloat(getComputedStyle(document.documentElement).fontSize)"
        )
        assert rems >= 80, rems
        broken = browser.wait_for(
            "JSON.stringify([...document.querySelectorAll('article td:first-child code')]"
            ".filter(c => c.getClientRects().length > 1).map(c => c.textContent))"
        )
        assert json.loads(broken) == [], f"{page}: {broken}"


@pytest.mark.slow
def test_every_image_is_at_least_600_px_wide(browser, parsed, site):
    """Every image a page shows (files and the notebooks' inline figures), loaded by the
    browser: each has a natural width of at least 600 px (readable, not a thumbnail)."""
    browser, base = browser
    sources = set()
    for page, html in parsed.items():
        url = f"{base}/{page.relative_to(site).as_posix()}"
        sources.update(urllib.parse.urljoin(url, src) for src in html.images)
    assert len(sources) >= 12
    load = (
        "window.widths = null; Promise.all(%s.map(u => new Promise(done => {"
        "const i = new Image(); i.onload = () => done([u.slice(0, 100), i.naturalWidth]);"
        "i.onerror = () => done([u.slice(0, 100), 0]); i.src = u;})))"
        ".then(w => { window.widths = JSON.stringify(w); }); 1"
    )
    browser.open(f"{base}/")
    browser.wait_for("document.readyState == 'complete'")
    browser.wait_for(load % json.dumps(sorted(sources)))
    widths = json.loads(browser.wait_for("window.widths"))
    assert len(widths) == len(sources)
    narrow = [f"{src} is {width} px wide" for src, width in widths if width < 600]
    assert not narrow, "\n".join(narrow)
