"""The supported range (tpushim/version.py) and the clean stop outside it.

An unsupported installation is faked, not mocked: a subprocess runs with ``-S`` (no site-packages)
and PYTHONPATH holding tpushim and a folder of stand-in packages -- a ``tensorflow`` whose
``__version__`` is 2.16.1 with its dist-info, a Keras 3, and so on -- exactly what the guard reads.
Nothing in tpushim runs against these stand-ins except the guard: if it let them through, the
command would crash on them, and the test would fail.
"""

import os
import re

import procs
import pytest

from tpushim import _versions, version

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def fake_package(site, module, dist, dist_version, body=None):
    """An importable ``module`` and the dist-info of ``dist`` ``dist_version`` that installs it."""
    package = site / module
    package.mkdir(parents=True)
    (package / "__init__.py").write_text(
        body if body is not None else f"__version__ = {dist_version!r}\n"
    )
    info = site / f"{dist.replace('-', '_')}-{dist_version}.dist-info"
    info.mkdir()
    (info / "METADATA").write_text(
        f"Metadata-Version: 2.1\nName: {dist}\nVersion: {dist_version}\n"
    )
    (info / "top_level.txt").write_text(module + "\n")


def fake_site(tmp_path, tf="2.16.1", keras="3.3.3", estimator=None, tf_keras=None):
    site = tmp_path / "site"
    if tf:
        # The import raises: only the guard may look at this TensorFlow, and only at its metadata.
        fake_package(
            site,
            "tensorflow",
            "tensorflow",
            tf,
            f"__version__ = {tf!r}\nraise ImportError('the fake TensorFlow was imported')\n",
        )
    if keras:
        fake_package(site, "keras", "keras", keras)
    if estimator:
        fake_package(site, "tensorflow_estimator", "tensorflow-estimator", estimator)
    if tf_keras:
        fake_package(site, "tf_keras", "tf-keras", tf_keras)
    site.mkdir(exist_ok=True)
    return site


def run_isolated(args, site, cwd, env=None):
    """``python -S ARGS`` seeing only the stand-ins and tpushim (no site-packages at all)."""
    return procs.python(
        args,
        cwd=cwd,
        timeout=300,
        interpreter_flags=("-S",),
        env={
            "TF_USE_LEGACY_KERAS": "",
            **(env or {}),
            "PYTHONPATH": os.pathsep.join([str(site), ROOT]),
        },
    )


WANT = (
    "tpushim does not support TensorFlow 2.16.1 with Keras 3.3.3: TensorFlow 2.16 and later run "
    "legacy Keras scripts through tf_keras (Keras 2), which is not installed"
)


@pytest.mark.parametrize(
    "args",
    [
        ["demo"],
        ["check", "prog.py"],
        ["check", "--json", "-m", "prog"],
        ["prog.py", "--epochs", "3"],
        ["--mode", "cpu", "-m", "prog"],
    ],
    ids=["demo", "check", "check-module", "runner", "runner-module"],
)
def test_commands_stop_at_the_guard_with_exit_2(tmp_path, args):
    site = fake_site(tmp_path, estimator="2.15.0")  # tensorflow-estimator 2.15 beside TF 2.16
    (tmp_path / "prog.py").write_text("print('RAN')\n")
    proc = run_isolated(["-m", "tpushim", *args], site, tmp_path)
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert "Traceback" not in proc.stderr
    assert "RAN" not in proc.stdout
    assert proc.stderr.count("tpushim does not support") == 1, proc.stderr
    assert WANT in proc.stderr
    assert 'Fix: pip install "tf-keras~=2.16.0"' in proc.stderr


def test_tf_keras_of_another_minor_on_2_16_gets_the_same_stop(tmp_path):
    site = fake_site(tmp_path, tf_keras="2.15.0")
    proc = run_isolated(["-m", "tpushim", "demo"], site, tmp_path, env={"TF_USE_LEGACY_KERAS": "1"})
    assert proc.returncode == 2 and "Traceback" not in proc.stderr
    assert (
        "tpushim does not support TensorFlow 2.16.1 with Keras 3.3.3 and tf_keras 2.15.0: "
        "tf_keras 2.15.0 is not the one for TensorFlow 2.16"
    ) in proc.stderr
    assert 'Fix: pip install "tf-keras~=2.16.0"' in proc.stderr


def test_tensorflow_above_the_range_stops(tmp_path):
    site = fake_site(tmp_path, tf="2.22.0", tf_keras="2.22.0")
    proc = run_isolated(["-m", "tpushim", "demo"], site, tmp_path)
    assert proc.returncode == 2 and "Traceback" not in proc.stderr
    assert "tpushim is tested on TensorFlow 2.12-2.21 only" in proc.stderr
    assert 'Fix: pip install "tensorflow>=2.12,<2.22"' in proc.stderr


def test_info_shows_the_message_once(tmp_path):
    site = fake_site(tmp_path)
    proc = run_isolated(["-m", "tpushim", "info"], site, tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert (proc.stdout + proc.stderr).count("tpushim does not support") == 1, (
        proc.stdout + proc.stderr
    )
    assert "TensorFlow 2.16.1, Keras 3.3.3" in proc.stdout and "NOT SUPPORTED" in proc.stdout
    assert WANT in proc.stdout


def test_patch_before_tensorflow_names_the_installed_versions(tmp_path):
    # TensorFlow 2.15 without tensorflow_estimator, patch() before anything imported TensorFlow:
    # the warning names the installed TensorFlow and Keras, read from their metadata.
    site = fake_site(tmp_path, tf="2.15.1", keras="2.15.0")
    code = (
        "import sys, warnings\nwarnings.simplefilter('always')\nimport tpushim\n"
        "tpushim.patch(); tpushim.patch()\nassert 'tensorflow' not in sys.modules\n"
        "print('patched' if tpushim.is_patched() else 'not patched')"
    )
    proc = run_isolated(["-c", code], site, tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == "not patched"
    assert proc.stderr.count("RuntimeWarning: tpushim does not support") == 1, proc.stderr
    assert (
        "tpushim does not support TensorFlow 2.15.1 with Keras 2.15.0: tensorflow_estimator "
        "is not installed"
    ) in proc.stderr


def test_no_tensorflow_at_all(tmp_path):
    site = fake_site(tmp_path, tf=None, keras=None)
    proc = run_isolated(["-m", "tpushim", "demo"], site, tmp_path)
    assert proc.returncode == 2 and "Traceback" not in proc.stderr
    assert "tpushim does not support this environment: TensorFlow is not installed" in proc.stderr


def _pyproject():
    tomllib = pytest.importorskip("tomllib")  # Python 3.11+; the range is checked there
    with open(os.path.join(ROOT, "pyproject.toml"), "rb") as f:
        return tomllib.load(f)


def test_extras_docs_and_ci_follow_the_declared_range():
    spec = version.estimator_tf_specifier()
    project = _pyproject()["project"]
    extras = project["optional-dependencies"]
    old, new = '; python_version < "3.12"', '; python_version >= "3.12"'
    assert f"tensorflow{spec}{old}" in extras["tensorflow"]
    assert f"tensorflow-cpu{spec}{old}" in extras["cpu"]
    # Python 3.12+: the newest TensorFlow tpushim supports, with tf-keras of its minor (which
    # requires the `tensorflow` distribution: the cpu extra takes it too, not tensorflow-cpu).
    newest = f"~={version.NEWEST_TF}.0"
    for extra in ("tensorflow", "cpu"):
        assert f"tensorflow{newest}{new}" in extras[extra], extra
        assert f"tf-keras{newest}{new}" in extras[extra], extra
        assert not [r for r in extras[extra] if r.startswith("tensorflow-cpu") and new in r]
    # TensorFlow <= 2.15 needs numpy 1: every extra that installs TensorFlow or its neighbours
    # carries the bound where it is installed (Python < 3.12), or a later pip run takes numpy 2
    # and downgrades TensorFlow to get it.
    for extra in ("tensorflow", "cpu", "test", "notebooks"):
        assert f"numpy<2{old}" in extras[extra], extra
    # TensorFlow <= 2.15 has wheels for Python 3.9-3.11, TensorFlow 2.21 for 3.10-3.13.
    assert project["requires-python"] == ">=3.9,<3.14"
    with open(os.path.join(ROOT, "README.md"), encoding="utf-8") as f:
        readme = f.read()
    assert f"{version.TESTED_TF[0]} – {version.TESTED_TF[-1]} (`tensorflow{spec}`" in readme
    with open(os.path.join(ROOT, "docs", "contributing", "ci.md"), encoding="utf-8") as f:
        ci_page = f.read()
    for tf_version in version.TESTED_TF:  # one measured row per release CI tests
        assert re.search(rf"^\| {re.escape(tf_version)}\.\d+ \|", ci_page, re.M), tf_version
    for tf_version in version.TESTED_TF:
        assert os.path.isfile(os.path.join(ROOT, ".ci", f"constraints-{tf_version}.txt")), (
            tf_version
        )


@pytest.mark.parametrize(
    "tf_version,keras_version,has_estimator,tf_keras_version,ok",
    [
        ("2.15.1", "2.15.0", True, None, True),
        ("2.12.0", "2.12.0", True, None, True),
        ("2.13.1", "2.13.1", True, None, True),
        ("2.14.1", "2.14.0", True, None, True),
        ("2.15.0-dev20231010", "2.15.0", True, None, True),
        # 2.16+: tpushim's estimator API, with tf_keras of TensorFlow's own minor release
        ("2.16.1", "3.1.0", False, "2.16.0", True),
        ("2.21.0", "3.15.1", False, "2.21.0", True),
        ("2.17.0rc0", None, True, "2.17.0", True),
        ("2.16.1", "3.1.0", False, None, False),  # no tf_keras
        ("2.16.1", None, True, None, False),  # tensorflow_estimator 2.15 beside it does not help
        ("2.21.0", "3.15.1", False, "2.20.0", False),  # tf_keras of another minor
        ("2.22.0", "3.16.0", False, "2.22.0", False),  # above the range
        ("2.11.1", "2.11.0", True, None, False),  # below the range CI tests
        ("2.9.0", "2.9.0", True, None, False),
        ("2.15.0", "3.0.0", True, None, False),
        ("2.15.0", "2.15.0", False, None, False),
        (None, None, False, None, False),  # no TensorFlow at all
        (None, None, True, None, True),  # TensorFlow not imported yet: decided at import
    ],
)
def test_version_guard_decision(tf_version, keras_version, has_estimator, tf_keras_version, ok):
    problem = _versions.version_problem(tf_version, keras_version, has_estimator, tf_keras_version)
    assert (problem is None) == ok
    if not ok:
        engine = tf_version and "2.16" <= tf_version < "2.22"
        fix = f'pip install "tf-keras~={tf_version[:4]}.0"' if engine else "tensorflow>=2.12,<2.22"
        assert fix in problem
        assert "Supported: TensorFlow 2.12-2.21" in problem
        assert "Nothing was patched" in problem
        if tf_version:
            assert f"TensorFlow {tf_version} with Keras {keras_version or '(none)'}" in problem


def test_version_guard_names_tf_keras():
    problem = _versions.version_problem("2.16.1", "3.3.3", True, tf_keras_version="2.15.0")
    assert problem.startswith(
        "tpushim does not support TensorFlow 2.16.1 with Keras 3.3.3 and tf_keras 2.15.0: "
        "tf_keras 2.15.0 is not the one for TensorFlow 2.16"
    )


def test_supported_range_is_declared_once():
    assert version.TESTED_TF == ("2.12", "2.13", "2.14", "2.15")
    assert (version.ESTIMATOR_API_TF, version.NEWEST_TF) == ("2.16", "2.21")
    assert _versions.SUPPORTED_TF == version.tf_range() == ((2, 12), (2, 22))
    assert version.tf_specifier() == ">=2.12,<2.22"
    assert version.estimator_tf_specifier() == ">=2.12,<2.16"
    # The installed TensorFlow is one CI tests.
    tf_version = _versions.installed()["tensorflow"]
    assert ".".join(tf_version.split(".")[:2]) in (*version.TESTED_TF, version.NEWEST_TF)


def test_patch_on_tensorflow_above_the_range_warns_once_and_patches_nothing(monkeypatch):
    # In process, on the real TensorFlow with its version string faked: patch() must neither raise
    # nor wrap, and say once what is wrong and how to fix it.
    pytest.importorskip("tensorflow_estimator", reason="TensorFlow <= 2.15's keras_lib is faked")
    import tensorflow as tf
    from tensorflow_estimator.python.estimator import keras_lib

    import tpushim

    original = keras_lib.model_to_estimator
    monkeypatch.setattr(tf, "__version__", "2.22.0")
    with pytest.warns(RuntimeWarning) as record:
        tpushim.patch()
        tpushim.patch()
        with tpushim.patched(mode="cpu"):
            assert keras_lib.model_to_estimator is original
    messages = [str(w.message) for w in record if issubclass(w.category, RuntimeWarning)]
    assert len(messages) == 1, messages
    assert messages[0].startswith("tpushim does not support TensorFlow 2.22.0 with Keras 2.")
    assert "Nothing was patched" in messages[0]
    assert 'Fix: pip install "tensorflow>=2.12,<2.22"' in messages[0]
    assert not tpushim.is_patched()
    assert keras_lib.model_to_estimator is original
    assert tpushim.status()["unsupported"] == messages[0]


def test_the_stand_ins_crash_a_command_the_guard_lets_through(tmp_path):
    # The control for the tests above: on supported stand-in versions the guard lets the command
    # through, and it dies on the stand-in TensorFlow -- so exit 2 and no traceback there come
    # from the guard, not from the stand-ins.
    site = fake_site(tmp_path, tf="2.15.1", keras="2.15.0", estimator="2.15.0")
    proc = run_isolated(["-m", "tpushim", "demo"], site, tmp_path)
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert "ImportError: the fake TensorFlow was imported" in proc.stderr
    assert "tpushim does not support" not in proc.stderr


#: A ``sitecustomize`` that makes ``import tf_keras`` fail as where tf-keras is not installed
#: (its files stay on disk: the environment is faked, TensorFlow is not).
NO_TF_KERAS = """
import sys

class NoTfKeras:
    def find_spec(self, name, path=None, target=None):
        if name == "tf_keras" or name.startswith("tf_keras."):
            raise ModuleNotFoundError(f"No module named {name!r}", name=name)
        return None

sys.meta_path.insert(0, NoTfKeras())
"""


def test_without_tf_keras_patch_names_the_install_and_leaves_tf_keras_alone(tmp_path):
    """Real TensorFlow, tf_keras unimportable: on 2.16+ ``patch()`` warns with the install that
    fixes it and does not set TF_USE_LEGACY_KERAS (which made the script die later, at its first
    ``tf.keras.layers.Input``, with ``ImportError: Keras cannot be imported``)."""
    shim = tmp_path / "shim"
    shim.mkdir()
    (shim / "sitecustomize.py").write_text(NO_TF_KERAS)
    code = (
        "import os, warnings\nimport tpushim\n"
        "with warnings.catch_warnings(record=True) as caught:\n"
        "    warnings.simplefilter('always'); tpushim.patch()\n"
        "print('patched', tpushim.is_patched(), os.environ.get('TF_USE_LEGACY_KERAS') or None)\n"
        "for w in caught: print('WARNING', w.message)\n"
        "import tensorflow as tf\ntf.keras.layers.Input((2,))\nprint('Input ok')\n"
    )
    proc = procs.python(
        code=code, env={"PYTHONPATH": os.pathsep.join([str(shim), ROOT]), "TF_USE_LEGACY_KERAS": ""}
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "Input ok" in proc.stdout
    if not _versions.uses_own_estimator():  # TensorFlow <= 2.15 has its own Keras 2
        assert "patched True None" in proc.stdout and "WARNING" not in proc.stdout
        return
    tf_version = _versions.installed_versions(read_metadata=True)[0]
    minor = ".".join(tf_version.split(".")[:2])
    assert "patched False None" in proc.stdout, proc.stdout
    warned = [line for line in proc.stdout.splitlines() if line.startswith("WARNING")]
    assert len(warned) == 1, proc.stdout
    assert (
        f"tpushim does not support TensorFlow {tf_version} with Keras 3."  # the Keras there is
    ) in warned[0]
    assert (
        "TensorFlow 2.16 and later run legacy Keras scripts through tf_keras (Keras 2), which is "
        "not installed"
    ) in warned[0]
    assert warned[0].endswith(
        f'Nothing was patched. Fix: pip install "tf-keras~={minor}.0"  (each tf-keras release '
        "pins its TensorFlow minor)"
    ), warned[0]
    assert "tpushim set TF_USE_LEGACY_KERAS" not in proc.stderr
