"""How far float32 rounding alone moves ``boston_feature_columns_batchnorm.py``'s ``linreg_last``.

The JAX engine gives that number (the last test row's prediction of the Ftrl model) 1.5e-4
(relative) off stock TensorFlow 2.15's recording, while every weight is within 2.5e-6. This runs
the script unchanged under variants that change only how float32 results are rounded (the
order of sums, fused or reassociated arithmetic), and prints each variant's ``linreg_last`` and
the largest relative difference of every other key, both against stock 2.15's recording
(tests/reference/tf215.json):

- stock 2.15 as is, with one intra-op thread, with its oneDNN kernels off
  (``TF_ENABLE_ONEDNN_OPTS=0``: TensorFlow's own switch, which it says changes round-off), with
  XLA auto-clustering of its own training graph (``TF_XLA_FLAGS=--tf_xla_auto_jit=2
  --tf_xla_cpu_global_jit``), and stock 2.12;
- the JAX engine (``--mode cpu``) on 8 and on 1 XLA CPU devices, with XLA's CPU fast math off
  (the default) and on;
- the JAX engine with ``tf2jax``'s ``Sum`` over the batch axis in the forward pass
  (BatchNormalization's moments over the real rows, the loss's sum over rows; JAX derives the
  gradients from them) computed another
  way: refined (``n * mean`` plus the residuals' sum: the sum rounded nearly exactly), or row by
  row from the first (the order in which TensorFlow's CPU kernel, Eigen, reduces an outer axis).

    python benchmarks/boston_rounding.py [--stock PYTHON] [--jax PYTHON] [--json FILE]

``--stock`` is a TF 2.15 interpreter (stock's estimator), ``--older`` a TF 2.12 one, ``--jax`` one with TF >= 2.16, tf-keras,
jax and tf2jax; both default to the project's CI venvs. Each variant is one process (about 10 s
for stock, 20 s for the engine on quiet cores).
"""

import argparse
import json
import os
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(HERE)
SCRIPT = os.path.join(REPO, "tests", "scripts", "boston_feature_columns_batchnorm.py")
VENVS = os.path.join(REPO, ".ci-venvs")
KEY = "linreg_last"

#: Runs SCRIPT WORKDIR under tpushim's JAX engine, with tf2jax's Sum over the batch axis (of a
#: [batch, n] float: BatchNormalization's moments, the loss's) replaced as
#: SUM_VARIANT says (absent: tf2jax's own).
ENGINE = r"""
import os, runpy, sys
variant = os.environ.get("SUM_VARIANT")
if variant:
    import jax, jax.numpy as jnp
    from tf2jax._src import ops

    own = ops._jax_ops["Sum"]

    def _sum(proto):
        keep, tf2jax_sum = proto.attr["keep_dims"].b, own(proto)

        def total(x, axis):
            ax = tuple(sorted(int(a) % x.ndim for a in axis.reshape(-1).tolist()))
            if ax != (0,) or x.ndim != 2 or not jnp.issubdtype(x.dtype, jnp.floating):
                return tf2jax_sum(x, axis)
            if variant == "refined":  # n * mean + the residuals' sum: rounded nearly exactly
                m0 = jax.lax.stop_gradient(jnp.mean(x, axis=0))
                s = x.shape[0] * m0 + jnp.sum(x - m0, axis=0)
            else:  # "sequential": row by row from the first, as Eigen reduces an outer axis
                s = jax.lax.fori_loop(1, x.shape[0], lambda i, s: s + x[i], x[0])
            return s[None] if keep else s

        return total

    ops._jax_ops["Sum"] = _sum
import tpushim
tpushim.patch(quiet=True)
sys.argv = sys.argv[1:]
runpy.run_path(sys.argv[0], run_name="__main__")
"""

XLA_JIT = {"TF_XLA_FLAGS": "--tf_xla_auto_jit=2 --tf_xla_cpu_global_jit"}
ONE_THREAD = {"TF_NUM_INTRAOP_THREADS": "1", "TF_NUM_INTEROP_THREADS": "1"}
FAST = " --xla_cpu_enable_fast_math=true"


def _devices(n, extra=""):
    return {"XLA_FLAGS": f"--xla_force_host_platform_device_count={n}{extra}"}


#: name -> (which interpreter, extra environment)
VARIANTS = {
    "stock 2.15": ("stock", {}),
    "stock 2.15, one intra-op thread": ("stock", ONE_THREAD),
    "stock 2.15, oneDNN off": ("stock", {"TF_ENABLE_ONEDNN_OPTS": "0"}),
    "stock 2.15, XLA auto-clustering": ("stock", XLA_JIT),
    "stock 2.12": ("older", {}),
    "engine, 8 devices": ("jax", _devices(8)),
    "engine, 1 device": ("jax", _devices(1)),
    "engine, 8 devices, XLA fast math on": ("jax", _devices(8, FAST)),
    "engine, 1 device, XLA fast math on": ("jax", _devices(1, FAST)),
    "engine, 8 devices, batch sums refined": ("jax", {**_devices(8), "SUM_VARIANT": "refined"}),
    "engine, 8 devices, batch sums row by row": (
        "jax",
        {**_devices(8), "SUM_VARIANT": "sequential"},
    ),
    "engine, 1 device, batch sums row by row": (
        "jax",
        {**_devices(1), "SUM_VARIANT": "sequential"},
    ),
}


def run(python, kind, extra, workdir):
    env = {**os.environ, "PYTHONPATH": REPO, **extra}
    if kind == "jax":  # the others: stock
        env.update(TPUSHIM_MODE="cpu", TPUSHIM_ENGINE="jax")
        args = [python, "-c", ENGINE, SCRIPT, workdir]
    else:
        args = [python, SCRIPT, workdir]
    out = subprocess.run(args, env=env, capture_output=True, text=True, check=False)
    lines = [x for x in out.stdout.splitlines() if x.startswith("RESULT ")]
    if not lines:
        raise RuntimeError(out.stderr[-2000:])
    return json.loads(lines[-1][len("RESULT ") :])


def relative(got, want):
    return abs(got - want) / max(abs(want), 1e-12)


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--stock", default=os.path.join(VENVS, "tf2.15", "bin", "python"))
    parser.add_argument("--older", default=os.path.join(VENVS, "tf2.12", "bin", "python"))
    parser.add_argument("--jax", default=os.path.join(VENVS, "jax", "bin", "python"))
    parser.add_argument("--work", default=None, help="work folder (default: a new temporary one)")
    parser.add_argument("--json", help="also write every variant's RESULT to this file")
    parser.add_argument("--only", help="only the variants whose name has this text")
    args = parser.parse_args()
    import tempfile

    with open(os.path.join(REPO, "tests", "reference", "tf215.json"), encoding="utf-8") as f:
        want = json.load(f)["results"][os.path.basename(SCRIPT)]
    got = {}
    with tempfile.TemporaryDirectory(dir=args.work) as work:
        print(f"| variant | {KEY} | relative to stock 2.15 | other keys, largest relative |")
        print("|---|---|---|---|")
        for i, (name, (kind, extra)) in enumerate(VARIANTS.items()):
            if args.only and args.only not in name:
                continue
            result = got[name] = run(getattr(args, kind), kind, extra, os.path.join(work, str(i)))
            others = max(
                relative(v, want[k])
                for k, v in result.items()
                if k != KEY and isinstance(v, float) and k in want
            )
            print(
                f"| {name} | {result[KEY]:.9f} | {relative(result[KEY], want[KEY]):.1e} |"
                f" {others:.1e} |",
                flush=True,
            )
    if args.json:
        with open(args.json, "w", encoding="utf-8") as f:
            json.dump(got, f, indent=1)


if __name__ == "__main__":
    sys.exit(main())
