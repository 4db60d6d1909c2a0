"""The bundled demo: ``python -m tpushim demo``.

:mod:`tpushim.demo.legacy_mlp` is a legacy Keras -> Estimator script as its owner wrote it, with no
tpushim in it. ``python -m tpushim demo`` runs it twice in one process, once with the stock
estimator and once converted by tpushim, and prints both results side by side; ``python -m tpushim
-m tpushim.demo.legacy_mlp`` runs it once, patched, as any legacy script would be.
"""
