"""The README is a front door (issue 22): short, and every command in it runs as written.

Every ``kvcontract ...`` command of the README's shell blocks is checked against the
command line itself (click's command objects in ``kvcontract.tools.cli``): the
subcommand exists, every option it uses is one of that subcommand's options, an option
that takes a value has one, and ``COMMAND ARGS... --help`` parses (exit 0), which is
how click reports an unknown option or a missing value. The quick start's two commands
are the ones ``.ci/venv-check`` runs in a fresh virtualenv.
"""

from __future__ import annotations

import re
import shlex
import shutil
import subprocess
from pathlib import Path

import click
import pytest
from click.testing import CliRunner

from kvcontract.tools.cli import cli

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"
MAX_LINES = 220
SHELL_BLOCKS = ("bash", "sh", "shell", "console")

MOVED_SECTIONS = ("Proof cache, shards, fail-fast", "Pull-request gate", "Python API",
                  "Hypothesis strategies", "pytest plugin", "pre-commit", "Model presets",
                  "Your model's geometry", "Auditing vLLM")
"""The README's long sections, now in docs/usage.md (code and docs cite them by name)."""


def _text() -> str:
    return README.read_text(encoding="utf-8")


def _blocks(text: str) -> list[tuple[str, str]]:
    """(language, body) of every fenced block."""
    return [(m.group(1), m.group(2))
            for m in re.finditer(r"^```(\w*)\n(.*?)^```", text, re.MULTILINE | re.DOTALL)]


def readme_commands(text: str) -> list[list[str]]:
    """Every ``kvcontract ...`` command of the shell blocks, as argv (comments dropped,
    ``&&``/``;``/``|`` chains split)."""
    commands = []
    for language, body in _blocks(text):
        if language not in SHELL_BLOCKS:
            continue
        for line in body.splitlines():
            words = shlex.split(line, comments=True)
            segment: list[str] = []
            for word in [*words, "&&"]:
                if word in ("&&", "||", ";", "|"):
                    if segment and segment[0] == "kvcontract":
                        commands.append(segment)
                    segment = []
                else:
                    segment.append(word)
    return commands


def _options(command: click.Command) -> dict[str, click.Option]:
    found = {}
    for param in command.params:
        if isinstance(param, click.Option):
            for name in (*param.opts, *param.secondary_opts):
                found[name] = param
    return found


def check_command(argv: list[str]) -> list[str]:
    """What is wrong with one ``kvcontract ...`` command (an empty list: nothing)."""
    assert argv[0] == "kvcontract"
    if len(argv) == 1:
        return ["no subcommand"]
    assert isinstance(cli, click.Group)
    name, args = argv[1], argv[2:]
    command = cli.commands.get(name)
    if command is None:
        return [f"unknown command {name!r} (commands: {', '.join(sorted(cli.commands))})"]
    options = _options(command)
    problems = []
    positional = []
    index = 0
    while index < len(args):
        word = args[index]
        index += 1
        if word.startswith("-") and word != "-":
            option, _, inline = word.partition("=")
            param = options.get(option)
            if param is None:
                problems.append(f"{name}: no option {option} (it has {', '.join(sorted(options))})")
                continue
            if not param.is_flag and not inline:
                if index >= len(args) or (args[index].startswith("-") and args[index] != "-"):
                    problems.append(f"{name}: {option} takes a value")
                    continue
                index += 1
        else:
            positional.append(word)
    takes_arguments = any(isinstance(p, click.Argument) for p in command.params)
    if positional and not takes_arguments:
        problems.append(f"{name}: takes no arguments, given {positional}")
    done = CliRunner().invoke(cli, [name, *args, "--help"])
    if done.exit_code != 0:
        problems.append(f"{' '.join(argv)} --help exits {done.exit_code}: {done.output}")
    return problems


def test_readme_is_short() -> None:
    lines = _text().splitlines()
    assert len(lines) <= MAX_LINES, f"README.md has {len(lines)} lines (at most {MAX_LINES})"


def test_every_readme_command_exists() -> None:
    commands = readme_commands(_text())
    used = {argv[1] for argv in commands if len(argv) > 1}
    # The examples the front door promises: proving, reproducers, pictures, audits.
    assert {"prove", "gen-tests", "explain", "audit"} <= used, used
    problems = [p for argv in commands for p in check_command(argv)]
    assert not problems, "\n".join(problems)


@pytest.mark.parametrize(("argv", "wrong"), [
    (["kvcontract", "prove", "--no-such-option"], "no option --no-such-option"),
    (["kvcontract", "prove", "--clause"], "--clause takes a value"),
    (["kvcontract", "proof"], "unknown command 'proof'"),
    (["kvcontract", "list", "extra"], "takes no arguments"),
    (["kvcontract", "gen-tests", "--out", "--quiet"], "--out takes a value"),
])
def test_the_check_catches_a_wrong_command(argv: list[str], wrong: str) -> None:
    problems = check_command(argv)
    assert any(wrong in p for p in problems), problems


def test_commands_are_read_from_chains_and_comments() -> None:
    text = ("```bash\npip install -e . && kvcontract prove --clause C1  # proves C1\n"
            "kvcontract list | head -1\n```\n```text\nkvcontract audit: output, not a "
            "command\n```\n")
    assert readme_commands(text) == [["kvcontract", "prove", "--clause", "C1"],
                                     ["kvcontract", "list"]]


def _quick_start() -> list[str]:
    section = _text().split("\n## Quick start\n", 1)[1].split("\n## ", 1)[0]
    language, body = _blocks(section)[0]
    assert language == "bash"
    return [line for line in body.splitlines() if line.strip()]


def test_quick_start_is_what_venv_check_runs() -> None:
    first, second = _quick_start()
    assert first == "pip install torch==2.13.0 && pip install -e . && kvcontract prove"
    assert second == "pip install -e '.[test]' && python -m pytest -q"
    if shutil.which("bash") is None:
        pytest.skip("bash is not installed")
    printed = subprocess.run(["bash", str(ROOT / ".ci" / "venv-check"), "--print"],
                             capture_output=True, text=True, cwd=ROOT, check=False)
    assert printed.returncode == 0, printed.stderr
    assert printed.stdout.splitlines() == [first, second]
    run = (ROOT / ".ci" / "run").read_text(encoding="utf-8")
    assert re.search(r"^\.ci/venv-check\b", run, re.MULTILINE), "not run by .ci/run"


def test_audit_section_has_the_summary_example() -> None:
    """The audit section shows what the user sees: a fenced block right after the
    marker comment (its contents follow the audit's summary output)."""
    text = _text()
    section = text.split("\n## Audit a vLLM checkout or patch\n", 1)[1].split("\n## ", 1)[0]
    marker = "<!-- audit-summary-example -->\n"
    assert marker in section
    after = section.split(marker, 1)[1]
    assert after.startswith("```")
    example = after.split("\n", 1)[1].split("```", 1)[0]
    assert example.startswith("kvcontract audit: "), example


def test_local_links_resolve() -> None:
    for document in (README, ROOT / "docs" / "usage.md", ROOT / "docs" / "vllm-findings.md"):
        text = document.read_text(encoding="utf-8")
        for target in re.findall(r"\]\(([^)#\s]+)(?:#[^)]*)?\)", text):
            if "://" in target:
                continue
            assert (document.parent / target).exists(), f"{document.name}: {target}"


def test_moved_sections_are_in_usage_and_named_in_the_readme() -> None:
    """Code and documents cite the long sections by name ('README, "Pull-request
    gate"'): each is a heading of docs/usage.md, and the README's links name it."""
    usage = (ROOT / "docs" / "usage.md").read_text(encoding="utf-8")
    readme = _text()
    for title in MOVED_SECTIONS:
        assert f"\n## {title}\n" in usage, title
        assert f'"{title}"' in readme, title


def test_findings_are_dated_per_release() -> None:
    findings = (ROOT / "docs" / "vllm-findings.md").read_text(encoding="utf-8")
    headings = re.findall(r"^## (\d{4}-\d{2}-\d{2}): (.+)$", findings, re.MULTILINE)
    releases = [title for _, title in headings if title.startswith("vLLM ")]
    assert len(releases) >= 3, headings
    assert any("withdrawn" in title for _, title in headings)
    assert "Measured on the released wheels" not in _text()  # moved, not kept twice
