"""The tooling's one scratch folder (tpushim/_scratch.py) removes only what it made."""

import os
import tempfile

import pytest

from tpushim import _scratch


def test_scratch_folder_is_new_and_gone_afterwards(tmp_path, monkeypatch):
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    with _scratch.scratch_folder("tpushim-test-", "work") as folder:
        assert os.listdir(folder) == []
        with open(os.path.join(folder, "written"), "w") as f:
            f.write("x")
    assert os.listdir(tmp_path) == []


def test_a_folder_mkdtemp_hands_back_is_never_deleted(tmp_path, monkeypatch):
    user = tmp_path / "user"
    user.mkdir()
    (user / "keep.txt").write_text("keep me")
    monkeypatch.setattr(tempfile, "mkdtemp", lambda *a, **k: str(user))
    with _scratch.scratch_folder("tpushim-test-", "work") as folder:
        assert os.path.dirname(folder) == str(user)
    assert sorted(os.listdir(user)) == ["keep.txt"]
    (user / "work").mkdir()  # a folder of that name already there: not ours, left alone
    with pytest.raises(FileExistsError), _scratch.scratch_folder("tpushim-test-", "work"):
        pass
    assert sorted(os.listdir(user)) == ["keep.txt", "work"]
