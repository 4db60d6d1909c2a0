"""The one place tpushim's version, and the TensorFlow releases it supports, are written.

Plain literals and no imports: pyproject.toml (the version; its extras repeat the range, and
tests/test_versions.py keeps them in step), the version guard in tpushim/_versions.py,
``python -m tpushim info`` and .ci/run read them from here without importing TensorFlow.
"""

__version__ = "0.1.0"

#: The TensorFlow minor releases tpushim supports: exactly the ones .ci/run tests, each in its own
#: environment (.ci/constraints-X.Y.txt). Python 3.11 has tensorflow-cpu wheels from 2.12 on, and
#: TensorFlow 2.16 removed estimators and Keras 2's model_to_estimator.
TESTED_TF = ("2.12", "2.13", "2.14", "2.15")


def tf_range():
    """``(lowest, first unsupported)`` minor releases as int pairs: ``((2, 12), (2, 16))``."""
    low = tuple(int(p) for p in TESTED_TF[0].split("."))
    high = tuple(int(p) for p in TESTED_TF[-1].split("."))
    return low, (high[0], high[1] + 1)


def tf_specifier():
    """The pip version specifier of the supported range: ``">=2.12,<2.16"``."""
    low, high = tf_range()
    return f">={low[0]}.{low[1]},<{high[0]}.{high[1]}"


def tf_span():
    """The supported range as people read it: ``"2.12-2.15"``."""
    return f"{TESTED_TF[0]}-{TESTED_TF[-1]}"
