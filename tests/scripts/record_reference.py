"""Records stock TensorFlow 2.15's numbers for the demo and tests/scripts: tests/reference/tf215.json.

Run with a TensorFlow 2.15 environment, stock (no tpushim patch anywhere):
``python tests/scripts/record_reference.py``. tests/test_tf216_engine.py compares the same scripts
on TensorFlow >= 2.16 under tpushim (its estimator engine) with these numbers (rel 1e-4).
"""

import json
import os
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


#: Takes a step count, not a work folder (tests/test_hardening.py runs it).
SKIPPED = "legacy_text_classifier.py"


def run(args, workdir):
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
    return json.loads(lines[-1][len("RESULT ") :])


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
        for name in scripts:
            out["results"][name] = run([os.path.join(HERE, name)], os.path.join(tmp, name))
            print(name, out["results"][name], flush=True)
    with open(OUT, "w") as f:
        json.dump(out, f, indent=1, sort_keys=True)
        f.write("\n")


if __name__ == "__main__":
    main()
