"""The loss kinds as values (tpushim/_loss_kinds.py's ``LossKind``): every kind has every
operation a site computes with, a kind without one cannot be made, and no site compares kinds.
On every TensorFlow: both engines' losses read them."""

import ast
import itertools
import os

import numpy as np
import pytest

from tpushim import _loss_kinds

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
PACKAGE = os.path.join(ROOT, "tpushim")
OPERATIONS = sorted(_loss_kinds.LossKind.__abstractmethods__)
DEGREE_OPERATIONS = ("shard_factor", "of_rows", "of_rows_inverse")
#: Modules that may compare a kind with a member, and why: not arithmetic, a refusal.
COMPARING = {
    os.path.join("_jax", "_trace.py"): "the JAX engine's step takes per-example terms only",
}


def test_every_kind_implements_every_operation():
    assert OPERATIONS == ["averages_over_shards", "reads_rows", "term"]
    for kind in _loss_kinds.KINDS:
        assert isinstance(kind, _loss_kinds.LossKind)
        for name in OPERATIONS:
            assert getattr(type(kind), name) is not getattr(_loss_kinds.LossKind, name), (
                kind,
                name,
            )
    degrees = [k for k in _loss_kinds.KINDS if isinstance(k, _loss_kinds.Degree)]
    assert degrees == list(_loss_kinds.DEGREES) and _loss_kinds.MEAN in degrees
    assert len(set(_loss_kinds.KINDS)) == len(_loss_kinds.KINDS)  # told apart by value


def test_a_kind_without_an_operation_cannot_be_made():
    class Halved(_loss_kinds.LossKind):  # a new kind that forgot reads_rows
        def term(self, per_example, one_number):
            return per_example()

        def averages_over_shards(self, mean=True, masked=False, weighted=False):
            return False

    with pytest.raises(TypeError, match="reads_rows"):
        Halved()


def test_each_kind_builds_its_term_with_the_sites_functions():
    def built(kind):
        calls = []
        out = kind.term(
            per_example=lambda: calls.append("per example") or "rows",
            one_number=lambda degree, per_row: calls.append((degree, per_row)) or "one",
        )
        return out, calls

    assert built(_loss_kinds.ROWS) == ("rows", ["per example"])
    for degree in _loss_kinds.DEGREES:  # evaluated row by row on a padded batch
        assert built(degree) == ("one", [(degree, True)])
    # A constant is the same on the real rows as on the padded batch: a mean, on the batch.
    assert built(_loss_kinds.CONSTANT) == ("one", [(_loss_kinds.MEAN, False)])
    assert built(_loss_kinds.UNWEIGHTED) == (None, [])  # nothing computed


def _averages(kind, mean, masked, weighted):
    return kind.averages_over_shards(mean=mean, masked=masked, weighted=weighted)


@pytest.mark.parametrize("mean, masked, weighted", list(itertools.product([True, False], repeat=3)))
def test_which_terms_keras_own_loss_averages_over_shards(mean, masked, weighted):
    """A mean over the shard's rows averages to the batch's (sample weights included for one
    value per example; a one-number mean times the weights' mean does not); nothing does too."""
    assert _averages(_loss_kinds.ROWS, mean, masked, weighted) == (mean and not masked)
    plain = mean and not masked and not weighted
    assert _averages(_loss_kinds.MEAN, mean, masked, weighted) == plain
    assert _averages(_loss_kinds.CONSTANT, mean, masked, weighted) == plain
    for degree in _loss_kinds.DEGREES[1:]:
        assert not _averages(degree, mean, masked, weighted)
    assert _averages(_loss_kinds.UNWEIGHTED, mean, masked, weighted)
    # A loss a layer adds is taken as it is: only a mean averages.
    assert [d.averages_over_shards() for d in _loss_kinds.DEGREES] == [True, False, False, False]


def test_which_terms_read_the_rows():
    read = {kind: kind.reads_rows() for kind in _loss_kinds.KINDS}
    assert [k for k, r in read.items() if not r] == [_loss_kinds.CONSTANT, _loss_kinds.UNWEIGHTED]


@pytest.mark.parametrize("degree", _loss_kinds.DEGREES, ids=repr)
def test_a_degree_adds_up_its_rows_as_the_classifier_tells_it(degree):
    """The arithmetic of a degree is the one its kind is told apart by: a term made of per-row
    values by ``of_rows`` on 8 rows and on parts of 1, 3 and 4 rows is classified as it."""
    per_row = np.random.RandomState(0).rand(8) + 0.5

    def term(values):
        return np.float64(degree.of_rows(values.sum(), float(len(values))))

    full = term(per_row)
    parts = [term(per_row[part]) for part in _loss_kinds._PARTS]
    assert _loss_kinds._kind(np.asarray(full), [np.asarray(p) for p in parts]) == (degree, None)
    for rows in (1.0, 3.0, 8.0):
        expected = rows ** (degree.p - 1) * 2.5
        assert degree.of_rows(2.5, rows) == pytest.approx(expected, rel=1e-15)
        assert degree.of_rows_inverse(2.5, 1.0 / rows) == pytest.approx(expected, rel=1e-15)
    # A shard's value times shards**p, averaged over equal shards, is the batch's.
    shards = 4
    batch = term(np.tile(per_row[:2], shards))
    assert degree.shard_factor(shards) * term(per_row[:2]) == pytest.approx(batch, rel=1e-12)


def _sources():
    for folder, _, files in os.walk(PACKAGE):
        for name in sorted(files):
            if name.endswith(".py"):
                path = os.path.join(folder, name)
                with open(path, encoding="utf-8") as f:
                    yield os.path.relpath(path, PACKAGE), ast.parse(f.read())


def _is_member(node):
    if isinstance(node, (ast.Tuple, ast.List, ast.Set)):
        return any(_is_member(n) for n in node.elts)
    return (
        isinstance(node, ast.Attribute)
        and isinstance(node.value, ast.Name)
        and node.value.id == "_loss_kinds"
        and node.attr.isupper()
    )


def test_no_site_compares_kinds_and_each_calls_only_what_every_kind_has():
    """Sites call the kinds' operations (every kind has each one) instead of branching on a
    kind; ``kind`` and ``degree`` are never compared with a member or a number."""
    compared, called = [], set()
    for path, tree in _sources():
        if path == "_loss_kinds.py":
            continue
        for node in ast.walk(tree):
            if isinstance(node, ast.Compare):
                operands = [node.left, *node.comparators]
                member = any(_is_member(n) for n in operands)
                named = any(
                    isinstance(n, ast.Name) and n.id in ("kind", "degree") for n in operands
                )
                number = any(
                    isinstance(n, ast.Constant) and isinstance(n.value, int) for n in operands
                )
                if (member and path not in COMPARING) or (named and number):
                    compared.append(f"{path}:{node.lineno}")
            if (
                isinstance(node, ast.Call)
                and isinstance(node.func, ast.Attribute)
                and isinstance(node.func.value, ast.Name)
                and node.func.value.id in ("kind", "degree")
            ):
                called.add((node.func.value.id, node.func.attr))
    assert compared == []
    assert {name for who, name in called if who == "kind"} <= set(OPERATIONS)
    assert {name for who, name in called if who == "degree"} <= set(DEGREE_OPERATIONS)
    # The sites the checklist names call them (this test reads the right variables).
    assert {("kind", "term"), ("degree", "of_rows"), ("degree", "shard_factor")} <= called
