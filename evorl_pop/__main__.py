"""``evorl-pop`` and ``python -m evorl_pop``: the command line, holding Ctrl-C from its
first instant.

Importing JAX takes seconds; a Ctrl-C that raised ``KeyboardInterrupt`` there could
be dropped (one raised in a garbage-collector callback is printed as "Exception
ignored" and the command goes on). So this module imports nothing heavy before
:func:`evorl_pop.run.stop.hold` takes the stop signals; the command then stops
where it is safe to, with exit status 130 (Ctrl-C) and one line that says what
the run folder holds. :func:`evorl_pop.cli.main` is the same command for Python.
"""

from __future__ import annotations

import sys

from evorl_pop.run import stop


def main(argv: list[str] | None = None) -> int:
    """Runs ``evorl-pop`` on ``argv`` (``None``: ``sys.argv[1:]``); returns its exit status."""
    stop.hold()
    argv = sys.argv[1:] if argv is None else list(argv)
    try:
        from evorl_pop import cli  # JAX and the rest

        stop.check()
    except KeyboardInterrupt as err:  # before the command began
        command = next((a for a in argv if not a.startswith("-")), "")
        return stop.report(err, command)
    return cli.main(argv)


if __name__ == "__main__":
    sys.exit(main())
