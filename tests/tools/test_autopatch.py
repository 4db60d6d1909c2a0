"""``TPUSHIM_AUTOPATCH``: the installed .pth patches at interpreter start, and costs nothing otherwise."""

import ast
import json
import os
import pathlib
import shutil
import sys
import textwrap

import procs
import pytest

import tpushim
from tpushim import _autopatch, _console, _versions

ROOT = pathlib.Path(__file__).resolve().parents[2]

# What a script sees at its first line, before it imports anything itself.
STARTUP = """\
import json, sys
seen = {"tpushim": "tpushim" in sys.modules, "tf": "tensorflow" in sys.modules,
        "runpy": "runpy" in sys.modules}
import tpushim
seen["patched"] = tpushim.is_patched()
print(json.dumps(seen))
"""


def startup(env):
    proc = procs.python(code=STARTUP, env=env)
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout), proc.stderr


def pth_line_from_setup():
    tree = ast.parse((ROOT / "setup.py").read_text())
    for node in tree.body:
        if (
            isinstance(node, ast.Assign)
            and getattr(node.targets[0], "id", None) == "AUTOPATCH_LINE"
        ):
            return ast.literal_eval(node.value)
    raise AssertionError("setup.py defines no AUTOPATCH_LINE")


def test_pth_is_installed_and_never_evaluates_the_variable():
    files = _console.autopatch_files()
    assert files, (
        f"{_console.PTH_NAME} is not in site-packages: reinstall with pip install -e . "
        "(setup.py's build_py / develop write it)"
    )
    text = pathlib.Path(files[0]).read_text()
    assert text == pth_line_from_setup()  # the installed line is the one setup.py writes
    assert text.startswith("import ") and text.count("\n") == 1  # site executes it as one line
    assert "eval(" not in text and "exec(" not in text and "compile(" not in text
    # The variable is only ever compared, as a string, with the off values _autopatch knows.
    assert 'os.environ.get("TPUSHIM_AUTOPATCH", "").strip().lower() not in' in text
    assert repr(_autopatch.OFF).replace("'", '"') in text


@pytest.mark.parametrize("value", ["1", "true", "YES", " On "])
def test_on_patches_before_the_script_without_importing_tensorflow(value):
    seen, stderr = startup({"TPUSHIM_AUTOPATCH": value})
    assert seen == {"tpushim": True, "tf": False, "runpy": seen["runpy"], "patched": True}, stderr
    assert "Warning" not in stderr


@pytest.mark.parametrize("value", [None, "", "0", "false", "No", "OFF"])
def test_off_or_unset_imports_nothing(value):
    seen, stderr = startup({} if value is None else {"TPUSHIM_AUTOPATCH": value})
    assert seen == {"tpushim": False, "tf": False, "runpy": False, "patched": False}
    assert stderr == ""


def test_garbage_value_warns_and_the_interpreter_runs():
    seen, stderr = startup({"TPUSHIM_AUTOPATCH": "maybe"})
    assert not seen["patched"] and not seen["tpushim"]
    assert "RuntimeWarning: tpushim: TPUSHIM_AUTOPATCH='maybe' is not understood" in stderr
    assert "Traceback" not in stderr


def test_an_error_while_patching_warns_and_the_interpreter_runs():
    seen, stderr = startup({"TPUSHIM_AUTOPATCH": "1", "TPUSHIM_BATCH_SIZE": "lots"})
    assert not seen["patched"]
    assert "patching failed, so this interpreter runs unpatched" in stderr
    assert "TPUSHIM_BATCH_SIZE='lots'" in stderr and "Traceback" not in stderr


@pytest.mark.slow  # a TensorFlow subprocess
def test_an_error_while_patching_is_said_again_at_the_first_conversion(tmp_path):
    """The start-up warning is one line among TensorFlow's: the first model_to_estimator call
    says it again, as a conversion line, once; the run is stock's."""
    script = tmp_path / "legacy.py"
    script.write_text(
        textwrap.dedent("""\
        import sys
        import tensorflow as tf
        for i in range(2):
            model = tf.keras.Sequential([tf.keras.layers.Dense(2, input_shape=(3,))])
            model.compile(optimizer=tf.keras.optimizers.legacy.SGD(0.1), loss="mse")
            est = tf.keras.estimator.model_to_estimator(keras_model=model, model_dir=sys.argv[1] + str(i))
            print("RESULT", type(est).__name__)
        """)
    )
    proc = procs.python(
        [script, tmp_path / "model"],
        env={"TPUSHIM_AUTOPATCH": "1", "TPUSHIM_BATCH_SIZE": "abc", "TF_USE_LEGACY_KERAS": ""},
    )
    if _versions.uses_own_estimator():
        # Unpatched on TensorFlow >= 2.16 is stock 2.16+: tf.keras is Keras 3 (tpushim did not
        # set TF_USE_LEGACY_KERAS), which fails the legacy script before any model_to_estimator
        # call. The start-up warning says why tpushim is not on.
        assert proc.returncode == 1
        assert (
            "TPUSHIM_AUTOPATCH is set, but patching failed, so this interpreter runs unpatched: "
            "ConfigurationError: TPUSHIM_BATCH_SIZE='abc' is not a positive integer"
        ) in proc.stderr
        assert "is not supported in Keras 3" in proc.stderr
        return
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.count("RESULT EstimatorV2") == 2
    lines = [line for line in proc.stderr.splitlines() if line.startswith("tpushim: ")]
    assert lines == [
        "tpushim: model_to_estimator -> stock EstimatorV2 (TPUSHIM_AUTOPATCH is set, but tpushim "
        "is not patched: ConfigurationError: TPUSHIM_BATCH_SIZE='abc' is not a positive integer; "
        "set it to e.g. 128, or unset it.)"
    ], proc.stderr


def test_kill_switch_turns_autopatch_off():
    seen, stderr = startup({"TPUSHIM_AUTOPATCH": "1", "TPUSHIM_MODE": "off"})
    assert seen == {"tpushim": False, "tf": False, "runpy": seen["runpy"], "patched": False}
    assert stderr == ""


@pytest.mark.slow  # a TensorFlow subprocess that trains
@pytest.mark.tpuestimator
def test_autopatched_legacy_script_converts(tmp_path):
    script = tmp_path / "legacy.py"
    script.write_text(
        textwrap.dedent("""\
        import sys
        tf_at_start = "tensorflow" in sys.modules
        import tensorflow as tf
        from tensorflow.keras.estimator import model_to_estimator
        model = tf.keras.Sequential([tf.keras.layers.Dense(2, input_shape=(3,))])
        model.compile(optimizer=tf.keras.optimizers.legacy.SGD(0.1), loss="mse")
        estimator = model_to_estimator(keras_model=model, model_dir=sys.argv[1])
        print("RESULT", tf_at_start, isinstance(estimator, tf.compat.v1.estimator.tpu.TPUEstimator))
        """)
    )
    proc = procs.python(
        [script, tmp_path / "model"], env={"TPUSHIM_AUTOPATCH": "1", "TPUSHIM_MODE": "cpu"}
    )
    assert proc.returncode == 0, proc.stderr
    assert "RESULT False True" in proc.stdout
    assert "tpushim: model_to_estimator -> TPUEstimator(use_tpu=False" in proc.stderr


def test_waits_for_sys_path_when_wrapt_comes_from_a_later_site_dir(tmp_path):
    # A user-site or venv install: tpushim's .pth runs before the site dir holding wrapt is added.
    early, src = tmp_path / "early-site", tmp_path / "src"
    early.mkdir()
    shutil.copytree(
        pathlib.Path(tpushim.__file__).parent,
        src / "tpushim",
        ignore=shutil.ignore_patterns("__pycache__"),
    )
    (early / _console.PTH_NAME).write_text(pth_line_from_setup())
    import wrapt

    later = os.path.dirname(os.path.dirname(os.path.abspath(wrapt.__file__)))
    code = f"""\
        import importlib.util, site, sys
        sys.path[:] = [p for p in sys.path if p != {later!r}]  # (python -S: no site dirs yet)
        sys.path.append({str(src)!r})
        site.addsitedir({str(early)!r})  # runs tpushim's .pth
        assert importlib.util.find_spec("wrapt") is None
        assert "tpushim" not in sys.modules
        site.addsitedir({later!r})
        try:
            import sitecustomize  # what site does last
        except ImportError:
            pass
        import tpushim
        print("PATCHED", tpushim.is_patched(), tpushim.__file__.startswith({str(src)!r}))
        """
    proc = procs.python(
        code=code, env={"TPUSHIM_AUTOPATCH": "1"}, cwd=tmp_path, interpreter_flags=("-S",)
    )
    assert proc.returncode == 0, proc.stderr
    assert "PATCHED True True" in proc.stdout
    assert "Warning" not in proc.stderr and "Error processing" not in proc.stderr


def test_deferred_patch_triggers_once_and_leaves(monkeypatch):
    monkeypatch.setattr(sys, "meta_path", list(sys.meta_path))
    monkeypatch.delitem(sys.modules, "tpushim")  # as at start-up: tpushim not imported yet
    assert _autopatch.start({"TPUSHIM_AUTOPATCH": "1"}) == "deferred"
    assert _autopatch.start({"TPUSHIM_AUTOPATCH": "1"}) == "deferred"  # site may run a .pth twice
    finders = [f for f in sys.meta_path if getattr(f, "tpushim_autopatch", False)]
    assert len(finders) == 1
    monkeypatch.setitem(sys.modules, "tpushim", tpushim)
    assert finders[0].find_spec("json") is None and not tpushim.is_patched()
    assert finders[0].find_spec("sitecustomize") is None
    assert tpushim.is_patched()
    assert not any(getattr(f, "tpushim_autopatch", False) for f in sys.meta_path)
    _console.hide_conversions()


@pytest.mark.parametrize(
    "value, expected",
    [
        ("1", True),
        ("TRUE", True),
        ("yes", True),
        ("on", True),
        ("", False),
        ("0", False),
        ("false", False),
        ("no", False),
        ("off", False),
        ("2", None),
        ("enable", None),
    ],
)
def test_values(value, expected):
    assert _autopatch.wanted({"TPUSHIM_AUTOPATCH": value}) is expected
