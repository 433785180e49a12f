"""``memprofiler estimate CONFIG`` for configs that are not causal LMs: an encoder-decoder (T5) is
built with its sequence-to-sequence head and trained on its own loss, and the output names the
class built.

The tiny T5 below has 196,864 parameters: the shared embedding 500 x 64 (tied to the head); per
encoder layer self-attention q, k, v, o (4 x 64 x 64) and feed-forward wi, wo (2 x 64 x 128), two
norms (2 x 64); per decoder layer the same plus cross-attention (4 x 64 x 64) and a third norm;
the relative position bias (32 x 4) of each stack's first layer and each stack's final norm (64).
"""

from __future__ import annotations

import warnings
from pathlib import Path

import pytest
import yaml

from _hf_config import config_dir
from memprofiler.__main__ import main
from memprofiler.estimate.named import load_model

ENCODER_LAYER = 4 * 64 * 64 + 2 * 64 * 128 + 2 * 64
DECODER_LAYER = 8 * 64 * 64 + 2 * 64 * 128 + 3 * 64
T5_PARAMS = 500 * 64 + 2 * (ENCODER_LAYER + DECODER_LAYER) + 2 * (32 * 4 + 64)
T5 = {
    "model_type": "t5",
    "d_model": 64,
    "d_ff": 128,
    "d_kv": 16,
    "num_layers": 2,
    "num_heads": 4,
    "vocab_size": 500,
}


@pytest.fixture
def t5(tmp_path: Path) -> Path:
    return config_dir(tmp_path, "t5", T5)


def test_an_encoder_decoder_gets_its_seq2seq_head_and_a_decoder_batch(t5):
    # GIVEN a T5 config (transformers 5 writes it without `decoder_start_token_id`)
    # WHEN it is loaded as the command loads it
    named = load_model(str(t5))
    # THEN it is the model with the LM head, trained on its own loss
    assert type(named.model).__name__ == "T5ForConditionalGeneration"
    assert named.built == "T5ForConditionalGeneration, transformers' AutoModelForSeq2SeqLM.from_config"
    assert named.takes_labels and named.encoder_decoder
    # AND the decoder gets the ids itself, so no start token is needed to shift the labels
    batch = named.batch(2, 8)
    assert set(batch) == {"input_ids", "decoder_input_ids", "labels"}
    assert batch["decoder_input_ids"] is batch["input_ids"]
    assert sum(p.numel() for p in named.model.parameters()) == T5_PARAMS == 196_864


def test_checkpointing_uses_transformers_current_entry_without_a_warning(t5):
    named = load_model(str(t5))
    with warnings.catch_warnings():
        warnings.simplefilter("error", FutureWarning)
        how = named.checkpoint()
    assert how == "activation checkpointing: transformers' activation_checkpointing_enable (non-reentrant)"


def test_t5_is_estimated_from_the_command_line(t5, tmp_path, capsys):
    # WHEN a T5 config is estimated in one command (it stopped in T5's decoder before)
    out = tmp_path / "out"
    rc = main(
        ["estimate", str(t5), "--seq-len", "16", "--batch-size", "1", "--jobs", "1", "--save-dir", str(out)]
    )
    printed = capsys.readouterr().out
    # THEN the float32 parameters and AdamW's two moments are the model's
    assert rc == 0
    [est] = yaml.safe_load((out / "memory_estimate.yaml").read_text())["estimates"]
    assert est["resident"]["parameters"] == 4 * T5_PARAMS
    assert est["resident"]["optimizer_state"] == 2 * 4 * T5_PARAMS
    # AND the output names the class built and the loss trained
    assert (
        "note: model: T5ForConditionalGeneration, transformers' AutoModelForSeq2SeqLM.from_config" in printed
    )
    assert "note: loss: the model's own, from `labels` (the input ids)" in printed


GPT2 = {"model_type": "gpt2", "n_layer": 1, "n_embd": 32, "n_head": 2, "vocab_size": 300, "n_positions": 128}
LLAMA = {
    "model_type": "llama",
    "hidden_size": 32,
    "intermediate_size": 64,
    "num_hidden_layers": 1,
    "num_attention_heads": 2,
    "vocab_size": 300,
    "max_position_embeddings": 128,
}


def _config(tmp_path: Path, name: str, config: dict) -> str:
    return str(config_dir(tmp_path, name, config))


def test_a_row_longer_than_a_learned_position_table_is_refused(tmp_path, capsys):
    # GIVEN GPT-2 with a table of 128 learned positions: a row of 129 tokens cannot run (an index out of
    # range on the device), while fake tensors would estimate it
    gpt2 = _config(tmp_path, "gpt2", GPT2)
    # WHEN it is estimated with rows of 129 tokens
    rc = main(["estimate", gpt2, "--seq-len", "129"])
    err = capsys.readouterr().err
    # THEN one line names the flag, the config key and the longest row
    assert rc == 2 and err.count("\n") == 1, err
    assert (
        f"`--seq-len`: got 129; {gpt2}'s position table holds 128 positions (`n_positions` in its config), "
        "so a longer row cannot run; give --seq-len 128 or less"
    ) in err


def test_rotary_positions_take_rows_longer_than_max_position_embeddings(tmp_path):
    # LLaMA's `max_position_embeddings` is no table: longer rows run (the README's 7B recipe does)
    assert load_model(_config(tmp_path, "llama", LLAMA)).positions() is None
    assert load_model(_config(tmp_path, "gpt2", GPT2)).positions() == ("n_positions", 128)
