"""The sphyr_jax app: ``python -m sphyr_jax <command> [--flags]``.

``python -m sphyr_jax --help`` lists the commands; ``python -m sphyr_jax
<command> --help`` lists that command's flags and the shared ones.  Flag files:
``--flagfile=configs/<command>.cfg`` (one ``--flag=value`` per line).

Exit status: 0 on success; 2 for a user mistake (unknown command or flag, a bad
value, a missing folder, a corrupt or unusable input), printed as one line
naming the problem (``--verbosity=1`` or ``SPHYR_JAX_TRACEBACK=1`` adds the
traceback); 1 when a command finished but some of its work failed (it says
which); a bug in the library still shows its traceback.

Start-up: float64 on, one XLA CPU device per core (unless ``XLA_FLAGS`` says
otherwise), and JAX's persistent compilation cache in
``--compilation_cache_dir`` so a second run skips compilation.
"""

from __future__ import annotations

import os
import sys
import traceback

from absl import app, flags

from sphyr_jax.app import common
from sphyr_jax.app.commands import load_all
from sphyr_jax.errors import UserInputError

COMMANDS = load_all()
PROGRAM = "python -m sphyr_jax"
USER_ERRORS = (UserInputError, app.UsageError, FileNotFoundError, NotADirectoryError,
               PermissionError, flags.Error)

FLAGS = flags.FLAGS


def command_list() -> str:
    """The commands, one line each."""
    width = max(len(name) for name in COMMANDS)
    lines = [f"usage: {PROGRAM} <command> [--flags]   ({PROGRAM} <command> --help: its flags)",
             "", "commands:"]
    lines += [f"  {name:<{width}}  {module.SUMMARY}" for name, module in COMMANDS.items()]
    return "\n".join(lines)


def command_help(name: str) -> str:
    """A command's summary, its own flags and the shared flags."""
    module = COMMANDS[name]
    own = FLAGS.module_help(module.__name__)
    shared = FLAGS.module_help(common.__name__)
    return "\n".join([f"usage: {PROGRAM} {name} [--flags]", "", module.SUMMARY, "",
                      "flags of this command:", own or "  (none)", "",
                      "shared flags:", shared])


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
    common.setup()
    try:
        return COMMANDS[argv[1]].main()
    except USER_ERRORS as exc:
        if _show_traceback():
            traceback.print_exc()
        return _fail(f"{argv[1]}: {exc}")


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
