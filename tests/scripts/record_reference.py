"""Records stock TensorFlow 2.15's numbers for the demo and tests/scripts: tests/reference/tf215.json.

Run with a TensorFlow 2.15 environment, stock (no tpushim patch anywhere):
``python tests/scripts/record_reference.py``. tests/estimator_api/test_estimator_api_scripts.py compares the same scripts
on TensorFlow >= 2.16 under tpushim (its estimator API) with these numbers (rel 1e-4).

Run with TensorFlow >= 2.16 (``--engine``), it records the other direction under tpushim:
the demo's model after 100 steps (tests/reference/tf221_demo_model) and a SavedModel exported
from it (tests/reference/tf221_saved_model) with its predictions (tests/reference/tf221.json),
which tests/estimator_api/test_tf216_interop.py reads on stock TensorFlow 2.15.
"""

import json
import os
import shutil
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
OUT = os.path.join(ROOT, "tests", "reference", "tf215.json")
#: The demo's numbers, printed as the scripts print theirs.
DEMO = (
    "import json, sys, numpy as np\n"
    "from tpushim.demo import legacy_mlp\n"
    "results, predictions = legacy_mlp.train_and_evaluate(sys.argv[1])\n"
    "out = {k: float(v) for k, v in results.items()}\n"
    "out.update(predictions=len(predictions), first=float(predictions[0][0]),"
    " last=float(predictions[-1][0]))\n"
    "print('RESULT ' + json.dumps(out))\n"
)


#: Takes a step count, not a work folder (tests/core/test_hardening.py runs it).
SKIPPED = "legacy_text_classifier.py"


#: The demo's model trained in two train() calls, each in its own process: ``phase 1`` writes a
#: model_dir (its checkpoint is kept in tests/reference/tf215_demo_model), ``phase 2`` resumes
#: from it, trains on and prints the numbers. On TensorFlow >= 2.16 phase 2 resumes from stock
#: 2.15's checkpoint: the checkpoints interoperate when the numbers are the same.
RESUME = (
    "import json, sys, numpy as np, tensorflow as tf\n"
    "from tpushim.demo import legacy_mlp as d\n"
    "model_dir, phase = sys.argv[2], sys.argv[1]\n"
    "KERNEL = 'layer_with_weights-0/kernel/.ATTRIBUTES/VARIABLE_VALUE'\n"
    "tf.keras.utils.set_random_seed(d.SEED)\n"
    "x, y = d.make_data(1000, seed=1)\n"
    "x_eval, y_eval = d.make_data(200, seed=2)\n"
    "config = tf.estimator.RunConfig(model_dir=model_dir, tf_random_seed=d.SEED)\n"
    "est = tf.keras.estimator.model_to_estimator(keras_model=d.build_model(), config=config)\n"
    "est.train(input_fn=lambda: d.train_input_fn(x, y), steps=100)\n"
    "if phase == '2':\n"
    "    out = {k: float(v) for k, v in est.evaluate(lambda: d.eval_input_fn(x_eval, y_eval)).items()}\n"
    "    p = np.stack([q['probabilities'] for q in est.predict(lambda: d.eval_input_fn(x_eval))])\n"
    "    out.update(first=float(p[0][0]), last=float(p[-1][0]),\n"
    "               kernel=float(np.sum(est.get_variable_value(KERNEL))))\n"
    "    print('RESULT ' + json.dumps(out))\n"
    "else:\n"
    "    print('RESULT {}')\n"
)
#: The files of phase 1's model_dir kept: the step-100 checkpoint itself (no graph, events or
#: Keras copy), and a ``checkpoint`` index naming only it.
KEPT = "model.ckpt-100."


#: On TensorFlow >= 2.16, under tpushim: phase 1 of RESUME, then the model exported and its
#: SavedModel's predictions on the demo's eval data (loaded back with tf.saved_model.load).
EXPORT = (
    "import tpushim; tpushim.patch()\n" + RESUME + "import os\n"
    "def receiver():\n"
    "    x = tf.compat.v1.placeholder(tf.float32, [None, d.NUM_FEATURES], name='x')\n"
    "    return tf.estimator.export.ServingInputReceiver({'hidden_input': x}, {'x': x})\n"
    "path = est.export_saved_model(os.path.join(model_dir, 'export'), receiver).decode()\n"
    "serve = tf.saved_model.load(path).signatures['serving_default']\n"
    "p = serve(x=tf.constant(x_eval))['probabilities'].numpy()\n"
    "print('EXPORTED ' + path)\n"
    "print('RESULT ' + json.dumps(dict(first=p[0].tolist(), last=p[-1].tolist(), class0=float(p[:, 0].sum()))))\n"
)


def keep_checkpoint(model_dir, kept):
    """The step-100 checkpoint of ``model_dir`` copied to ``kept`` (and its ``checkpoint`` file)."""
    shutil.rmtree(kept, ignore_errors=True)
    os.makedirs(kept)
    for name in os.listdir(model_dir):
        if name.startswith(KEPT) and not name.endswith(".meta"):
            shutil.copy(os.path.join(model_dir, name), kept)
    with open(os.path.join(kept, "checkpoint"), "w") as f:
        f.write('model_checkpoint_path: "model.ckpt-100"\n')
        f.write('all_model_checkpoint_paths: "model.ckpt-100"\n')


def engine():
    """``--engine``: what tpushim writes on TensorFlow >= 2.16, for stock 2.15 to read."""
    import tensorflow as tf

    reference = os.path.join(ROOT, "tests", "reference")
    with tempfile.TemporaryDirectory() as tmp:
        model_dir = os.path.join(tmp, "model")
        result, output = run(["-c", EXPORT, "1"], model_dir, output=True)
        keep_checkpoint(model_dir, os.path.join(reference, "tf221_demo_model"))
        exported = [x for x in output.splitlines() if x.startswith("EXPORTED ")][-1][9:]
        saved = os.path.join(reference, "tf221_saved_model")
        shutil.rmtree(saved, ignore_errors=True)
        shutil.copytree(exported, saved)
    out = {"tensorflow": tf.__version__, "python": sys.version.split()[0], "saved_model": result}
    with open(os.path.join(reference, "tf221.json"), "w") as f:
        json.dump(out, f, indent=1, sort_keys=True)
        f.write("\n")


def run(args, workdir, output=False):
    os.makedirs(workdir, exist_ok=True)
    env = dict(os.environ, PYTHONPATH=ROOT, TPUSHIM_AUTOPATCH="0", TF_CPP_MIN_LOG_LEVEL="2")
    proc = subprocess.run(
        [sys.executable, *args, workdir],
        check=False,
        capture_output=True,
        text=True,
        env=env,
        cwd=workdir,
    )
    lines = [x for x in proc.stdout.splitlines() if x.startswith("RESULT ")]
    if proc.returncode or not lines:
        raise SystemExit(f"{args} failed:\n{proc.stderr[-3000:]}")
    result = json.loads(lines[-1][len("RESULT ") :])
    return (result, proc.stdout) if output else result


def main():
    import tensorflow as tf

    scripts = sorted(
        name
        for name in os.listdir(HERE)
        if name.endswith(".py") and name not in (os.path.basename(__file__), SKIPPED)
    )
    out = {"tensorflow": tf.__version__, "python": sys.version.split()[0], "results": {}}
    with tempfile.TemporaryDirectory() as tmp:
        out["results"]["demo"] = run(["-c", DEMO], os.path.join(tmp, "demo"))
        model_dir = os.path.join(tmp, "resume", "model")
        run(["-c", RESUME, "1"], model_dir)
        keep_checkpoint(model_dir, os.path.join(ROOT, "tests", "reference", "tf215_demo_model"))
        out["results"]["demo resumed"] = run(["-c", RESUME, "2"], model_dir)
        for name in scripts:
            out["results"][name] = run([os.path.join(HERE, name)], os.path.join(tmp, name))
            print(name, out["results"][name], flush=True)
    with open(OUT, "w") as f:
        json.dump(out, f, indent=1, sort_keys=True)
        f.write("\n")


if __name__ == "__main__":
    engine() if sys.argv[1:] == ["--engine"] else main()
