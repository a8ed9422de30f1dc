"""The exporter on the tiny random Llama: layout, manifest, greedy parity, reuse and safe writes."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path

import onnx
import pytest

from onnxsample.errors import ExportError, InvalidParameter
from onnxsample.exporters import MANIFEST_NAME, _source, export, read_manifest, resolve_source
from onnxsample.exporters._verify import ort_greedy, prompt_ids, torch_greedy
from onnxsample.exporters.hf import load_hf


def _names(values) -> list[str]:
    return [v["name"] for v in values]


def test_io_names_follow_the_optimum_layout(tiny_export):
    io = tiny_export.manifest["io"]
    layers = range(2)
    assert _names(io["inputs"]) == ["input_ids", "attention_mask", "position_ids"] + [
        f"past_key_values.{i}.{kv}" for i in layers for kv in ("key", "value")
    ]
    assert _names(io["outputs"]) == ["logits"] + [
        f"present.{i}.{kv}" for i in layers for kv in ("key", "value")
    ]
    logits = io["outputs"][0]
    assert logits["dtype"] == "float" and logits["shape"][2] == 49152
    model = onnx.load(str(tiny_export.model_path), load_external_data=False)
    assert [i.name for i in model.graph.input] == _names(io["inputs"])


@pytest.mark.parametrize(
    ("path", "expected"),
    [
        (("format_version",), 1),
        (("precision",), "fp32"),
        (("source", "kind"), "hf"),
        (("model", "vocab_size"), 49152),
        (("model", "num_layers"), 2),
        (("model", "num_key_value_heads"), 2),
        (("io", "kv_cache", "num_layers"), 2),
        (("io", "kv_cache", "num_kv_heads"), 2),
        (("io", "kv_cache", "head_dim"), 16),
        (("tokens", "eos_token_ids"), [2]),
        (("tokens", "chat_template"), True),
        (("files", "model"), "model.onnx"),
        (("verify", "ok"), True),
    ],
)
def test_manifest(tiny_export, path, expected):
    value = read_manifest(tiny_export.output)
    for key in path:
        value = value[key]
    assert value == expected


def test_manifest_records_source_hash_and_exporter_stack(tiny_export, tiny_hf):
    from onnxsample.exporters import resolve_source

    manifest = tiny_export.manifest
    assert manifest["source_sha256"] == resolve_source(tiny_hf).digest().sha256
    assert set(manifest["exporter"]) >= {"torch", "transformers", "optimum", "optimum-onnx", "onnx"}


def test_export_folder_has_tokenizer_and_configs(tiny_export):
    names = {p.name for p in tiny_export.output.iterdir()}
    assert {
        "model.onnx",
        MANIFEST_NAME,
        "tokenizer.json",
        "tokenizer_config.json",
        "config.json",
        "generation_config.json",
        "chat_template.jinja",
    } <= names
    assert not any(n.endswith(".partial") for n in names)


def test_tokenizer_adds_no_bos(tiny_export):
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(tiny_export.output)
    assert tokenizer("Hello world").input_ids == [19556, 905]
    assert tokenizer.eos_token_id == 2


def test_greedy_matches_transformers_on_16_tokens(tiny_export, tiny_hf):
    model, tokenizer = load_hf(tiny_hf)
    ids = prompt_ids(tokenizer, "Tell me a story about a dragon.")
    reference = torch_greedy(model, ids, 16)
    assert ort_greedy(tiny_export.model_path, ids, 16) == reference
    assert len(set(reference)) > 1, "a constant sequence would not tell the engines apart"


def test_matching_export_is_reused(tiny_export, tiny_hf):
    before = tiny_export.model_path.stat().st_mtime_ns
    again = export(tiny_hf, tiny_export.output, layout="optimum", precision="fp32")
    assert again.reused
    assert again.model_path.stat().st_mtime_ns == before


_REUSE = """
import json, sys
from onnxsample.exporters import _source, export
def _read(*_):
    raise AssertionError("the source was read again")
_source._hash_file = _read
done = export(sys.argv[1], sys.argv[2], **json.loads(sys.argv[3]))
print(json.dumps([done.reused, [m for m in ("torch", "transformers", "optimum") if m in sys.modules]]))
"""


@pytest.mark.parametrize(
    "source, folder, options",
    [
        ("tiny_hf", "tiny_gqa_export", {"layout": "gqa", "precision": "fp32"}),
        ("real_gguf", "real_gguf_export", {}),
    ],
    ids=["hf-folder", "gguf"],
)
def test_a_reused_export_imports_neither_torch_nor_transformers(request, source, folder, options):
    """An export already there is found before the checks that import transformers and optimum,
    and without reading the source again: `run` and `serve` on a source start seconds sooner. (A
    first reuse here records the files' stamp where the export could not: they had just been
    written when it hashed them.)"""
    path, done = request.getfixturevalue(source), request.getfixturevalue(folder)
    assert export(path, done.output, **options).reused
    out = subprocess.run(
        [sys.executable, "-c", _REUSE, str(path), str(done.output), json.dumps(options)],
        capture_output=True,
        text=True,
        check=True,
    )
    assert json.loads(out.stdout.splitlines()[-1]) == [True, []]


def _rewrite(file: Path) -> None:  # the same size, other bytes
    file.write_bytes(file.read_bytes()[::-1])


def _set_times_back(file: Path) -> None:  # as `touch -r` or `cp -p` would
    before = file.stat()
    _rewrite(file)
    os.utime(file, ns=(before.st_atime_ns, before.st_mtime_ns))


def _replace(file: Path) -> None:  # another file under the same name, times and size
    before = file.stat()
    other = file.with_suffix(".new")
    other.write_bytes(file.read_bytes())
    os.utime(other, ns=(before.st_atime_ns, before.st_mtime_ns))
    other.replace(file)


@pytest.mark.parametrize(
    "change, trusted",
    [
        (None, True),
        (_rewrite, False),
        (_set_times_back, False),
        (_replace, False),
    ],
    ids=["unchanged", "rewritten", "rewritten-times-set-back", "replaced"],
)
@pytest.mark.parametrize("kind", ["gguf", "hf"])
def test_a_recorded_digest_is_trusted_only_while_nothing_wrote_the_files(
    tmp_path, kind, change, trusted
):
    """A manifest's sha256 stands for the source while the files' stamp (size, times, inode) is
    the one recorded when they were hashed; any write moves the change time, which no tool sets
    back, so the source is read again."""
    if kind == "gguf":
        path = file = tmp_path / "model.gguf"
        file.write_bytes(b"GGUF" + bytes(range(256)) * 64)
    else:
        path = tmp_path / "hf"
        path.mkdir()
        (path / "config.json").write_text('{"model_type": "llama"}')
        file = path / "model.safetensors"
        file.write_bytes(bytes(range(256)) * 64)
    time.sleep(0.1)  # past the clock tick of the last write: the stamp can be trusted
    src = resolve_source(path)
    first = src.digest()
    assert first.stamp is not None and first.stamp[0] == str(src.path)
    recorded = {"sha256": "0" * 64, "stamp": json.loads(json.dumps(first.stamp))}
    if change is not None:
        change(file)
    again = src.digest(recorded)
    if trusted:
        assert again.sha256 == "0" * 64 and again.stamp == first.stamp
    else:  # read again: the same bytes give the same sha256
        assert again.sha256 == src.digest().sha256
        assert (again.sha256 == first.sha256) is (change is _replace)


@pytest.mark.parametrize("name", ["tiny-Q4_K_M.gguf", "tiny-Q4_K_M.bin"])
def test_a_gguf_is_known_by_its_magic_and_named_by_its_link(tmp_path, name):
    """As llama.cpp opens a file: by its magic bytes whatever its name, and through a link (a hub
    cache's snapshots/REV/NAME.gguf links to blobs/HASH), named by the link, not the blob."""
    blob = tmp_path / "blobs" / "3f2a9c0e1d"
    blob.parent.mkdir()
    blob.write_bytes(b"GGUF" + bytes(64))
    link = tmp_path / "snapshots" / "rev" / name
    link.parent.mkdir(parents=True)
    link.symlink_to(Path("..") / ".." / "blobs" / blob.name)
    src = resolve_source(link)
    assert (src.kind, src.path, src.name) == ("gguf", link, "tiny-Q4_K_M")
    assert src.digest().sha256 == resolve_source(blob).digest().sha256


def test_files_written_a_moment_ago_are_hashed_but_not_stamped(tmp_path, monkeypatch):
    """A change made within the clock tick of the hash could leave every timestamp as it was
    (here a tick of a minute)."""
    monkeypatch.setattr(_source, "_SETTLED_NS", 60 * 10**9)
    (tmp_path / "model.gguf").write_bytes(b"GGUF" + bytes(1024))
    fingerprint = resolve_source(tmp_path / "model.gguf").digest()
    assert fingerprint.stamp is None and len(fingerprint.sha256) == 64


@pytest.fixture
def copied_export(tiny_export, tmp_path) -> Path:
    target = tmp_path / "export"
    shutil.copytree(tiny_export.output, target)
    return target


def test_a_reuse_records_a_missing_stamp_and_keeps_the_manifests_permissions(
    copied_export, tiny_hf
):
    """An export that recorded no stamp (made by an older version, or of files just written)
    gets one on its next reuse, in a manifest of the same mode whatever the user's umask."""
    path = copied_export / MANIFEST_NAME
    manifest = json.loads(path.read_text())
    manifest["source"].pop("stamp", None)
    path.write_text(json.dumps(manifest))
    path.chmod(0o664)
    old_umask = os.umask(0o077)
    try:
        again = export(tiny_hf, copied_export, layout="optimum", precision="fp32")
    finally:
        os.umask(old_umask)
    assert again.reused and again.manifest["source"]["stamp"] is not None
    assert read_manifest(copied_export) == again.manifest
    assert path.stat().st_mode & 0o777 == 0o664
    assert sorted(p.name for p in copied_export.iterdir() if p.name.startswith(".")) == []


def test_a_stamp_never_overwrites_an_export_written_meanwhile(copied_export):
    """A reuse that read the manifest before another export was forced into the folder leaves
    the new export's manifest as it is."""
    from onnxsample.exporters import _manifest

    path = copied_export / MANIFEST_NAME
    before = json.loads(path.read_text())
    newer = {**before, "created": "later"}
    path.write_text(json.dumps(newer))
    _manifest.restamp_source(copied_export, before, ["elsewhere"])
    assert json.loads(path.read_text()) == newer


def test_different_export_in_the_folder_is_an_error(copied_export, tiny_hf):
    with pytest.raises(ExportError, match=r"holds a different export.*--force"):
        export(tiny_hf, copied_export, precision="fp16")


def test_stale_exporter_versions_are_a_different_export(copied_export, tiny_hf):
    manifest = json.loads((copied_export / MANIFEST_NAME).read_text())
    manifest["exporter"]["optimum"] = "0.0.1"
    (copied_export / MANIFEST_NAME).write_text(json.dumps(manifest))
    with pytest.raises(ExportError, match="different export"):
        export(tiny_hf, copied_export, layout="optimum", precision="fp32")


def test_folder_without_manifest_is_not_overwritten(tmp_path, tiny_hf):
    (tmp_path / "notes.txt").write_text("mine")
    with pytest.raises(ExportError, match="holds no onnxsample export"):
        export(tiny_hf, tmp_path)
    assert (tmp_path / "notes.txt").read_text() == "mine"


def test_force_writes_an_fp16_export_beside_a_users_files(tmp_path, tiny_hf):
    target = tmp_path / "fp16"
    target.mkdir()
    (target / "junk.txt").write_text("old")
    result = export(tiny_hf, target, precision="fp16", force=True, verify_tokens=4)
    assert (target / "junk.txt").read_text() == "old"
    assert result.manifest["precision"] == "fp16"
    assert result.manifest["io"]["kv_cache"]["dtype"] == "float16"
    # The CPU provider may lack fp16 kernels: then the verify step says so instead of passing.
    verify = result.manifest["verify"]
    assert verify["ok"] is True or (verify["ok"] is None and verify["note"])
    assert not list(tmp_path.glob(".*partial"))


# An export forced into a folder holding one: how its manifest names its own files ("written": as
# this exporter writes it, "older": without that list, as exporters before it wrote it).
@pytest.mark.parametrize("manifest", ["written", "older"])
def test_force_replaces_an_exports_own_files_and_keeps_the_others(manifest, copied_export, tiny_hf):
    """As optimum-cli writes into a folder: the old export's files go (a stale external-data
    file it listed included), a user's notes and a composed model stay."""
    path = copied_export / MANIFEST_NAME
    old = json.loads(path.read_text())
    if manifest == "written":
        old["files"]["written"].append("model.onnx.stale")
        (copied_export / "model.onnx.stale").write_text("the old export's")
    else:
        del old["files"]["written"]
    path.write_text(json.dumps(old))
    for name in ("notes.txt", "composed.onnx"):
        (copied_export / name).write_text("mine")
    result = export(tiny_hf, copied_export, precision="fp16", force=True, verify_tokens=0)
    assert result.manifest["precision"] == "fp16"
    written = set(result.manifest["files"]["written"])
    assert {p.name for p in copied_export.iterdir()} == written | {"notes.txt", "composed.onnx"}
    assert (copied_export / "notes.txt").read_text() == "mine"
    assert (copied_export / "composed.onnx").read_text() == "mine"
    assert not [p for p in copied_export.parent.iterdir() if p.name.startswith(".")]


@pytest.mark.parametrize("name", ["config.json", "model.onnx"])
def test_force_never_writes_over_a_file_no_export_wrote(name, tmp_path, tiny_hf):
    target = tmp_path / "mine"
    target.mkdir()
    (target / name).write_text("mine")
    with pytest.raises(ExportError, match=rf"holds {name}, which no export wrote there"):
        export(tiny_hf, target, force=True, verify_tokens=0)
    assert [p.name for p in target.iterdir()] == [name]
    assert (target / name).read_text() == "mine"
    assert [p.name for p in tmp_path.iterdir()] == ["mine"]


@pytest.mark.parametrize("layout", ["optimum", "gqa"])
def test_failed_export_leaves_nothing_behind(tmp_path, tiny_hf, layout):
    broken = tmp_path / "broken"
    shutil.copytree(tiny_hf, broken)
    (broken / "model.safetensors").write_bytes(b"not a safetensors file")
    out = tmp_path / "out"
    with pytest.raises(ExportError, match="cannot load"):
        export(broken, out, layout=layout)
    assert not out.exists()
    assert [p.name for p in tmp_path.iterdir()] == ["broken"]


def test_not_enough_disk_is_refused_before_writing(tmp_path, tiny_hf, monkeypatch):
    from onnxsample.exporters import _fs

    monkeypatch.setattr(_fs, "free_bytes", lambda _path: 1000)
    with pytest.raises(
        ExportError, match=r"not enough disk space .* needs about .* GB, 0\.0 GB are free"
    ):
        export(tiny_hf, tmp_path / "out")
    assert not (tmp_path / "out").exists()


def test_a_reference_too_large_for_memory_skips_the_verify_step_and_says_why(
    tmp_path, tiny_hf, monkeypatch, caplog
):
    """A 7B GGUF's fp32 transformers reference takes some 40 GB: where that is not available the
    export is still written, and its verify step says why it did not run instead of the kernel
    killing the process."""
    from onnxsample.exporters import _verify, hf

    monkeypatch.setattr(_verify, "available_memory", lambda: 10**6)
    monkeypatch.setattr(hf, "load_hf", _must_not_load)
    result = export(tiny_hf, tmp_path / "out", layout="gqa", precision="fp32")
    verify = result.manifest["verify"]
    need = _verify.REFERENCE_BYTES_PER_PARAM * hf.approximate_params(tiny_hf) / 1e9
    assert verify["ok"] is None and verify["tokens"] == 0
    assert verify["note"] == (
        f"skipped (transformers' fp32 reference needs about {need:.1f} GB of memory, "
        "0.0 GB are available)"
    )
    assert "verify step skipped" in caplog.text
    assert (tmp_path / "out" / "model.onnx").is_file()


def _must_not_load(*_args, **_kwargs):
    raise AssertionError("the reference model was loaded")


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        (
            {"precision": "int3"},
            "precision must be one of auto, fp32, fp16, int8, int4, gguf, got 'int3'",
        ),
        ({"verify_tokens": -1}, "verify_tokens must be an integer >= 0, got -1"),
        # refused before any work, not a TypeError after the whole export
        ({"verify_tokens": 1.5}, "verify_tokens must be an integer >= 0, got 1.5"),
        ({"verify_tokens": None}, "verify_tokens must be an integer >= 0, got None"),
        ({"accuracy_level": 4.0}, "accuracy_level must be 0 or 4, got 4.0"),
        ({"progress": 5}, "progress must be a callable or None, got 5"),
    ],
)
def test_invalid_options(tmp_path, tiny_hf, kwargs, message):
    with pytest.raises(InvalidParameter, match=re.escape(message)):
        export(tiny_hf, tmp_path / "out", **kwargs)


def test_a_killed_exports_staging_folder_goes_with_the_next_export(tmp_path):
    from onnxsample.exporters._fs import staged_folder

    out = tmp_path / "model"
    dead = tmp_path / ".model.abc123.partial"
    dead.mkdir()
    (dead / ".owner").write_text("999999999")  # no such process
    (dead / "model.onnx.data").write_bytes(b"x" * 1024)
    live = tmp_path / ".model.def456.partial"
    live.mkdir()
    (live / ".owner").write_text(str(os.getpid()))  # an export running now
    with staged_folder(out) as stage:
        (stage / "model.onnx").write_bytes(b"m")
    assert not dead.exists() and live.exists()
    assert sorted(p.name for p in out.iterdir()) == ["model.onnx"]


def test_a_sentencepiece_model_alone_gets_a_tokenizer_json(llama_cpp, tmp_path):
    """A Hugging Face folder with `tokenizer.model` and no `tokenizer.json` (as older Llama and
    Mistral repositories ship): the export writes the file transformers converts it to, which
    tokenises as transformers reads the folder (the export had none, and could not run)."""
    import _llama_cpp_models as fixtures
    from _hard_texts import HARD
    from transformers import AutoTokenizer

    from onnxsample.text import Tokenizer

    source = tmp_path / "spm-only"
    shutil.copytree(
        fixtures.hf_folder("llama", llama_cpp),
        source,
        ignore=shutil.ignore_patterns("tokenizer.json"),
    )
    export(source, tmp_path / "out", verify_tokens=2)
    ours, theirs = Tokenizer.from_folder(tmp_path / "out"), AutoTokenizer.from_pretrained(source)
    for text in HARD:
        assert ours.encode(text) == theirs.encode(text), text
    (tmp_path / "out" / "tokenizer.json").unlink()  # as exports of such folders were written
    with pytest.raises(ExportError, match=r"without its tokenizer\.json, .* pass --force"):
        export(source, tmp_path / "out", verify_tokens=2)


def test_a_folder_without_tokenizer_files_says_so(tmp_path, tiny_hf):
    source = tmp_path / "no-tokenizer"
    shutil.copytree(tiny_hf, source, ignore=shutil.ignore_patterns("tokenizer*", "vocab.json"))
    with pytest.raises(ExportError, match=r"has no tokenizer: it needs tokenizer\.json, "):
        export(source, tmp_path / "out", verify_tokens=0)
    assert not (tmp_path / "out").exists()
