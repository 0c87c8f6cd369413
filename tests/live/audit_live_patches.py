"""Patches of the installed vLLM for the live audit tests, written at test time from the
release's own files with ``ast`` (no vLLM code is in the repository): the window formula
fixed (``cdiv(sw - 1 + e, tpc)`` alone) or broken (one chunk more), and the store path's
prompt-only clamp removed (decoded tokens stored: C10's "past the committed tokens")."""

from __future__ import annotations

import ast
from pathlib import Path

from kvcontract.tools.audit.audited_files import OFFLOAD_CONFIG, SCHEDULER
from kvcontract.tools.audit.targets import resolve_target


def installed_package() -> Path:
    package = resolve_target("vllm:installed").package_dir
    assert package is not None
    return package


def base_mark() -> str:
    """The ``@base=`` suffix laying a patch over the installed release."""
    return f"@base=vllm:{installed_package().parent}"


class _Window(ast.NodeTransformer):
    """``max(cdiv(sw, tpc), cdiv(sw - 1 + e, tpc))``: ``fix`` keeps the second term,
    ``break`` returns the first plus one."""

    def __init__(self, mode: str) -> None:
        self.mode = mode
        self.done = False

    def visit_Call(self, node: ast.Call) -> ast.AST:
        self.generic_visit(node)
        if isinstance(node.func, ast.Name) and node.func.id == "max" and \
                len(node.args) == 2 and not self.done:
            self.done = True
            if self.mode == "fix":
                return node.args[1]
            return ast.BinOp(node.args[0], ast.Add(), ast.Constant(1))
        return node


def window_patch(out: Path, mode: str) -> Path:
    """A one-function patch of ``get_sliding_window_size_in_chunks`` (``fix``/``break``)."""
    tree = ast.parse((installed_package() / OFFLOAD_CONFIG).read_text())
    node = next(n for n in tree.body if isinstance(n, ast.FunctionDef)
                and n.name == "get_sliding_window_size_in_chunks")
    edit = _Window(mode)
    edit.visit(node)
    assert edit.done, "the release's window formula is not a max of two terms"
    ast.fix_missing_locations(node)
    out.write_text(ast.unparse(ast.Module(body=[node], type_ignores=[])) + "\n")
    return out


class _NoPromptClamp(ast.NodeTransformer):
    def __init__(self) -> None:
        self.done = False

    def visit_If(self, node: ast.If) -> ast.AST | None:
        if "offload_prompt_only" in ast.unparse(node.test):
            self.done = True
            return None
        return node


def store_patch(out: Path) -> Path:
    """``OffloadingConnectorScheduler._calc_num_offloadable_tokens`` without its
    ``offload_prompt_only`` clamp, in a class of that name (the rest of the release's
    class stays the release's)."""
    tree = ast.parse((installed_package() / SCHEDULER).read_text())
    cls = next(n for n in tree.body if isinstance(n, ast.ClassDef)
               and n.name == "OffloadingConnectorScheduler")
    node = next(n for n in cls.body if isinstance(n, ast.FunctionDef)
                and n.name == "_calc_num_offloadable_tokens")
    edit = _NoPromptClamp()
    edit.visit(node)
    assert edit.done, "the release's offloadable-token count has no prompt-only clamp"
    holder = ast.ClassDef(name=cls.name, bases=[], keywords=[], body=[node],
                          decorator_list=[])
    ast.fix_missing_locations(holder)
    out.write_text(ast.unparse(ast.Module(body=[holder], type_ignores=[])) + "\n")
    return out
