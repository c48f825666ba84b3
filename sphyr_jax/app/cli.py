"""The sphyr_jax app: ``python -m sphyr_jax <command> [--flags]``.

``python -m sphyr_jax --help`` lists the commands; ``python -m sphyr_jax
<command> --help`` lists the flags that command reads (its own and the shared
ones it uses); a flag of the app that the command does not read is a mistake.
Flag files: ``--flagfile=configs/<command>.cfg`` (one ``--flag=value`` per
line).

Exit status: 0 on success; 2 for a user mistake (unknown command or flag, a
flag the command does not read, a bad value, a missing folder, a corrupt or
unusable input), printed as one line naming the problem (``--verbosity=1`` or
``SPHYR_JAX_TRACEBACK=1`` adds the traceback); 1 when a command finished but
some of its work failed (it says which); a bug in the library still shows its
traceback.

Start-up: float64 on, one XLA CPU device per core (unless ``XLA_FLAGS`` says
otherwise), JAX's persistent compilation cache in ``--compilation_cache_dir``
so a second run skips compilation, and library log lines below warnings
(JAX's backend probes) kept off stderr unless ``--verbosity`` asks for them.
"""

from __future__ import annotations

import os
import sys
import textwrap
import traceback

from absl import app, flags
from absl import logging as absl_logging

from sphyr_jax.app import common
from sphyr_jax.app.commands import load_all
from sphyr_jax.errors import UserInputError

COMMANDS = load_all()
PROGRAM = "python -m sphyr_jax"
USER_ERRORS = (UserInputError, app.UsageError, FileNotFoundError, NotADirectoryError,
               IsADirectoryError, FileExistsError, PermissionError, flags.Error)

FLAGS = flags.FLAGS


def command_list() -> str:
    """The commands, one line each."""
    width = max(len(name) for name in COMMANDS)
    lines = [f"usage: {PROGRAM} <command> [--flags]   ({PROGRAM} <command> --help: its flags)",
             "", "commands:"]
    lines += [f"  {name:<{width}}  {module.SUMMARY}" for name, module in COMMANDS.items()]
    return "\n".join(lines)


def app_flags() -> dict:
    """``{flag name: defining module}`` of every flag the app itself defines."""
    modules = [common.__name__] + [module.__name__ for module in COMMANDS.values()]
    return {flag.name: name for name, found in FLAGS.flags_by_module_dict().items()
            if name in modules for flag in found}


def _shared(name: str) -> list[str]:
    """The shared flags a command reads: those it names, and the start-up ones (all)."""
    return sorted(set(COMMANDS[name].SHARED) | set(common.RUNTIME))


def command_flags(name: str) -> list[str]:
    """The flags a command reads: its own, then the shared ones it uses, sorted."""
    module = COMMANDS[name]
    own = sorted({f.name for f in FLAGS.flags_by_module_dict().get(module.__name__, [])})
    return own + _shared(name)


def _flag_help(flag) -> str:
    name = f"--[no]{flag.name}" if flag.boolean else f"--{flag.name}"
    lines = textwrap.wrap(f"{name}: {flag.help}", width=96, initial_indent="  ",
                          subsequent_indent="      ")
    if flag.default is not None and flag.default_as_str not in ("''", ""):
        lines.append(f"      (default: {flag.default_as_str})")
    return "\n".join(lines)


def command_help(name: str) -> str:
    """A command's summary and the flags it reads (its own, then the shared ones it uses)."""
    module = COMMANDS[name]
    shared = _shared(name)
    own = [FLAGS[f] for f in command_flags(name) if f not in shared]
    shared = [FLAGS[f] for f in shared]
    parts = [f"usage: {PROGRAM} {name} [--flags]", "", module.SUMMARY]
    if module.__doc__ and "\n\n" in module.__doc__:
        parts += ["", textwrap.dedent(module.__doc__.split("\n\n", 1)[1]).strip()]
    parts += ["", "flags of this command:", "\n".join(map(_flag_help, own)) or "  (none)"]
    if shared:
        parts += ["", "shared flags it reads:", "\n".join(map(_flag_help, shared))]
    parts += ["", "also: --flagfile=FILE, --verbosity=N (N >= 0: library log lines; "
                  "N >= 1: tracebacks)"]
    return "\n".join(parts)


def unused_flags(name: str) -> list[str]:
    """The app flags given (on the command line or in a flag file) that ``name`` does not read."""
    reads = set(command_flags(name))
    return sorted(f for f in app_flags() if FLAGS[f].present and f not in reads)


def _fail(message: str) -> int:
    print(f"sphyr_jax: error: {message}", file=sys.stderr)
    return 2


def _show_traceback() -> bool:
    return os.environ.get("SPHYR_JAX_TRACEBACK", "") not in ("", "0") or (
        FLAGS.is_parsed() and FLAGS["verbosity"].value >= 1)


def main(argv) -> int:
    """Run the command named in ``argv`` (flags already parsed); returns the exit status."""
    if len(argv) < 2:
        print(command_list(), file=sys.stderr)
        return _fail("no command given")
    if argv[1] not in COMMANDS:
        return _fail(f"unknown command {argv[1]!r}; commands: {', '.join(COMMANDS)}")
    if len(argv) > 2:
        return _fail(f"unexpected arguments {argv[2:]}; flags are written --name=value")
    name = argv[1]
    unused = unused_flags(name)
    if unused:
        listed = ", ".join(f"--{f}" for f in unused)
        return _fail(f"{name} does not read {listed}; see {PROGRAM} {name} --help")
    if not FLAGS["verbosity"].present:  # JAX's backend probes log at INFO: not a user's concern
        absl_logging.set_verbosity(absl_logging.WARNING)
    common.setup()
    try:
        return COMMANDS[name].main()
    except USER_ERRORS as exc:
        if _show_traceback():
            traceback.print_exc()
        return _fail(str(exc))


def _parse(argv):
    try:
        return FLAGS(argv)
    except flags.Error as exc:
        command = next((a for a in argv[1:] if not a.startswith("-")), None)
        hint = f"; see {PROGRAM} {command} --help" if command in COMMANDS else ""
        sys.exit(_fail(f"{exc}{hint}"))


def run(argv=None) -> None:
    """Console-script entry point."""
    argv = list(sys.argv if argv is None else argv)
    wants_help = any(a in ("--help", "-h", "--helpshort", "--helpfull", "-?") for a in argv[1:])
    if wants_help:
        words = [a for a in argv[1:] if not a.startswith("-")]
        if words and words[0] in COMMANDS:
            print(command_help(words[0]))
        else:
            print(command_list())
        sys.exit(0)
    app.run(main, argv=argv, flags_parser=_parse)


if __name__ == "__main__":
    run()
