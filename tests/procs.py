"""The one way tests start a Python subprocess: a clean environment (no TPU configured), real
TensorFlow, output captured as text. Process-global behaviour (start-up, ``disable_v2_behavior``,
import order, the command line) is tested this way."""

import os
import subprocess
import sys
import textwrap

from conftest import TPUSHIM_VARS


def env_without_tpu(**overrides):
    """``os.environ`` with every tpushim and TPU variable removed, TensorFlow's C++ logs quiet, and
    ``overrides`` applied."""
    env = {k: v for k, v in os.environ.items() if k not in TPUSHIM_VARS}
    env["TF_CPP_MIN_LOG_LEVEL"] = "2"
    env.update(overrides)
    return env


def python(args=(), *, code=None, env=None, cwd=None, timeout=900, interpreter_flags=()):
    """Runs ``python [interpreter_flags] ARGS`` (or ``python -c CODE`` with ``code``, dedented).

    Args:
      args: the arguments after the interpreter (a script, ``-m MODULE``, ...).
      code: source for ``-c``, placed before ``args`` (which then become its ``sys.argv[1:]``).
      env: variables set on top of :func:`env_without_tpu`.
      cwd: the working directory.
      timeout: seconds before the test fails with ``TimeoutExpired``: a guard against a hung
        process, not a speed limit (CI runs the suite on 2 busy cores; speed is benchmarks').
      interpreter_flags: e.g. ``("-S",)``, before everything else.
    Returns:
      the ``subprocess.CompletedProcess`` with ``stdout`` and ``stderr`` as text.
    """
    command = [sys.executable, *interpreter_flags]
    if code is not None:
        command += ["-c", textwrap.dedent(code)]
    command += [str(a) for a in args]
    return subprocess.run(
        command,
        check=False,
        env=env_without_tpu(**(env or {})),
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def proof(script, root, timeout=1500):
    """The last ``RESULT {json}`` line a proof script (``script ROOT``) printed, as a dict: how
    the strategy engine's proofs run in a process of their own (8 logical devices)."""
    import json

    result = python([script, root], timeout=timeout)
    lines = [line for line in result.stdout.splitlines() if line.startswith("RESULT ")]
    assert lines, result.stderr[-4000:]
    return json.loads(lines[-1][len("RESULT ") :])
