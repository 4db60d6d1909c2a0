"""The legacy scripts of tests/scripts/ on the strategy engine (issue 33): which it refuses, and
in which words. Every other script gives stock's RESULT on it (tests/tpuestimator/test_scripts.py on 2.15 with
``--engine strategy``, tests/estimator_api/test_estimator_api_scripts.py on 2.16+ where ``--mode cpu`` takes it)."""

#: script -> the words of the engine's ConversionError (it refuses before anything is written).
REFUSED = {}


def refused_as_said(script, returncode, stderr):
    """True when ``script`` is one the engine refuses and the run ended in that refusal."""
    words = REFUSED.get(script)
    return words is not None and returncode != 0 and "ConversionError" in stderr and words in stderr
