"""The built-in model is shipped, not built: the same files on every host, checked against their checksums."""

import json
import shutil

import pytest

from llm.models.tiny import BUILTIN_DIR, CHECKSUMS, WARMUP_BAND, TinySpec, tiny_model_dir, verify_checksums, write_checksums
from tests.helpers import run_cli


def test_the_default_model_is_the_shipped_directory_and_matches_its_checksums():
    assert tiny_model_dir() == BUILTIN_DIR
    names = {line.split()[1] for line in (BUILTIN_DIR / CHECKSUMS).read_text().splitlines()}
    assert {"model.safetensors", "config.json", "tokenizer.json", "warmup.json"} <= names
    verify_checksums(BUILTIN_DIR)
    built = json.loads((BUILTIN_DIR / "warmup.json").read_text())
    assert built["spec"] == {**TinySpec().__dict__} and WARMUP_BAND[0] <= built["sampled_accuracy"] <= WARMUP_BAND[1]


def test_a_changed_or_missing_file_is_refused_by_name(tmp_path):
    copy = tmp_path / "model"
    shutil.copytree(BUILTIN_DIR, copy)
    verify_checksums(copy)
    data = bytearray((copy / "model.safetensors").read_bytes())
    data[-1] ^= 1  # one bit of the last weight
    (copy / "model.safetensors").write_bytes(bytes(data))
    with pytest.raises(RuntimeError, match=r"model\.safetensors does not match its checksum"):
        verify_checksums(copy)
    (copy / "model.safetensors").unlink()
    with pytest.raises(RuntimeError, match=r"model\.safetensors does not match"):
        verify_checksums(copy)
    (copy / CHECKSUMS).unlink()
    with pytest.raises(RuntimeError, match="is missing"):
        verify_checksums(copy)
    write_checksums(copy)  # a directory's own sums: what `python -m llm tiny --out` writes
    verify_checksums(copy)


def test_the_build_command_asks_for_exactly_one_destination():
    """``python -m llm tiny`` (its main run in this process as ``python -m`` runs it)."""
    from llm.commands.tiny import PROG, main

    for args in ([], ["--out", "x", "--ship"]):
        status, _, err = run_cli(main, PROG, args)
        assert status == 2 and err.count("\n") == 1, err
        assert "give exactly one of --out DIR and --ship" in err
