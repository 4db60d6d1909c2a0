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


#: How far a guard's seconds stretch with this machine's load: a proof that takes 10 minutes on
#: CI's quiet 2 cores takes 25 with other work on them (seen: 47 errors on Python 3.12 with a
#: fixed 1,500 s). ``TPUSHIM_TEST_TIMEOUT_SCALE`` sets the factor outright.
MAX_SCALE = 4.0


def scaled(timeout):
    """``timeout`` (seconds on a quiet machine) stretched by the load per core when called
    (at least 1x, at most :data:`MAX_SCALE`), or by ``TPUSHIM_TEST_TIMEOUT_SCALE``."""
    given = os.environ.get("TPUSHIM_TEST_TIMEOUT_SCALE", "").strip()
    if given:
        return timeout * float(given)
    load = os.getloadavg()[0] if hasattr(os, "getloadavg") else 0.0
    return timeout * min(MAX_SCALE, max(1.0, 1.5 * load / (os.cpu_count() or 1)))


def python(args=(), *, code=None, env=None, cwd=None, timeout=900, interpreter_flags=()):
    """Runs ``python [interpreter_flags] ARGS`` (or ``python -c CODE`` with ``code``, dedented).

    Args:
      args: the arguments after the interpreter (a script, ``-m MODULE``, ...).
      code: source for ``-c``, placed before ``args`` (which then become its ``sys.argv[1:]``).
      env: variables set on top of :func:`env_without_tpu`.
      cwd: the working directory.
      timeout: seconds on a quiet machine before the test fails with ``TimeoutExpired``,
        stretched by the load (:func:`scaled`): a guard against a hung process, not a speed
        limit (CI runs the suite on 2 busy cores; speed is benchmarks').
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
        timeout=scaled(timeout),
    )


def proof(script, root, timeout=1500):
    """The last ``RESULT {json}`` line a proof script (``script ROOT``) printed, as a dict: how
    the strategy engine's proofs run in a process of their own (8 logical devices)."""
    import json

    result = python([script, root], timeout=timeout)
    lines = [line for line in result.stdout.splitlines() if line.startswith("RESULT ")]
    assert lines, result.stderr[-4000:]
    return json.loads(lines[-1][len("RESULT ") :])
