"""Hugging Face transformers with attn_implementation="fa2gen": tiny Llama-, Qwen2- and
Mistral-style models (GQA; Mistral's sliding window) against the same weights under "sdpa":
logits on unpadded, left-padded and right-padded batches, a training step's gradients, greedy
generation, and padding-free packed inputs."""

import copy

import pytest
import torch

transformers = pytest.importorskip("transformers")

import fa2gen.integrations.transformers as fa2gen_hf  # noqa: E402

pytestmark = pytest.mark.interpreter

CONFIGS = {
    "llama": transformers.LlamaConfig,
    "qwen2": transformers.Qwen2Config,
    "mistral": transformers.MistralConfig,
}
SIZES = dict(
    vocab_size=101,
    hidden_size=128,
    intermediate_size=192,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    max_position_embeddings=256,
)


def pair(kind: str, dtype=torch.bfloat16, **extra):
    """(fa2gen model, sdpa model) of one architecture with the same random weights."""
    fa2gen_hf.register()
    config = CONFIGS[kind](**SIZES, **extra)
    torch.manual_seed(0)
    ours = transformers.AutoModelForCausalLM.from_config(
        copy.deepcopy(config), attn_implementation="fa2gen", dtype=dtype
    )
    theirs = transformers.AutoModelForCausalLM.from_config(
        copy.deepcopy(config), attn_implementation="sdpa", dtype=dtype
    )
    theirs.load_state_dict(ours.state_dict())
    assert ours.config._attn_implementation == "fa2gen" and theirs.config._attn_implementation == "sdpa"
    return ours, theirs


def close(a, b, where=None, tol=3e-2):
    a, b = a.float(), b.float()
    if where is not None:
        a, b = a[where], b[where]
    assert (a - b).abs().max().item() <= tol * max(1.0, b.abs().max().item())


def padded_batch(left: bool):
    g = torch.Generator().manual_seed(1)
    ids = torch.randint(0, SIZES["vocab_size"], (3, 37), generator=g)
    mask = torch.ones_like(ids)
    for row, pad in ((1, 9), (2, 20)):
        if left:
            mask[row, :pad] = 0
        else:
            mask[row, -pad:] = 0
    return ids, mask


@pytest.mark.parametrize("kind", sorted(CONFIGS))
def test_logits_match_sdpa_unpadded_and_padded_both_sides(kind):
    extra = {"sliding_window": 16} if kind == "mistral" else {}
    ours, theirs = pair(kind, **extra)
    ids, _ = padded_batch(left=True)
    with torch.no_grad():
        close(ours(ids).logits, theirs(ids).logits)
        for left in (True, False):
            ids, mask = padded_batch(left)
            close(ours(ids, attention_mask=mask).logits, theirs(ids, attention_mask=mask).logits, mask.bool())


@pytest.mark.parametrize("kind", ["llama", "mistral"])
def test_a_training_step_has_sdpas_gradients(kind):
    extra = {"sliding_window": 16} if kind == "mistral" else {}
    ours, theirs = pair(kind, **extra)
    ids, mask = padded_batch(left=False)
    labels = ids.masked_fill(mask == 0, -100)
    for model in (ours, theirs):
        model.train()  # (attention dropout is 0 in these configs: the step is deterministic)
        model(ids, attention_mask=mask, labels=labels).loss.backward()
    for (name, a), b in zip(ours.named_parameters(), theirs.parameters()):
        assert a.grad is not None, name
        close(a.grad, b.grad, tol=5e-2)


def test_greedy_generation_gives_sdpas_tokens():
    ours, theirs = pair("qwen2")
    ids, mask = padded_batch(left=True)
    with torch.no_grad():
        a = ours.generate(ids, attention_mask=mask, max_new_tokens=6, do_sample=False)
        b = theirs.generate(ids, attention_mask=mask, max_new_tokens=6, do_sample=False)
    assert torch.equal(a, b)


def test_padding_free_packed_inputs_attend_within_each_sequence():
    ours, _ = pair("llama")
    g = torch.Generator().manual_seed(2)
    lengths = [11, 5, 20]
    seqs = [torch.randint(0, SIZES["vocab_size"], (n,), generator=g) for n in lengths]
    packed = torch.cat(seqs)[None]
    positions = torch.cat([torch.arange(n) for n in lengths])[None]
    with torch.no_grad():
        together = ours(packed, position_ids=positions).logits[0]
        apart = torch.cat([ours(s[None]).logits[0] for s in seqs])
        unpacked = ours(packed).logits[0]  # (one long sequence: a different answer)
    close(together, apart)
    assert (unpacked[11:].float() - apart[11:].float()).abs().max() > 0.1


def test_attention_weights_are_refused():
    ours, _ = pair("llama")
    with pytest.raises(ValueError, match="output_attentions"):
        ours(torch.zeros(1, 4, dtype=torch.long), output_attentions=True)
