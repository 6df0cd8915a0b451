"""The embedded target converted once from its GGUF file (dynasd/loading/converted.py) is the GGUF's model: same
weights bit for bit, same configuration, same tokenizer and chat template."""
from __future__ import annotations

import os

import pytest
import torch

from dynasd.loading.converted import _gguf_read_once, _remove_abandoned, converted_folder, load_converted
from dynasd.loading.models import embedded_gguf_path


@pytest.mark.slow
def test_the_converted_embedded_target_is_the_gguf_model(embedded_pair):
    """About 20 s of one core: the GGUF read the slow way, once, to compare with (every other load of the embedded
    pair in the suite is the fast one: `embedded_pair` has converted the file already)."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    path = embedded_gguf_path()
    assert (converted_folder(path) / "model.safetensors").is_file()
    model, tokenizer = load_converted(path, torch.float32)
    gguf_tokenizer = AutoTokenizer.from_pretrained(str(path.parent), gguf_file=path.name)
    gguf_model = AutoModelForCausalLM.from_pretrained(str(path.parent), gguf_file=path.name, dtype=torch.float32)

    ours, theirs = model.state_dict(), gguf_model.state_dict()
    assert ours.keys() == theirs.keys() and all(torch.equal(ours[k], theirs[k]) for k in ours)
    assert model.lm_head.weight.data_ptr() == model.model.embed_tokens.weight.data_ptr()  # tied, as in the file
    differ = {k for k, v in model.config.to_dict().items() if gguf_model.config.to_dict().get(k) != v}
    assert differ <= {"_name_or_path", "quantization_config"}, differ
    texts = ["Name three rivers in Europe.", "  tabs\tand\nnewlines", "naïve café 🙂", "<|im_start|>user\nhi<|im_end|>"]
    assert [tokenizer(t)["input_ids"] for t in texts] == [gguf_tokenizer(t)["input_ids"] for t in texts]
    chat = [{"role": "user", "content": "Name three rivers."}]
    assert (tokenizer.apply_chat_template(chat, add_generation_prompt=True, tokenize=False)
            == gguf_tokenizer.apply_chat_template(chat, add_generation_prompt=True, tokenize=False))
    assert (tokenizer.all_special_ids, tokenizer.eos_token_id, len(tokenizer)) == \
        (gguf_tokenizer.all_special_ids, gguf_tokenizer.eos_token_id, len(gguf_tokenizer))


def test_a_conversion_left_by_a_stopped_process_is_removed_and_a_running_ones_kept(tmp_path):
    gone, running = tmp_path / "model-abc.part-999999999", tmp_path / f"model-abc.part-{os.getpid()}"
    for folder in (gone, running):
        folder.mkdir()
        (folder / "config.json").write_text("{}")
    _remove_abandoned(tmp_path)
    assert not gone.exists() and running.exists()


def test_reading_a_gguf_once_is_only_for_the_conversion(tmp_path):
    """Inside the block a second read of a file is the first reader; after it, even when the block fails, gguf's
    own functions are back (a reader kept past the conversion would hold the file and never see it change)."""
    import gguf
    import numpy as np

    path = str(tmp_path / "tiny.gguf")
    writer = gguf.GGUFWriter(path, "llama")
    writer.add_tensor("token_embd.weight", np.zeros((2, 4), dtype=np.float32))
    for write in (writer.write_header_to_file, writer.write_kv_data_to_file, writer.write_tensors_to_file):
        write()
    writer.close()
    original = gguf.GGUFReader, gguf.get_tensor_name_map
    with pytest.raises(RuntimeError, match="stop"):
        with _gguf_read_once():
            assert gguf.GGUFReader(path) is gguf.GGUFReader(path)
            raise RuntimeError("stop")
    assert (gguf.GGUFReader, gguf.get_tensor_name_map) == original
