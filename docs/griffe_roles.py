"""A griffe extension: the Sphinx roles of sphyr_jax's docstrings become links.

The docstrings are Google style with Sphinx cross-reference roles
(``:func:`~sphyr_jax.scoring.records.score_records```, ``:class:`Banded```,
``:meth:`__call__```).  mkdocstrings renders Markdown, where a role would show
as literal text, so before rendering every role is rewritten:

* a target found in sphyr_jax (a dotted path, or a bare name looked up from the
  docstring's class, then its module, then the package's flat namespace) becomes
  an optional cross-reference to the object's canonical path: a link where the
  site renders that object, plain code where it does not (a private helper);
* anything else (``tempfile.mkstemp``, ``ctypes``) becomes plain code.

``~`` shows the last component only, as in Sphinx.
"""

from __future__ import annotations

import html
import re

import griffe

ROLE = re.compile(r":(?:py:)?(func|class|mod|data|meth|attr|obj|exc|const):`(~?)([^`<>]+?)`")


def _lookup(root: griffe.Module, path: str):
    """The object at a dotted path under the package ``root``, or None."""
    parts = path.split(".")
    if parts[0] != root.name:
        return None
    obj = root
    try:
        for part in parts[1:]:
            obj = obj.members[part]
    except (KeyError, AttributeError, griffe.AliasResolutionError, griffe.CyclicAliasError):
        return None
    return obj


def _canonical(obj) -> str | None:
    """The path where the object is defined (an import's target), or None."""
    try:
        return obj.final_target.path if obj.is_alias else obj.path
    except (griffe.AliasResolutionError, griffe.CyclicAliasError):
        return None


def _resolve(root: griffe.Module, owner, target: str) -> str | None:
    """Canonical path of ``target`` as written in a docstring of ``owner``."""
    target = target.lstrip(".")
    if target.startswith(root.name + "."):
        found = _lookup(root, target)
        return _canonical(found) if found is not None else None
    scopes = []
    scope = owner
    while scope is not None:  # the object itself, its class, its module, its package ...
        scopes.append(scope)
        scope = scope.parent
    scopes.append(root)
    for scope in scopes:
        found = _lookup(root, f"{scope.path}.{target}")
        if found is not None:
            return _canonical(found)
    return None


def _rewrite(root: griffe.Module, owner, text: str) -> str:
    def replace(match: re.Match) -> str:
        short, target = match.group(2) == "~", match.group(3).strip()
        shown = target.rsplit(".", 1)[-1] if short else target
        if match.group(1) in ("func", "meth"):
            shown += "()"
        path = _resolve(root, owner, target)
        code = f"<code>{html.escape(shown)}</code>"
        if path is None:
            return code
        return f'<autoref identifier="{path}" optional>{code}</autoref>'

    return ROLE.sub(replace, text)


def _hide_reexports(pkg: griffe.Module) -> None:
    """A module's API entry shows what it defines: re-exported names stay at their home.

    ``sphyr_jax.fem.fea`` lists the solver classes in its ``__all__`` for callers'
    convenience; rendering them there too would document each twice.  Packages
    (``sphyr_jax``, ``sphyr_jax.rl`` ...) keep their re-exports (their pages name
    them one by one).
    """

    def visit(module: griffe.Module) -> None:
        for member in list(module.members.values()):
            if member.is_alias:
                if not module.is_init_module:
                    member.public = False
            elif member.is_module:
                visit(member)

    visit(pkg)


class SiteDocstrings(griffe.Extension):
    """Once the package is loaded: roles become links, re-exports stay at their home."""

    def on_package(self, *, pkg: griffe.Module, **kwargs) -> None:
        _hide_reexports(pkg)
        seen = set()

        def visit(obj) -> None:
            if id(obj) in seen or obj.is_alias:
                return
            seen.add(id(obj))
            if obj.docstring is not None:
                obj.docstring.value = _rewrite(pkg, obj, obj.docstring.value)
            for member in obj.members.values():
                visit(member)

        visit(pkg)
