"""Atomic writes and strict JSON readers (sphyr_jax.io)."""

import hashlib
import json
import math
import os
import stat
import subprocess
import sys

import pytest

from sphyr_jax import io


def _digest(path):
    return hashlib.sha256(path.read_bytes()).hexdigest()


def _leftovers(folder):
    """Temporary or backup files the writers might have left behind."""
    return sorted(p.name for p in folder.iterdir() if p.name.startswith("."))


def test_atomic_write_text_creates_and_replaces(tmp_path):
    target = tmp_path / "a.txt"
    io.atomic_write_text(target, "first\n")
    assert target.read_text() == "first\n"
    os.chmod(target, 0o640)
    io.atomic_write_text(target, "second ünïcode\r\n")
    assert target.read_bytes() == "second ünïcode\r\n".encode()
    assert stat.S_IMODE(target.stat().st_mode) == 0o640  # permissions kept
    assert _leftovers(tmp_path) == []


def test_atomic_write_bytes_replaces_and_keeps_old_bytes_on_failure(tmp_path, monkeypatch):
    target = tmp_path / "a.png"
    data = bytes(range(256)) * 3  # every byte value, CR and LF untranslated
    io.atomic_write_bytes(target, data)
    assert target.read_bytes() == data
    with pytest.raises(TypeError):
        io.atomic_write_bytes(target, "text")
    monkeypatch.setattr(io.os, "replace", lambda src, dst: (_ for _ in ()).throw(OSError("no")))
    with pytest.raises(OSError):
        io.atomic_write_bytes(target, b"new")
    assert target.read_bytes() == data and _leftovers(tmp_path) == []


def test_atomic_write_text_keeps_old_content_when_replace_fails(tmp_path, monkeypatch):
    target = tmp_path / "a.txt"
    target.write_text("old")

    def broken_replace(src, dst):
        raise OSError("disk on fire")

    monkeypatch.setattr(os, "replace", broken_replace)
    with pytest.raises(OSError, match="disk on fire"):
        io.atomic_write_text(target, "new")
    assert target.read_text() == "old"
    assert _leftovers(tmp_path) == []


def test_atomic_write_json_failure_mid_write_leaves_old_file(tmp_path, monkeypatch):
    target = tmp_path / "r.json"
    io.atomic_write_json(target, {"a": 1})
    before = _digest(target)

    def partial_dump(obj, handle, **kwargs):
        handle.write('{"a": [1, 2, ')  # half a document reaches the temporary file
        raise RuntimeError("killed mid-write")

    monkeypatch.setattr(json, "dump", partial_dump)
    with pytest.raises(RuntimeError, match="killed mid-write"):
        io.atomic_write_json(target, {"a": [1, 2, 3]})
    assert _digest(target) == before
    assert json.loads(target.read_text()) == {"a": 1}
    assert _leftovers(tmp_path) == []


def test_atomic_write_json_unserialisable_value_leaves_old_file(tmp_path):
    target = tmp_path / "r.json"
    target.write_text('{"keep": true}\n')
    with pytest.raises(TypeError):
        io.atomic_write_json(target, {"fine": list(range(100)), "bad": object()})
    with pytest.raises(ValueError):
        io.atomic_write_json(target, {"compliance": math.inf})  # strict JSON
    assert target.read_text() == '{"keep": true}\n'
    assert _leftovers(tmp_path) == []


def test_atomic_write_json_round_trip(tmp_path):
    target = tmp_path / "r.json"
    value = {"grid": [["L", "0.5"]], "x": None, "n": 3, "s": "é"}
    io.atomic_write_json(target, value, indent=None)
    assert io.read_json(target) == value
    assert target.read_text(encoding="utf-8").count("\n") == 1


def test_read_json_reports_path_and_leaves_file_untouched(tmp_path):
    target = tmp_path / "broken.json"
    payload = b'{\n  "a": 1,\n  "b": [1, 2\n}\n'
    target.write_bytes(payload)
    with pytest.raises(io.CorruptFileError) as info:
        io.read_json(target)
    assert str(target) in str(info.value)
    assert "line 4" in str(info.value)
    assert info.value.path == str(target) and info.value.line == 4
    assert isinstance(info.value, ValueError)
    assert target.read_bytes() == payload


@pytest.mark.parametrize("payload", [b"", b"\xff\xfe not utf-8", b"[1, 2,]"])
def test_read_json_other_corruptions(tmp_path, payload):
    target = tmp_path / "bad.json"
    target.write_bytes(payload)
    with pytest.raises(io.CorruptFileError, match="bad.json"):
        io.read_json(target)
    assert target.read_bytes() == payload


def test_read_json_accepts_bom_and_missing_file_is_not_corrupt(tmp_path):
    target = tmp_path / "bom.json"
    target.write_bytes(b"\xef\xbb\xbf[1, 2]")
    assert io.read_json(target) == [1, 2]
    with pytest.raises(FileNotFoundError):
        io.read_json(tmp_path / "absent.json")


def test_read_jsonl_names_the_line(tmp_path):
    target = tmp_path / "d.jsonl"
    payload = b'{"a": 1}\n\n{"a": 2}\n{"a": \n'
    target.write_bytes(payload)
    with pytest.raises(io.CorruptFileError) as info:
        io.read_jsonl(target)
    assert "d.jsonl" in str(info.value) and "line 4" in str(info.value)
    assert info.value.line == 4
    assert target.read_bytes() == payload


def test_read_jsonl_values_and_line_numbers(tmp_path):
    target = tmp_path / "d.jsonl"
    # U+2028 is legal unescaped inside a JSON string and must not split a line.
    target.write_text('{"a": 1}\r\n\n  \n{"a": "x\u2028y"}\n', encoding="utf-8")
    assert io.read_jsonl(target) == [{"a": 1}, {"a": "x\u2028y"}]
    assert io.read_jsonl_numbered(target) == [(1, {"a": 1}), (4, {"a": "x\u2028y"})]


def test_atomic_write_files_all_or_nothing(tmp_path, monkeypatch):
    old = tmp_path / "old.txt"
    old.write_text("previous")
    new = tmp_path / "new.txt"
    calls = []
    real_replace = os.replace

    def flaky_replace(src, dst):
        calls.append(dst)
        if len(calls) == 2:  # the first target is already in place
            raise OSError("no space left")
        return real_replace(src, dst)

    monkeypatch.setattr(os, "replace", flaky_replace)
    with pytest.raises(OSError, match="no space left"):
        io.atomic_write_files({old: "replacement", new: "fresh"})
    monkeypatch.undo()
    assert old.read_text() == "previous"
    assert not new.exists()
    assert _leftovers(tmp_path) == []

    io.atomic_write_files({old: "replacement", new: "fresh"})
    assert old.read_text() == "replacement" and new.read_text() == "fresh"
    assert _leftovers(tmp_path) == []


def test_atomic_write_files_rejects_duplicates(tmp_path):
    with pytest.raises(ValueError):
        io.atomic_write_files({tmp_path / "a": "1", str(tmp_path / "a"): "2"})
    assert list(tmp_path.iterdir()) == []


def test_commit_files_creates_folders_and_removes_them_on_failure(tmp_path, monkeypatch):
    kept = tmp_path / "kept"
    kept.mkdir()
    (kept / "old.txt").write_text("previous")
    texts = {kept / "old.txt": "replacement", tmp_path / "a" / "b" / "one.txt": "1",
             tmp_path / "a" / "c" / "two.txt": "2"}
    real_replace = os.replace

    def failing_replace(src, dst):
        if str(dst).endswith("two.txt"):
            raise OSError("disk full")
        return real_replace(src, dst)

    monkeypatch.setattr(os, "replace", failing_replace)
    with pytest.raises(OSError, match="disk full"):
        io.commit_files(texts)
    monkeypatch.undo()
    # Nothing changed: the old file keeps its bytes, the new folders are gone again.
    assert sorted(p.name for p in tmp_path.iterdir()) == ["kept"]
    assert (kept / "old.txt").read_text() == "previous" and _leftovers(kept) == []

    io.commit_files(texts)
    assert [p.read_text() for p in texts] == ["replacement", "1", "2"]


_HOLD = """
import fcntl, os, sys
fd = os.open(sys.argv[1], os.O_RDWR | os.O_CREAT)
fcntl.flock(fd, fcntl.LOCK_EX)
print("held", flush=True)
sys.stdin.readline()
"""


def _holder(path):
    """Another process holding an advisory lock on ``path`` (until it reads a line)."""
    proc = subprocess.Popen([sys.executable, "-c", _HOLD, str(path)], stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE, text=True)
    assert proc.stdout.readline().strip() == "held"
    return proc


def test_exclusive_lock_refuses_a_second_holder_and_removes_its_file(tmp_path):
    """A lock held by another process refuses this one at once; a clean release removes
    the file; a holder killed while holding leaves a file that locks again at once."""
    path = tmp_path / ".lock"
    holder = _holder(path)
    try:
        with pytest.raises(io.LockedError, match="busy here"), io.exclusive_lock(
                path, busy="busy here"):
            pass
        assert path.exists()  # the refused attempt leaves the holder's file alone
    finally:
        holder.kill()
        holder.wait(timeout=30)
    assert path.exists()  # killed: no clean release, but no one holds it
    with io.exclusive_lock(path):
        assert path.exists()
        with pytest.raises(io.LockedError), io.exclusive_lock(path):  # one holder, also here
            pass
    assert not path.exists()
    with io.exclusive_lock(path):  # and again, on a new file
        assert path.exists()
    assert not path.exists()
