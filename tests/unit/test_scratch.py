"""The tooling's one scratch folder (tpushim/_scratch.py) removes only what it made."""

import os
import tempfile

from tpushim import _scratch


def test_scratch_folder_is_new_and_gone_afterwards(tmp_path, monkeypatch):
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    with _scratch.scratch_folder("tpushim-test-", "work") as folder:
        assert os.listdir(folder) == [] and os.path.basename(folder) == "work"
        assert os.path.dirname(os.path.dirname(folder)) == str(tmp_path)
        with open(os.path.join(folder, "written"), "w") as f:
            f.write("x")
    assert os.listdir(tmp_path) == []


def test_a_folder_mkdtemp_hands_back_is_never_used_nor_deleted(tmp_path, monkeypatch):
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path / "tmp"))
    (tmp_path / "tmp").mkdir()
    for contents in (["keep.txt"], []):  # an empty folder of the user's is theirs too
        user = tmp_path / f"user{len(contents)}"
        user.mkdir()
        for name in contents:
            (user / name).write_text("keep me")
        monkeypatch.setattr(tempfile, "mkdtemp", lambda *a, u=user, **k: str(u))
        with _scratch.scratch_folder("tpushim-test-", "work") as folder:
            assert not folder.startswith(str(user))
        assert user.is_dir() and sorted(os.listdir(user)) == contents


def test_the_temporary_directory_given_is_kept_with_its_contents(tmp_path, monkeypatch):
    """A temporary directory that is a user's folder (a mocked gettempdir): only the call's own
    folder inside it goes, even when the user's folder was empty."""
    for contents in (["keep.txt", "tpushim-test-0"], []):
        user = tmp_path / f"user{len(contents)}"
        user.mkdir()
        for name in contents:
            (user / name).write_text("keep me")
        monkeypatch.setattr(tempfile, "gettempdir", lambda u=user: str(u))
        with _scratch.scratch_folder("tpushim-test-", "work") as folder:
            assert os.path.dirname(os.path.dirname(folder)) == str(user)
        assert user.is_dir() and sorted(os.listdir(user)) == sorted(contents)


def test_a_taken_name_is_never_reused(tmp_path, monkeypatch):
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    taken = tmp_path / ("tpushim-test-" + "00" * 6)
    taken.mkdir()
    (taken / "keep.txt").write_text("keep me")
    draws = iter([b"\0" * 6, b"\0" * 6, b"\1" * 6])
    monkeypatch.setattr(os, "urandom", lambda n: next(draws))
    with _scratch.scratch_folder("tpushim-test-", "work") as folder:
        assert os.path.basename(os.path.dirname(folder)) == "tpushim-test-" + "01" * 6
    assert sorted(os.listdir(tmp_path)) == [taken.name]
    assert (taken / "keep.txt").read_text() == "keep me"
